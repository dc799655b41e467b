"""Keyed random bijections on ``[0, n)``, computed element by element.

Sampling without replacement usually means materialising a permutation of all n
items (``jax.random.permutation``: O(n log n) per call). A keyed bijection gives
``perm[i]`` for any i in O(1), so a worker can draw its b examples of an epoch,
or SPARTA can pick its k indices of a tensor, at a cost proportional to b or k.

The bijection is a 4-round Feistel network on the smallest even number of bits
that covers n, restricted to ``[0, n)`` by cycle-walking (re-applying the cipher
until the value falls inside the domain); the cipher's domain is less than 4n,
so the expected number of walks is below 4. The width follows n itself (traced
when n is), so a worker with a small shard next to one with a large shard does
not walk through the large shard's domain.
"""

import jax
import jax.numpy as jnp

from lowbw._types import Array, ArrayLike, PRNGKey

_ROUNDS = 4


def _half_bits(n: Array) -> Array:
  """Half the cipher width: ceil(max(2, bit_length(n - 1)) / 2), traced."""
  bit_length = 32 - jax.lax.clz(jnp.maximum(n, 2) - 1)
  return (bit_length + 1) // 2


def _mix(x: Array) -> Array:
  """An integer hash (the 'lowbias32' finaliser) on uint32."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def random_bijection(
    key: PRNGKey, index: ArrayLike, n: ArrayLike, max_n: int
) -> Array:
  """Maps ``index`` (any shape, values in ``[0, n)``) through a random bijection.

  Args:
    key: a PRNG key; the same key gives the same bijection.
    index: int array of positions, each in ``[0, n)``.
    n: size of the domain; may be a traced value (e.g. per-worker shard sizes).
    max_n: a static upper bound on ``n`` (checked; values up to 2**31 - 1).

  Returns:
    An int32 array shaped like ``index``: the images of ``index``, all in
    ``[0, n)``, distinct for distinct indices.
  """
  if max_n < 1 or max_n > 2**31 - 1:
    raise ValueError(f"max_n={max_n} must be in [1, 2**31 - 1]")
  n = jnp.asarray(n, jnp.uint32)
  half = _half_bits(n)
  mask = (jnp.uint32(1) << half) - 1
  round_keys = jax.random.bits(key, (_ROUNDS,), jnp.uint32)

  def cipher(x):
    left, right = x >> half, x & mask
    for r in range(_ROUNDS):
      left, right = right, left ^ (_mix(right ^ round_keys[r]) & mask)
    return (left << half) | right

  # Cycle-walking as a do-while: the first pass enciphers every index, the
  # later ones those still outside [0, n). The cipher is traced once (it is
  # most of the sampler's program: tracing, lowering and compiling it once
  # rather than twice).
  def walk(carry):
    x, first = carry
    return jnp.where(first | (x >= n), cipher(x), x), jnp.bool_(False)

  x, _ = jax.lax.while_loop(lambda c: c[1] | jnp.any(c[0] >= n), walk,
                            (jnp.asarray(index, jnp.uint32), jnp.bool_(True)))
  return x.astype(jnp.int32)
