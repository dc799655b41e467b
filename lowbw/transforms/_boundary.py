"""Codecs at a pipeline's stage boundaries: the activations one stage sends
forward and the activation gradients the next sends back, each through its
own codec.

:func:`boundary` is a ``jax.custom_vjp`` identity with lossy ends: its
forward value is ``decode(encode(x))`` under the forward codec and the
gradient it passes back is ``decode(encode(g))`` under the backward codec,
so each direction carries exactly what its codec encodes (plain autodiff
would instead differentiate through the forward codec's rounding).
:func:`subspace` projects on a fixed orthonormal basis, a codec meant for
these boundaries; :func:`boundary_bytes` counts each direction's payload.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._types import Array, PRNGKey
from lowbw.transforms._codec import Codec, make_codec, payload_nbytes
from lowbw.transforms._codec import roundtrip
from lowbw.transforms._codec_spec import UNCOMPRESSED, parse_codec


def _through(codec: Codec | None, x: Array, key: PRNGKey,
             worker) -> Array:
  return x if codec is None else roundtrip(codec, x, key, worker)


def boundary(x: Array, forward_codec: Codec | None,
             backward_codec: Codec | None, key: PRNGKey,
             worker=0) -> Array:
  """``x`` as the next stage receives it; its gradient as this stage does.

  Forward: ``roundtrip(forward_codec, x, fold_in(key, 0), worker)``;
  backward: ``roundtrip(backward_codec, g, fold_in(key, 1), worker)`` of
  the incoming gradient ``g``. A ``None`` codec sends that direction as it
  is (float32); with both None, ``x`` is returned untouched.

  Example:
    >>> q8 = parse_codec("quant:8")
    >>> y = boundary(x, q8, q8, jax.random.key(0))  # doctest: +SKIP
  """
  if forward_codec is None and backward_codec is None:
    return x
  fkey, bkey = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)

  # The keys and the worker are arguments, not closed-over values, so that
  # jax may trace the backward rule under vmap; they get no cotangent.
  @jax.custom_vjp
  def send(x, fkey, bkey, worker):
    return _through(forward_codec, x, fkey, worker)

  def send_fwd(x, fkey, bkey, worker):
    return send(x, fkey, bkey, worker), (bkey, worker)

  def send_bwd(saved, g):
    bkey, worker = saved
    return _through(backward_codec, g, bkey, worker), None, None, None

  send.defvjp(send_fwd, send_bwd)
  return send(x, fkey, bkey, jnp.asarray(worker, jnp.int32))


def subspace(rank: int, seed: int = 0) -> Codec:
  """Projection on a fixed rank-``rank`` subspace of the last axis.

  The basis ``P`` (d x rank, orthonormal columns) is the Q factor of a
  Gaussian d x rank matrix drawn from ``seed``; every sender and receiver
  of a boundary knows it, so it costs no bytes. Sent: ``x @ P`` (the last
  axis shrunk from d to rank, float values that a chained codec may
  quantize: ``subspace:R,quant:8``); decoded: ``(x @ P) @ P.T``, the
  orthogonal projection ``P P^T x``. It is linear and symmetric, so the
  gradient of the projected forward is the projected gradient: the same
  codec backward is autodiff's exact gradient of the compressed forward.

  Bytes per tensor: ``prod(shape[:-1]) * rank * itemsize``.

  Args:
    rank: the subspace's dimension, 1 <= rank <= the last axis's size.
    seed: which basis (each pipeline boundary draws its own).
  """
  rank = _validate.positive_int("subspace rank", rank)
  if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
    raise _validate.fail("subspace seed", seed, "expected an integer >= 0")

  def basis(d: int, dtype) -> Array:
    if rank > d:
      raise _validate.fail("subspace rank", rank, f"expected at most the "
                           f"activations' last axis, {d}")
    gauss = np.random.default_rng(seed).standard_normal((d, rank))
    return jnp.asarray(np.linalg.qr(gauss)[0], dtype)

  def encode(x, key, worker):
    del key, worker
    return {"values": x @ basis(x.shape[-1], x.dtype)}

  def decode(payload, key):
    del key
    values = payload.data["values"]
    return values @ basis(payload.shape[-1], values.dtype).T

  return make_codec(f"subspace:{rank}", encode, decode, summable=True,
                    carries_values=True,
                    config={"name": "subspace", "rank": rank, "seed": seed})


def parse_boundary_codec(spec: str | None, field: str,
                         boundary_index: int = 0) -> Codec | None:
  """A stage boundary's codec from a spec: any ``--codec`` spec
  (``quant:8``, ``topk:0.1``, ``int8``, ``none``, ...), or one starting
  with ``subspace:R`` (``subspace:R,quant:8``), whose basis is drawn from
  the boundary's index; errors name ``field``."""
  if spec is None:
    return None
  if not isinstance(spec, str) or not spec.strip():
    raise _validate.fail(field, spec, "expected a codec spec such as "
                         "'quant:8' or 'subspace:16'")
  head, _, rest = spec.strip().partition(",")
  name, _, arg = head.partition(":")
  if name.strip().lower() != "subspace":
    later = [stage.partition(":")[0].strip().lower()
             for stage in rest.split(",")] if rest else []
    if "subspace" in later:
      raise _validate.fail(field, spec, "subspace:R must be the chain's "
                           "first stage")
    return parse_codec(spec, field)
  try:
    rank = int(arg)
  except ValueError:
    raise _validate.fail(field, spec, "expected subspace:R with R an "
                         "integer >= 1") from None
  if rank < 1:
    raise _validate.fail(field, spec, "expected subspace:R with R >= 1")
  codec = subspace(rank, seed=boundary_index)
  if not rest or rest.strip().lower() in UNCOMPRESSED:
    return codec
  return codec | parse_codec(rest, field)


def boundary_bytes(forward_codec: Codec | None,
                   backward_codec: Codec | None, shape: tuple[int, ...],
                   dtype="float32") -> tuple[int, int]:
  """Exact bytes one boundary sends per micro-batch: ``(forward,
  backward)``, the activation of ``shape`` and ``dtype`` through the
  forward codec and its gradient (same shape) through the backward codec
  (``None``: the values as they are).

  Example:
    >>> boundary_bytes(None, parse_codec("cast:bf16"), (4, 8, 16))
    (2048, 1024)
  """
  try:
    shape = tuple(int(n) for n in shape)
  except (TypeError, ValueError):
    raise _validate.fail("shape", shape, "expected a tuple of sizes") from None
  if any(n < 1 for n in shape):
    raise _validate.fail("shape", shape, "expected sizes >= 1")
  tensor = jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))
  return (payload_nbytes(forward_codec, tensor),
          payload_nbytes(backward_codec, tensor))


def stage_boundary(forward: list, backward: list,
                   worker: Callable[[], Array] | None = None) -> Callable:
  """``boundary_fn(x, i, key)`` for :func:`lowbw.models.staged_loss`:
  boundary ``i`` through ``forward[i]`` and ``backward[i]`` (``None``: as
  it is). ``worker()``: the index stochastic codecs fold into their noise
  (default 0; the key, a worker's own loss key in a run, differs anyway).

  Example:
    >>> q8 = parse_codec("quant:8")
    >>> loss = staged_loss(split(model, 3), stage_boundary([q8] * 2, [q8] * 2))  # doctest: +SKIP
  """

  def fn(x, i, key):
    return boundary(x, forward[i], backward[i], key,
                    0 if worker is None else worker())

  return fn
