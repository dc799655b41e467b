"""The sum over a leading (worker) axis, in the fastest form for the backend.

XLA's CPU backend reduces over the leading axis of a (W, ...) array at under
1 GB/s (it walks the array with the reduced axis innermost), while the same
sum written as a contraction with a vector of ones runs as a GEMV at memory
bandwidth: 20-50x faster on the machines we measured (benchmarks/reductions.py,
docs/performance.md). Half-precision GEMVs on CPU are slow again, so 16-bit
leaves are first folded into float32 by eight (one fused elementwise pass)
and then contracted; up to eight rows (any dtype) are simply added in one
fused pass. Other backends keep XLA's own reduction, which is
already bandwidth-bound there (and where a default-precision dot could use
TF32).

Every form accumulates in at least float32 and returns that accumulator's
dtype; the callers cast back. The forms agree up to float rounding (the
order of the additions differs), which tests/test_reductions.py checks
against ``jnp.sum``.
"""

import contextlib

import jax
import jax.numpy as jnp

from lowbw._types import Array

_FOLD = 8   # 16-bit leaves: rows added pairwise in groups of this many first


def _acc_dtype(x: Array):
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x.dtype
  return jnp.promote_types(x.dtype, jnp.float32)


def _weighted(x: Array, weight_W: Array | None) -> Array:
  if weight_W is None:
    return x
  w = weight_W.reshape((-1,) + (1,) * (x.ndim - 1))
  return jnp.where(w, x, jnp.zeros((), x.dtype))


def native_sum(x: Array, weight_W: Array | None = None) -> Array:
  """XLA's reduction: ``jnp.sum(x, axis=0)`` (of the active rows)."""
  return jnp.sum(_weighted(x, weight_W), axis=0, dtype=_acc_dtype(x))


def dot_sum(x: Array, weight_W: Array | None = None) -> Array:
  """A contraction of axis 0 with a weight vector (ones, or the mask)."""
  acc = _acc_dtype(x)
  w = (jnp.ones((x.shape[0],), acc) if weight_W is None
       else weight_W.astype(acc))
  return jnp.tensordot(w, x.astype(acc), axes=1,
                       precision=jax.lax.Precision.HIGHEST)


def fold_dot_sum(x: Array, weight_W: Array | None = None) -> Array:
  """Rows added in float32 in one fused elementwise pass: all of them when
  W <= 8; else rows w, w + W/8, ..., leaving W/8 rows for ``dot_sum`` (W
  not divisible by 8 goes straight to ``dot_sum``)."""
  w_count = x.shape[0]
  if w_count > _FOLD and w_count % _FOLD:
    return dot_sum(x, weight_W)
  acc = _acc_dtype(x)
  fold = min(w_count, _FOLD)
  xs = _weighted(x, weight_W).reshape((fold, w_count // fold) + x.shape[1:])
  folded = xs[0].astype(acc)
  for i in range(1, fold):
    folded = folded + xs[i].astype(acc)
  return folded[0] if w_count <= _FOLD else dot_sum(folded)


FORMS = {"native": native_sum, "dot": dot_sum, "fold_dot": fold_dot_sum}

_FORCED: list[str] = []


@contextlib.contextmanager
def sum_form(name: str):
  """While tracing, every leading sum uses form ``name`` (one of ``FORMS``):
  for benchmarks and the equivalence tests."""
  if name not in FORMS:
    raise ValueError(f"sum_form: {name!r} is not one of {sorted(FORMS)}")
  _FORCED.append(name)
  try:
    yield
  finally:
    _FORCED.pop()


def chosen_form(x: Array, backend: str | None = None) -> str:
  """The form ``leading_sum`` uses for ``x`` on ``backend`` (default: JAX's
  default backend)."""
  if _FORCED:
    return _FORCED[-1]
  backend = backend or jax.default_backend()
  if backend != "cpu" or not jnp.issubdtype(x.dtype, jnp.floating):
    return "native"
  if jnp.finfo(x.dtype).bits < 32 or x.shape[0] <= _FOLD:
    return "fold_dot"
  return "dot"


def leading_sum(x: Array, weight_W: Array | None = None) -> Array:
  """The sum over axis 0 of ``x`` (of the rows where ``weight_W`` is set,
  bool (W,)), accumulated in float32 or wider: (W, ...) -> (...)."""
  if weight_W is not None:
    weight_W = weight_W.astype(bool)
  return FORMS[chosen_form(x)](x, weight_W)
