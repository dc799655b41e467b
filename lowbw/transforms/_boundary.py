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
from lowbw.transforms._codec import WORKER_AXIS, current_worker, roundtrip
from lowbw.transforms._codec_spec import UNCOMPRESSED, parse_codec


def _through(codec: Codec | None, x: Array, key: PRNGKey,
             worker) -> Array:
  return x if codec is None else roundtrip(codec, x, key, worker)


def boundary(x: Array, forward_codec: Codec | None,
             backward_codec: Codec | None, key: PRNGKey,
             worker=0, active=True) -> Array:
  """``x`` as the next stage receives it; its gradient as this stage does.

  Forward: ``roundtrip(forward_codec, x, fold_in(key, 0), worker)``;
  backward: ``roundtrip(backward_codec, g, fold_in(key, 1), worker)`` of
  the incoming gradient ``g``. A ``None`` codec sends that direction as it
  is (float32); with both None, ``x`` is returned untouched. ``active``
  (a boolean, traced or not): where False, both directions pass as they
  are (a worker that is no pipeline, in a mixed fleet).

  Example:
    >>> q8 = parse_codec("quant:8")
    >>> y = boundary(x, q8, q8, jax.random.key(0))  # doctest: +SKIP
  """
  if forward_codec is None and backward_codec is None:
    return x
  fkey, bkey = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)

  # The keys and the worker are arguments, not closed-over values, so that
  # jax may trace the backward rule under vmap; they get no cotangent.
  # Each direction selects its codec's round trip or the value as it is
  # inside the rule, so an inactive worker's gradient never meets the codec.
  @jax.custom_vjp
  def send(x, fkey, bkey, worker, on):
    return jnp.where(on, _through(forward_codec, x, fkey, worker), x)

  def send_fwd(x, fkey, bkey, worker, on):
    return send(x, fkey, bkey, worker, on), (bkey, worker, on)

  def send_bwd(saved, g):
    bkey, worker, on = saved
    out = jnp.where(on, _through(backward_codec, g, bkey, worker), g)
    return out, None, None, None, None

  send.defvjp(send_fwd, send_bwd)
  return send(x, fkey, bkey, jnp.asarray(worker, jnp.int32),
              jnp.asarray(active, bool))


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
                   worker: Callable[[], Array] | None = None,
                   active: Callable[[], Array] | None = None) -> Callable:
  """``boundary_fn(x, i, key)`` for :func:`lowbw.models.staged_loss`:
  boundary ``i`` through ``forward[i]`` and ``backward[i]`` (``None``: as
  it is). ``worker()``: the index stochastic codecs fold into their noise
  (default 0; the key, a worker's own loss key in a run, differs anyway).
  ``active()``: whether the codecs act (default: always); a mixed fleet's
  whole-model workers pass their activations as they are
  (:func:`pipeline_worker`).

  Example:
    >>> q8 = parse_codec("quant:8")
    >>> loss = staged_loss(split(model, 3), stage_boundary([q8] * 2, [q8] * 2))  # doctest: +SKIP
  """

  def fn(x, i, key):
    return boundary(x, forward[i], backward[i], key,
                    0 if worker is None else worker(),
                    True if active is None else active())

  return fn


def pipeline_worker(workers, num_workers: int) -> Callable[[], Array]:
  """``active()`` for :func:`stage_boundary` in a mixed fleet: whether the
  worker whose loss is being computed (its index on the workers' vmap
  axis, ``lowbw.transforms.per_worker``'s and a run's gradient axis) is
  one of ``workers``. Outside that axis (evaluating the global model) it
  is True: evaluation runs through the codecs, as a pipeline serves."""
  mask = np.zeros(num_workers, bool)
  mask[list(workers)] = True

  def active():
    try:
      jax.lax.axis_index(WORKER_AXIS)
    except NameError:
      return jnp.asarray(True)
    return jnp.asarray(mask)[current_worker()]

  return active


def parse_pipeline_workers(value, num_workers: int | None,
                           field: str = "pipeline_workers"
                           ) -> tuple[int, ...] | None:
  """The workers of a mixed fleet that are pipelines, sorted: a count N
  (an int, or its digits) is the first N workers; a list or tuple of
  indices, or text with a comma (``"0,2"``, ``"3,"``), those workers.
  ``None``: every worker. ``num_workers`` None checks the form only.
  Errors name ``field``."""
  if value is None:
    return None
  allowed = ("expected a count N of the first workers (1 to the "
             "workers) or worker indices, comma-separated ('0,2'; one "
             "index: '3,')")
  if isinstance(value, str):
    text = value.strip()
    if "," not in text:
      if not text.isdigit():
        raise _validate.fail(field, value, allowed)
      value = int(text)
    else:
      parts = [p.strip() for p in text.split(",") if p.strip()]
      if not parts or not all(p.isdigit() for p in parts):
        raise _validate.fail(field, value, allowed)
      value = [int(p) for p in parts]
  if isinstance(value, bool):
    raise _validate.fail(field, value, allowed)
  if isinstance(value, (int, np.integer)):
    if value < 1 or (num_workers is not None and value > num_workers):
      raise _validate.fail(field, value, f"expected a count from 1 to the "
                           f"{num_workers or 'number of'} workers")
    return None if num_workers is None else tuple(range(int(value)))
  if not isinstance(value, (list, tuple)) or not value or not all(
      isinstance(w, (int, np.integer)) and not isinstance(w, bool)
      for w in value):
    raise _validate.fail(field, value, allowed)
  if len(set(value)) != len(value):
    raise _validate.fail(field, value, "expected each worker once")
  bad = [w for w in value if w < 0 or (num_workers is not None and
                                       w >= num_workers)]
  if bad:
    raise _validate.fail(field, value, f"worker {bad[0]} is not one of the "
                         f"{num_workers} workers (0 to {num_workers - 1})"
                         if num_workers is not None else
                         f"worker {bad[0]}: expected indices >= 0")
  return None if num_workers is None else tuple(sorted(int(w) for w in value))
