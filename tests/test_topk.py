"""top_k and random_k against numpy references: which entries are kept, where
they land, and the index dtype."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw.transforms import index_dtype, random_k, roundtrip, top_k


def _expected_k(n, fraction):
  return min(n, max(1, round(fraction * n)))


def _distinct(shape, seed):
  """Entries with distinct magnitudes (no ties for top-k) and mixed signs."""
  rng = np.random.default_rng(seed)
  n = math.prod(shape)
  mags = rng.permutation(n).astype(np.float32) + 1.0
  signs = rng.choice(np.array([-1.0, 1.0], np.float32), n)
  return (mags * signs * 0.01).reshape(shape)


TOP_K_CASES = [((), 0.1), ((1,), 0.5), ((5,), 0.01), ((5,), 0.5), ((17,), 0.1),
               ((4, 5, 3), 0.1), ((4, 5, 3), 1.0), ((300,), 0.01),
               ((300,), 0.5)]
RANDOM_K_CASES = [((), 0.5), ((9,), 0.1), ((9,), 1.0), ((20, 30), 0.1),
                  ((20, 30), 0.5)]


@functools.cache
def _run_cases(factory, cases):
  """Inputs, payloads and decodes of every case, from one compiled program
  (compiling each case on its own would dominate the test time)."""
  xs = [_distinct(shape, seed=i) for i, (shape, _) in enumerate(cases)]

  def run(xs, key):
    out = []
    for x, (_, fraction) in zip(xs, cases):
      codec = factory(fraction)
      payload = codec.encode(x, key)
      out.append((payload, codec.decode(payload, key)))
    return out

  return xs, jax.jit(run)([jnp.asarray(x) for x in xs], jax.random.key(11))


@pytest.mark.parametrize("case", range(len(TOP_K_CASES)))
def test_top_k_keeps_the_k_largest_magnitudes(case):
  shape, fraction = TOP_K_CASES[case]
  xs, results = _run_cases(top_k, tuple(TOP_K_CASES))
  x, (payload, out) = xs[case], results[case]
  n = x.size
  k = _expected_k(n, fraction)
  idx = np.asarray(payload.data["indices"]).astype(np.int64)
  values = np.asarray(payload.data["values"])
  assert idx.shape == (k,) and values.shape == (k,)
  flat = x.reshape(-1)
  expected = np.argsort(-np.abs(flat))[:k]
  assert set(idx.tolist()) == set(expected.tolist())
  np.testing.assert_array_equal(values, flat[idx])

  dense = np.zeros(n, np.float32)
  dense[expected] = flat[expected]
  assert out.shape == x.shape and out.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out), dense.reshape(shape))


def test_k_uses_round_then_at_least_one_and_at_most_n():
  # round(0.25 * 10) = 2 (banker's rounding of 2.5), 0.001 * 10 -> 1, 1.0 -> n.
  for n, fraction, k in [(10, 0.25, 2), (10, 0.35, 4), (10, 0.001, 1),
                         (10, 1.0, 10), (3, 0.5, 2), (1, 0.01, 1)]:
    assert k == _expected_k(n, fraction)
    for codec in (top_k(fraction), random_k(fraction)):
      payload = jax.eval_shape(codec.encode,
                               jax.ShapeDtypeStruct((n,), jnp.float32),
                               jax.random.key(0))
      assert payload.data["values"].shape == (k,)


def test_index_dtype_boundaries():
  assert index_dtype(1) == np.uint8
  assert index_dtype(256) == np.uint8
  assert index_dtype(257) == np.uint16
  assert index_dtype(65536) == np.uint16
  assert index_dtype(65537) == np.uint32
  # the payload really uses them; indices up to n - 1 survive the narrow type
  for n, dtype in [(256, np.uint8), (257, np.uint16), (65536, np.uint16),
                   (65537, np.uint32)]:
    shape = jax.eval_shape(top_k(0.01).encode,
                           jax.ShapeDtypeStruct((n,), jnp.float32))
    assert shape.data["indices"].dtype == dtype
  x = np.zeros(257, np.float32)
  x[256] = 5.0
  payload = top_k(1 / 257).encode(jnp.asarray(x))
  assert int(payload.data["indices"][0]) == 256
  np.testing.assert_array_equal(np.asarray(top_k(1 / 257).decode(payload)), x)


def test_top_k_one_is_lossless():
  x = np.random.default_rng(3).normal(size=(6, 7)).astype(np.float32)
  x[0, :2] = 0.0  # zeros and ties do not matter when all are kept
  xs = [jnp.asarray(x, dtype) for dtype in (jnp.float32, jnp.bfloat16)]
  for x, out in zip(xs, jax.jit(
      lambda xs: [roundtrip(top_k(1.0), x) for x in xs])(xs)):
    assert out.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(x, np.float32))


@pytest.mark.parametrize("case", range(len(RANDOM_K_CASES)))
def test_random_k_keeps_k_entries_in_place(case):
  shape, fraction = RANDOM_K_CASES[case]
  xs, results = _run_cases(random_k, tuple(RANDOM_K_CASES))
  x, (payload, out) = xs[case], results[case]  # x has no zeros
  k = _expected_k(x.size, fraction)
  assert set(payload.data) == {"values"}  # positions come from the key
  assert payload.data["values"].shape == (k,)
  assert out.shape == shape
  out = np.asarray(out).reshape(-1)
  kept = np.flatnonzero(out)
  assert kept.size == k
  np.testing.assert_array_equal(out[kept], x.reshape(-1)[kept])
  # the payload holds exactly the kept values
  assert sorted(np.asarray(payload.data["values"]).tolist()) == sorted(
      x.reshape(-1)[kept].tolist())


def test_random_k_positions_follow_the_key():
  x = jnp.asarray(_distinct((200,), seed=1))
  codec = random_k(0.1)

  run = jax.jit(lambda key: roundtrip(codec, x, key))

  def kept(key):
    return set(np.flatnonzero(np.asarray(run(key))).tolist())

  assert kept(jax.random.key(0)) == kept(jax.random.key(0))
  assert kept(jax.random.key(0)) != kept(jax.random.key(1))


def test_random_k_positions_are_uniform():
  n, k, draws = 20, 5, 2000
  codec = random_k(k / n)
  x = jnp.arange(1.0, n + 1.0)
  keys = jax.random.split(jax.random.key(5), draws)
  out = jax.jit(jax.vmap(lambda key: codec.decode(codec.encode(x, key), key)))(
      keys)
  counts = np.sum(np.asarray(out) != 0, axis=0)
  assert counts.sum() == draws * k
  expected = draws * k / n
  sigma = math.sqrt(draws * (k / n) * (1 - k / n))
  assert np.all(np.abs(counts - expected) < 5 * sigma), counts


def test_random_k_needs_a_key():
  codec = random_k(0.5)
  with pytest.raises(ValueError, match="key"):
    codec.encode(jnp.ones(4))
  payload = jax.eval_shape(codec.encode, jnp.ones(4), jax.random.key(0))
  with pytest.raises(ValueError, match="key"):
    codec.decode(payload)


@pytest.mark.parametrize("factory", [top_k, random_k])
@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, True, "0.1", None,
                                 float("nan")])
def test_bad_fraction(factory, bad):
  with pytest.raises(ValueError, match="fraction"):
    factory(bad)
