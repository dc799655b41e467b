"""Sparsifying codecs: top-k by magnitude and random-k from a shared key.

Both keep k = max(1, round(fraction * n)) entries of each n-entry tensor (the
same count SPARTA uses), so payload sizes are static.

A build with a traced density (``lowbw.build(config, traced=("density",))``)
compiles top-k with the largest fraction of its runs and keeps, while a
message is traced, a run's own counts (``keeping``): the entries ranked past
a run's k are sent as zeros, so every receiver decodes what top-k at the
run's fraction sends.
"""

import contextlib
import math
import threading

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw._random import random_bijection
from lowbw.transforms import _chunk
from lowbw.transforms._codec import Codec, make_codec
from lowbw.transforms._sparse import sparse_count

_TRACE = threading.local()


def _spec_number(value: float) -> str:
  """``value`` as short as it can be written and still parse back exactly,
  so that ``parse_codec(codec.name)`` rebuilds the same codec (``:g`` alone
  would turn 1/3 into 0.333333)."""
  short = f"{value:g}"
  return short if float(short) == value else repr(value)


def scatter(indices, values, size: int):
  """A dense flat vector of ``size`` entries, ``values`` at ``indices``."""
  dense = jnp.zeros((size,), values.dtype)
  return dense.at[indices.astype(jnp.int32)].set(values)


def top_k(fraction: float, chunk: int | None = None,
          block: int | None = None) -> Codec:
  """Keeps the k largest-magnitude entries of each tensor, or of each chunk
  of it (values + indices).

  k = max(1, round(fraction * n)) per n-entry tensor or chunk. A whole
  tensor's indices are flat positions in the smallest unsigned type that
  fits n (uint8 for n <= 256, uint16 for n <= 65,536, else uint32); a
  chunk's are positions inside the chunk, bit-packed at ceil(log2(chunk
  size)) bits each (12 bits in a 64 x 64 block, as SparseLoCo's authors
  pack them). Workers keep different entries, so the payloads are
  all-gathered. Used with error
  feedback by MuLoCo (arXiv 2505.23725) and CocktailSGD (Wang et al.,
  2023); chunk-wise, by SparseLoCo (arXiv 2508.15706), where chunk-local
  indices cost fewer bits and every part of a tensor keeps its share.

  Bytes per tensor: k x (value bytes + index bytes) whole (float32 values
  with uint16 indices: 6k), or chunks x k x value bytes + ceil(chunks x k x
  index bits / 8) chunk-wise.

  Args:
    fraction: share of entries kept, in (0, 1]; 1 keeps everything (lossless).
    chunk: cut the flattened tensor into chunks of this many entries (the
      last one padded) and keep k of each; None: the whole tensor.
    block: instead, cut the tensor (as a matrix: leading axes by the last)
      into blocks of at most block x block entries, DeMo's layout; None: not.

  Example:
    >>> codec = top_k(0.1) | quantize(4)
    >>> sparseloco = top_k(32 / 4096, chunk=4096) | quantize(2)
  """
  fraction = _validate.fraction("fraction", fraction)
  if chunk is not None and block is not None:
    raise _validate.fail("block", block, "give chunk= (flat chunks) or "
                         "block= (2-D blocks), not both")
  chunker = (_chunk.blocks(block, "block") if block is not None
             else _chunk.flat(chunk))

  def encode(x, key, worker):
    del key, worker
    values, _ = chunker.split(x)
    k = sparse_count(values.shape[1], fraction) if x.size else 0  # empty
    _, idx = jax.lax.top_k(jnp.abs(values), k)
    kept = _within_count(jnp.take_along_axis(values, idx, axis=1),
                         values.shape[1]).reshape(-1)
    if chunker.kind == "whole":
      return {"values": kept, "indices": idx.reshape(-1).astype(
          chunker.index_dtype(x.shape))}
    return {"values": kept, "indices": _chunk.pack_bits(
        idx, chunker.index_bits(x.shape))}

  def decode(payload, key):
    del key
    count, size = chunker.layout(payload.shape)
    values = payload.data["values"]
    idx = payload.data["indices"]
    idx = (idx.astype(jnp.int32) if chunker.kind == "whole" else
           _chunk.unpack_bits(idx, chunker.index_bits(payload.shape),
                              values.size))
    dense = jnp.zeros((count, size), values.dtype)
    dense = dense.at[jnp.arange(count)[:, None], idx.reshape(count, -1)].set(
        values.reshape(count, -1))
    return chunker.merge(dense, payload.shape)

  layout = {"whole": "", "flat": f":chunk={chunker.size}",
            "blocks": f":block={chunker.size}"}[chunker.kind]
  return make_codec(f"topk:{_spec_number(fraction)}{layout}", encode, decode,
                    summable=False, carries_values=True, needs_key=False,
                    config={"codec": "top_k", "fraction": fraction,
                            **({"chunks": chunker.spec}
                               if chunker.kind != "whole" else {})})


