"""DES-LOC: local Adam whose parameters and two moments are averaged on
periods of their own (Iacob et al., 2025, "DES-LOC: Desynced Low
Communication Adaptive Optimizers for Training Foundation Models", arXiv
2505.22549).

Every worker runs Adam on its own data. After steps Kx, 2Kx, ... the
workers' parameters are averaged; after steps Ku, 2Ku, ... their first
moments; after Kv, 2Kv, ... their second moments. There is no outer
optimizer. With Kx = Ku = Kv = K it is Local Adam (every state averaged
every K steps); the paper's point is that the moments change slowly, so
they can be averaged less often than the parameters.
"""

import math

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec
from lowbw.transforms import Compression, comm_channel, replace_with_mean

# Adam's moments are the fields of these names in optax's state
# (optax.ScaleByAdamState.mu and .nu), wherever the chain puts them.
MOMENTS = {"first_moment": "mu", "second_moment": "nu"}
CHANNELS = ("params", "first_moment", "second_moment")


def check_moments(inner: optax.GradientTransformation) -> None:
  """An error naming ``inner`` when its state keeps no Adam moments (the
  fields ``MOMENTS`` names) for DES-LOC to average."""
  state = inner.init({"x": jnp.zeros((2,))})
  if not all(_field_leaves(state, field) for field in MOMENTS.values()):
    raise _validate.fail("inner", "without Adam moments", "DES-LOC averages "
                         "the inner optimizer's first and second moments; "
                         "give an Adam-family optimizer (optax.adam, "
                         "optax.adamw, optax.contrib.adopt, or --inner "
                         "adopt / adam / adamw)")


def _field_leaves(tree, field: str) -> list:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return [x for path, x in leaves if _under(path, field)]


def _under(path, *fields: str) -> bool:
  return any(getattr(k, "name", None) in fields for k in path)


def _average_field(tree_W, fields, due):
  """``tree_W`` with the leaves under ``fields`` (a field name, or a tuple
  of names: every leaf under any of them) replaced by the workers' mean
  where ``due`` (a traced bool); one all-reduce of all of them."""
  fields = (fields,) if isinstance(fields, str) else tuple(fields)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree_W)
  picked = [i for i, (path, _) in enumerate(leaves) if _under(path, *fields)]
  values = [x for _, x in leaves]
  means = replace_with_mean([values[i] for i in picked])
  for i, mean in zip(picked, means):
    values[i] = jnp.where(due, mean, values[i])
  return jax.tree.unflatten(treedef, values)


def desloc_sync(periods: dict[str, int], moments: dict | None = None):
  """Averages every state whose period divides the step count: the
  parameters (``periods["params"]``) and, for each channel of ``moments``
  (channel -> the inner state's field, or tuple of fields, it averages;
  default ``MOMENTS``), the leaves under its fields. Reports one event per
  channel averaged."""
  moments = MOMENTS if moments is None else moments

  def sync(state):
    due = {name: state.step % k == 0 for name, k in periods.items()}
    mean = replace_with_mean(state.params_W)
    params_W = jax.tree.map(lambda m, x: jnp.where(due["params"], m, x),
                            mean, state.params_W)
    inner_W = state.inner_W
    for name, fields in moments.items():
      inner_W = _average_field(inner_W, fields, due[name])
    return (state._replace(params_W=params_W, inner_W=inner_W),
            _base.events(**{name: due[name]
                            for name in ("params", *moments)}))

  return sync


def desloc(
    inner: optax.GradientTransformation | None = None,
    Kx: int = 16,
    Ku: int | None = None,
    Kv: int | None = None,
) -> _base.Strategy:
  """DES-LOC: local Adam; parameters, first and second moments averaged
  every Kx, Ku and Kv steps.

  Defaults follow arXiv 2505.22549: the moment periods the paper
  recommends from its ablation, Ku = 3 Kx and Kv = 6 Kx (appendix B.3);
  Kx = 16, its high-frequency setting (256 is its low-frequency one);
  inner ADOPT (Taniguchi et al. 2024, arXiv 2411.02853), the paper's main
  optimizer, at lr 2.1e-3 with beta1 = 0.95, beta2 = 0.9999 (appendix A).
  ADOPT normalizes each gradient before its momentum, so a first moment
  averaged without the second stays bounded; with Adam (``--inner adam``)
  an averaged first moment divided by a worker's own near-zero second
  moment (a feature that worker has not seen) can blow up. The paper also
  clips each gradient coordinate to 1, which lowbw does not by default
  (pass ``inner=optax.chain(optax.clip(1.0), ...)``). With Kx = Ku = Kv = K
  it is Local Adam.

  Bytes per worker: each averaging is a ring all-reduce of one copy of the
  parameters (B; ρ(W)·B on the wire), so per step B (1/Kx + 1/Ku + 1/Kv)
  = 1.5 B / Kx at the recommended periods, half of Local Adam's 3 B / Kx.

  Args:
    inner: per-worker optimizer whose state holds Adam's moments (fields
      ``mu`` and ``nu``: optax.contrib.adopt, optax.adam, optax.adamw).
    Kx: steps between parameter averagings (>= 1).
    Ku: steps between first-moment averagings; None: 3 Kx.
    Kv: steps between second-moment averagings; None: 6 Kx.

  Example:
    >>> local_adam = lowbw.strategies.desloc(Kx=32, Ku=32, Kv=32)
  """
  inner = _base.optimizer("inner", inner, lambda: _optim.inner(
      _optim.DESLOC_INNER))
  check_moments(inner)
  Kx = _validate.positive_int("Kx", Kx)
  Ku = 3 * Kx if Ku is None else _validate.positive_int("Ku", Ku)
  Kv = 6 * Kx if Kv is None else _validate.positive_int("Kv", Kv)
  periods = {"params": Kx, "first_moment": Ku, "second_moment": Kv}
  plain = Compression(None, None)

  def init(params, num_workers_, key):
    return _base.inner_init(inner, params, num_workers_, key, ())

  def channels(params, num_workers_):
    return {name: comm_channel(plain, params, num_workers_)
            for name in CHANNELS}

  return _base.make(
      "desloc", math.gcd(Kx, Ku, Kv), _base.Parts(
          init, lambda s, g: (_base.inner_update(inner, s, g), {}),
          desloc_sync(periods), _base.mean_of_workers, channels),
      {"name": "desloc", "inner": _base.describe(inner), "Kx": Kx, "Ku": Ku,
       "Kv": Kv},
      inner=inner)


SPEC = _spec.spec(
    desloc, inner=_optim.DESLOC_INNER, outer=None,
    paper="Iacob et al. 2025, arXiv 2505.22549",
    help={"Kx": "steps between parameter averagings",
          "Ku": "steps between first-moment averagings (default 3 Kx)",
          "Kv": "steps between second-moment averagings (default 6 Kx)"})
