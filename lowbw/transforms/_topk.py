"""Sparsifying codecs: top-k by magnitude and random-k from a shared key.

Both keep k = max(1, round(fraction * n)) entries of each n-entry tensor (the
same count SPARTA uses), so payload sizes are static.
"""

import math

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw._random import random_bijection
from lowbw.transforms._codec import Codec, make_codec
from lowbw.transforms._sparse import sparse_count


def index_dtype(size: int) -> jnp.dtype:
  """The smallest unsigned integer type holding every index of ``size``
  entries: uint8 up to 256 entries, uint16 up to 65,536, else uint32."""
  if size <= 1 << 8:
    return jnp.dtype(jnp.uint8)
  if size <= 1 << 16:
    return jnp.dtype(jnp.uint16)
  return jnp.dtype(jnp.uint32)


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


def top_k(fraction: float) -> Codec:
  """Keeps the k largest-magnitude entries of each tensor (values + indices).

  k = max(1, round(fraction * n)) per n-entry tensor. Indices are flat
  positions in the smallest unsigned type that fits n (uint8 for n <= 256,
  uint16 for n <= 65,536, else uint32). Workers keep different entries, so the
  payloads are all-gathered. Used with error feedback by MuLoCo (arXiv
  2505.23725) and CocktailSGD (Wang et al., 2023).

  Bytes per tensor: k x (value bytes + index bytes); float32 values with
  uint16 indices cost 6k bytes.

  Args:
    fraction: share of entries kept, in (0, 1]; 1 keeps everything (lossless).

  Example:
    >>> codec = top_k(0.1) | quantize(4)
  """
  fraction = _validate.fraction("fraction", fraction)

  def encode(x, key, worker):
    del key, worker
    flat = x.reshape(-1)
    k = sparse_count(flat.size, fraction)
    _, idx = jax.lax.top_k(jnp.abs(flat), k)
    return {"values": flat[idx], "indices": idx.astype(index_dtype(flat.size))}

  def decode(payload, key):
    del key
    size = math.prod(payload.shape)
    data = payload.data
    return scatter(data["indices"], data["values"], size).reshape(payload.shape)

  return make_codec(f"topk:{_spec_number(fraction)}", encode, decode,
                    summable=False, carries_values=True, needs_key=False,
                    config={"codec": "top_k", "fraction": fraction})


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
