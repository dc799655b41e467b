"""Low-precision worker state: the workers' parameters and inner optimizer
states are stored in a narrow type (e.g. bfloat16) between steps, and every
step and sync computes in float32 (widened on entry, rounded back on exit).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowbw.strategies import StrategyState


def cast_workers(st: StrategyState, dtype) -> StrategyState:
  """Every worker's parameters and inner optimizer state as ``dtype``.

  Only tensors are cast (leaves with a dimension besides the worker axis):
  per-worker scalars such as step counts and learning rates keep their type.
  """
  def one(x):
    if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating):
      return x.astype(dtype)
    return x
  return st._replace(params_W=jax.tree.map(one, st.params_W),
                     inner_W=jax.tree.map(one, st.inner_W))


class Precision(NamedTuple):
  """How worker state is stored: ``dtype`` None keeps float32 throughout."""

  dtype: Any = None

  def widen(self, st: StrategyState) -> StrategyState:
    """The stored state as float32, for computing."""
    return st if self.dtype is None else cast_workers(st, jnp.float32)

  def narrow(self, st: StrategyState) -> StrategyState:
    """A computed state rounded to the stored type."""
    return st if self.dtype is None else cast_workers(st, self.dtype)
