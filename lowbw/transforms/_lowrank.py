"""A low-rank codec: PowerSGD's rank-R factors, one power iteration per
message, warm-started from the previous message (Vogels, Karimireddy and
Jaggi, 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization", arXiv 1905.13727), the building block of DiLoCoX's
adaptive compression (arXiv 2506.21263).

A tensor of shape (n, ...) is a matrix M of n rows and m = prod(...)
columns. With Q (m x r) the previous message's right factor (a fixed random
matrix before the first), one power iteration gives

  P = orth(M Q)     (n x r, orthonormal columns: a QR decomposition)
  Q' = M^T P        (m x r)

and M is sent as (P, Q'), decoded as P Q'^T: r (n + m) values instead of
n m. Vectors and scalars are sent as they are, as PowerSGD does.
"""

import math

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw.transforms._codec import Codec, Payload, make_codec

_START = 0x10A7  # the seed of the first message's random right factor


def _matrix(shape) -> tuple[int, int] | None:
  """(n, m) of a tensor's matrix view, or None for a vector or scalar."""
  if len(shape) < 2:
    return None
  return shape[0], math.prod(shape[1:])


def low_rank(rank: int) -> Codec:
  """PowerSGD-style rank-``rank`` factors of every matrix (``lowrank:R``).

  Each worker factors its own tensor (with its error-feedback residual, when
  the strategy has ``error_feedback=``): one power iteration from the
  previous message's right factor (warm start; the message state keeps it),
  so repeated messages refine the same subspace. Each worker's factors are
  its own, so the payloads are all-gathered and every receiver decodes and
  averages (PowerSGD itself all-reduces P and Q with a shared Q in two
  phases; here the mean of W rank-r messages has rank up to W r).

  Bytes per tensor: 4 r (n + m) for an n x m matrix view (r = min(rank, n,
  m)); 4 n for an n-vector, sent as it is. A matrix with r (n + m) >= n m sends
  more than its float32 values (``lowbw train`` warns).

  Args:
    rank: R, at least 1.

  Example:
    >>> strategy = lowbw.strategies.diloco(codec="lowrank:4",
    ...                                    error_feedback=0.9)
  """
  rank = _validate.positive_int("rank", rank)

  def factors(shape):
    n, m = _matrix(shape)
    return min(rank, n, m), n, m

  def start(x):
    """The message 'before the first': a fixed random right factor."""
    if _matrix(x.shape) is None:
      return Payload({"dense": jnp.zeros(x.shape, jnp.float32)},
                     tuple(x.shape), jnp.dtype(x.dtype).name)
    r, n, m = factors(x.shape)
    q = jax.random.normal(jax.random.key(_START), (m, r), jnp.float32)
    return Payload({"p": jnp.zeros((n, r), jnp.float32), "q": q},
                   tuple(x.shape), jnp.dtype(x.dtype).name)

  def encode(x, key, worker, previous):
    del key, worker
    if _matrix(x.shape) is None:
      return {"dense": x.astype(jnp.float32)}
    r, n, m = factors(x.shape)
    matrix = x.reshape(n, m).astype(jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    p, _ = jnp.linalg.qr(jnp.matmul(matrix, previous.data["q"], precision=hi))
    return {"p": p, "q": jnp.matmul(matrix.T, p, precision=hi)}

  def decode(payload, key):
    del key
    data = payload.data
    if "dense" in data:
      return data["dense"].reshape(payload.shape)
    return jnp.matmul(data["p"], data["q"].T,
                      precision=jax.lax.Precision.HIGHEST).reshape(
                          payload.shape)

  return make_codec(f"lowrank:{rank}", encode, decode, summable=False,
                    carries_values=False, needs_key=False,
                    config={"codec": "low_rank", "rank": rank}, start=start)