@contextlib.contextmanager
def keeping(counts: dict | None):
  """While tracing a message, how many entries top-k keeps of an n-entry
  tensor or chunk: ``counts[str(n)]``, a traced int32 (``keep_counts``; a
  build with a traced density); None: its own fraction's. ``lax.top_k``
  returns its entries sorted by magnitude (ties: the lower position first),
  so the first k of a larger k are those top-k keeps at k."""
  stack = _TRACE.__dict__.setdefault("keep", [])
  stack.append(counts)
  try:
    yield
  finally:
    stack.pop()


def _within_count(kept, n: int):
  """``kept`` (chunks, k) with the entries ranked at or past the traced
  count of ``n`` (``keeping``) set to zero; as it is without one."""
  stack = getattr(_TRACE, "keep", None)
  counts = stack[-1] if stack else None
  if counts is None or kept.size == 0:
    return kept
  if str(n) not in counts:
    raise ValueError(f"top-k of a {n}-entry tensor or chunk under a traced "
                     f"density whose counts are for sizes {sorted(counts)}")
  rank = jnp.arange(kept.shape[1], dtype=jnp.int32)
  return jnp.where(rank < counts[str(n)], kept, jnp.zeros((), kept.dtype))


def chunker_of(codec: Codec | None):
  """The layout (``_chunk.Chunker``) of a top-k codec alone; None for any
  other codec, a chain included."""
  config = {} if codec is None else codec.config
  if config.get("codec") != "top_k":
    return None
  kind, _, size = config.get("chunks", "whole").partition(":")
  return _chunk.Chunker(kind, int(size) if size else None)


def with_fraction(codec: Codec, fraction: float) -> Codec:
  """The top-k codec ``codec`` with another fraction, its layout kept."""
  chunker = chunker_of(codec)
  return top_k(fraction, chunk=chunker.size if chunker.kind == "flat"
               else None,
               block=chunker.size if chunker.kind == "blocks" else None)


def keep_counts(codec: Codec, shapes, fraction: float) -> dict:
  """``{str(n): int32 k}`` for the chunk (or tensor) size n of each shape
  in ``shapes`` under top-k ``codec``'s layout, k as top-k at ``fraction``
  counts it (``sparse_count``, on the host)."""
  chunker = chunker_of(codec)
  return counts_at({chunker.layout(shape)[1] for shape in shapes
                    if math.prod(shape)}, fraction)


def counts_at(sizes, fraction: float) -> dict:
  """``{str(n): int32 k}``: k of each n-entry tensor or chunk in ``sizes``
  as top-k at ``fraction`` counts it (``sparse_count``, on the host)."""
  return {str(n): jnp.asarray(sparse_count(int(n), fraction), jnp.int32)
          for n in sorted(sizes, key=int)}


def random_k(fraction: float) -> Codec:
  """Keeps k entries drawn from a key shared by all workers (values only).

  Every worker keeps the same positions, so no indices are sent and the
  payloads can be summed (all-reduce). The entries are not rescaled (the
  variant MuLoCo's appendix compares against, arXiv 2505.23725).

  Bytes per tensor: k x value bytes.

  Args:
    fraction: share of entries kept, in (0, 1].
  """
  fraction = _validate.fraction("fraction", fraction)

  def positions(key, size):
    if size == 0:  # an empty leaf: nothing to pick (the bijection needs n >= 1)
      return jnp.zeros((0,), jnp.int32)
    k = sparse_count(size, fraction)
    return random_bijection(key, jnp.arange(k, dtype=jnp.int32), size, size)

  def encode(x, key, worker):
    del worker
    flat = x.reshape(-1)
    return {"values": flat[positions(key, flat.size)]}

  def decode(payload, key):
    size = math.prod(payload.shape)
    return scatter(positions(key, size), payload.data["values"],
                   size).reshape(payload.shape)

  return make_codec(f"randk:{_spec_number(fraction)}", encode, decode,
                    summable=True, carries_values=True, needs_key=True,
                    config={"codec": "random_k", "fraction": fraction})
