"""quantize (linear, stochastic, statistical), sign and bit packing against
numpy references written here."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw.transforms import parse_codec, payload_nbytes, quantize, roundtrip, sign
from lowbw.transforms._quantize import pack, unpack

BITS = (1, 2, 4, 8)


def _chunks_np(flat, chunk):
  """The entries of each scale group, as a list of numpy arrays."""
  size = flat.size if chunk is None else chunk
  return [flat[i:i + size] for i in range(0, flat.size, size)]


# --- bit packing --------------------------------------------------------------


def _pack_np(codes, bits):
  per_byte = 8 // bits
  out = np.zeros(math.ceil(codes.size * bits / 8), np.int64)
  for i, c in enumerate(codes):
    out[i // per_byte] |= int(c) << (bits * (i % per_byte))
  return out


def test_pack_unpack_roundtrip_and_layout():
  rng = np.random.default_rng(0)
  cases = [(bits, rng.integers(0, 2**bits, n))
           for bits in BITS for n in (1, 3, 7, 8, 13, 33)]
  run = jax.jit(lambda cs: [(pack(c, b), unpack(pack(c, b), b, c.size))
                            for (b, _), c in zip(cases, cs)])
  results = run([jnp.asarray(c) for _, c in cases])
  for (bits, c), (packed, unpacked) in zip(cases, results):
    assert packed.dtype == np.uint8
    assert packed.shape == (math.ceil(c.size * bits / 8),)
    np.testing.assert_array_equal(packed, _pack_np(c, bits), err_msg=bits)
    np.testing.assert_array_equal(unpacked, c, err_msg=bits)


def test_pack_little_end_first():
  a, b, c = jax.jit(lambda a, b, c: (pack(a, 1), pack(b, 2), pack(c, 4)))(
      jnp.array([1, 0, 0, 0, 0, 0, 0, 1]), jnp.array([3, 1, 0, 2]),
      jnp.array([0xA, 0x5, 0xF]))
  np.testing.assert_array_equal(a, [0b10000001])
  np.testing.assert_array_equal(b, [0b10000111])
  np.testing.assert_array_equal(c, [0x5A, 0x0F])


# --- linear -------------------------------------------------------------------


def _all_linear(x, chunks):
  """Payloads and roundtrips of every (bits, chunk), compiled together."""
  out = []
  for bits in BITS:
    for chunk in chunks:
      codec = quantize(bits, chunk=chunk)
      payload = codec.encode(x)
      out.append((payload, codec.decode(payload)))
  return out


@pytest.mark.parametrize("shape,chunks", [((37,), (None, 5)),
                                          ((3, 4, 5), (16,))])
def test_linear_error_is_at_most_half_a_step(shape, chunks):
  rng = np.random.default_rng(0)
  x = (rng.normal(size=shape) * 3 + 1.5).astype(np.float32)
  results = jax.jit(_all_linear, static_argnums=1)(jnp.asarray(x), chunks)
  flat = x.reshape(-1)
  settings = [(b, c) for b in BITS for c in chunks]
  for (bits, chunk), (payload, out) in zip(settings, results):
    out = np.asarray(out)
    assert out.shape == shape and out.dtype == np.float32
    groups = _chunks_np(flat, chunk)
    np.testing.assert_array_equal(payload.data["min"],
                                  [g.min() for g in groups])
    np.testing.assert_array_equal(payload.data["max"],
                                  [g.max() for g in groups])
    assert payload.data["codes"].shape == (math.ceil(flat.size * bits / 8),)
    start = 0
    for g, got in zip(groups, _chunks_np(out.reshape(-1), chunk)):
      lo, hi = float(g.min()), float(g.max())
      step = (hi - lo) / (2**bits - 1)
      tol = 1e-6 * max(abs(lo), abs(hi))
      err = np.abs(got.astype(np.float64) - g)
      assert err.max() <= step / 2 + tol, (bits, chunk, start, err.max(), step)
      assert len(np.unique(got)) <= 2**bits
      start += g.size


def test_linear_extremes_decode_to_min_and_max():
  x = np.array([-3.0, 0.25, 7.0, 1.0, 2.5], np.float32)
  outs = jax.jit(lambda x: [roundtrip(quantize(b), x) for b in BITS])(x)
  for out in outs:  # lo + levels * ((hi - lo) / levels) is hi up to rounding
    np.testing.assert_allclose(np.asarray(out)[[0, 2]], [-3.0, 7.0], rtol=1e-6)


def test_linear_constant_tensors_decode_exactly():
  run = jax.jit(lambda x: [roundtrip(quantize(b, chunk=c), x)
                           for b in BITS for c in (None, 3)])
  for value in (0.1, -2.75, 0.0, 1e-30, 3e5):
    x = jnp.full((2, 6), value, jnp.float32)
    for out in run(x):
      np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
  # constant within each chunk of 3, different across chunks: chunk=3 keeps
  # them apart at every width; one group per tensor cannot at 1 bit
  x = jnp.asarray(np.repeat(np.array([1.5, -4.0, 0.3, 2.0], np.float32), 3)
                  .reshape(2, 6))
  outs = run(x)
  for bits, out in zip(BITS, outs[1::2]):
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x), err_msg=bits)
  assert not np.array_equal(np.asarray(outs[0]), np.asarray(x))


def test_linear_dtype_and_shapes_preserved():
  for shape in [(), (1,), (2, 3)]:
    for dtype in (jnp.float32, jnp.bfloat16):
      x = jax.ShapeDtypeStruct(shape, dtype)
      out = jax.eval_shape(lambda x: roundtrip(quantize(8), x), x)
      assert out.shape == shape and out.dtype == dtype


# --- stochastic ---------------------------------------------------------------


def test_stochastic_rounding_is_unbiased_and_within_one_step():
  bits, chunk, draws = 2, 6, 4000
  x = np.array([0.0, 0.1, 0.33, 0.5, 0.77, 0.99,
                -3.0, 0.62, 0.05, 0.45, -1.2], np.float32)
  # per-entry min and step of its chunk (two chunks: 6 and 5 entries)
  lo = np.repeat([x[:6].min(), x[6:].min()], [6, 5]).astype(np.float64)
  hi = np.repeat([x[:6].max(), x[6:].max()], [6, 5]).astype(np.float64)
  step = (hi - lo) / (2**bits - 1)
  codec = quantize(bits, stochastic=True, chunk=chunk)
  keys = jax.random.split(jax.random.key(0), draws)
  run = jax.jit(jax.vmap(lambda k: roundtrip(codec, jnp.asarray(x), k)))
  out = np.asarray(run(keys), np.float64)
  # every draw is the grid point just below or just above x
  below = lo + np.floor((x - lo) / step) * step
  above = np.minimum(below + step, hi)
  near = np.minimum(np.abs(out - below), np.abs(out - above))
  assert near.max() < 1e-6
  assert np.all(np.abs(out - x) <= step + 1e-6)
  # unbiased: the mean over draws converges to x (std <= step / 2 / sqrt(N))
  bound = 5 * step / 2 / math.sqrt(draws)
  assert np.all(np.abs(out.mean(axis=0) - x) <= bound), (out.mean(0) - x)
  # random: entries between grid points get both neighbours across keys ...
  frac = (x - lo) / step - np.floor((x - lo) / step)
  off_grid = (frac > 1e-3) & (frac < 1 - 1e-3)
  assert off_grid.sum() >= 6
  assert np.all(out[:, off_grid].std(axis=0) > 0)
  # ... and the same keys give the same draws
  np.testing.assert_array_equal(np.asarray(run(keys), np.float64), out)


# --- statistical --------------------------------------------------------------


STATISTICAL = ((1, None), (2, None), (4, 64), (2, 64))


@functools.cache
def _statistical_results():
  """Every case from one compiled program: (x, payload, codes, decoded)."""
  xs = []
  for bits, _ in STATISTICAL:
    x = np.random.default_rng(bits).normal(size=200).astype(np.float32) * 2 - 1
    x[3], x[150] = 60.0, -60.0  # beyond mean +- 3 sigma: edge bins
    xs.append(x)

  def run(xs):
    out = []
    for x, (bits, chunk) in zip(xs, STATISTICAL):
      codec = quantize(bits, "statistical", chunk=chunk)
      payload = codec.encode(x)
      out.append((payload, unpack(payload.data["codes"], bits, x.size),
                  codec.decode(payload)))
    return out

  return xs, jax.jit(run)([jnp.asarray(x) for x in xs])


@pytest.mark.parametrize("case", range(len(STATISTICAL)))
def test_statistical_codebook_is_the_mean_of_each_bin(case):
  bits, chunk = STATISTICAL[case]
  xs, results = _statistical_results()
  x, (payload, codes, out) = xs[case], results[case]
  codes, out = np.asarray(codes), np.asarray(out)
  levels = 2**bits
  codebook = np.asarray(payload.data["codebook"], np.float64)
  groups = _chunks_np(x.astype(np.float64), chunk)
  assert codebook.shape == (len(groups), levels)
  start = 0
  for c, g in enumerate(groups):
    got = codes[start:start + g.size]
    mean, std = g.mean(), g.std()
    lo, width = mean - 3 * std, 6 * std / levels
    scaled = (g - lo) / width
    expected = np.clip(np.floor(scaled), 0, levels - 1)
    # float32 vs float64 may disagree right at a bin edge, nowhere else
    on_edge = np.abs(scaled - np.round(scaled)) < 1e-4
    np.testing.assert_array_equal(got[~on_edge], expected[~on_edge])
    assert on_edge.sum() <= 1
    for b in range(levels):
      members = g[got == b]
      want = members.mean() if members.size else lo + (b + 0.5) * width
      np.testing.assert_allclose(codebook[c, b], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[start:start + g.size],
                                  codebook[c, got].astype(np.float32))
    start += g.size
  if chunk is None:  # the outliers went to the edge bins
    assert codes[3] == levels - 1 and codes[150] == 0


def test_statistical_constant_tensor():
  x = jnp.full((7,), 0.1, jnp.float32)
  out = jax.jit(lambda x: roundtrip(quantize(2, "statistical"), x))(x)
  np.testing.assert_allclose(np.asarray(out), np.asarray(x), rtol=1e-6)


# --- sign ---------------------------------------------------------------------


def test_sign_is_scaled_sign():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=shape).astype(np.float32)
        for shape in [(), (5,), (3, 7)]]
  xs[2][0, 1] = 0.0  # zero counts as +
  codec = sign()
  run = jax.jit(lambda xs: [(codec.encode(x), roundtrip(codec, x)) for x in xs])
  for x, (payload, out) in zip(xs, run([jnp.asarray(x) for x in xs])):
    n = x.size
    assert payload.data["codes"].shape == (math.ceil(n / 8),)
    assert payload.data["codes"].dtype == np.uint8
    np.testing.assert_allclose(payload.data["scale"], [np.abs(x).mean()],
                               rtol=1e-6)
    expected = np.abs(x).mean() * np.where(x >= 0, 1.0, -1.0)
    assert out.shape == x.shape
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


# --- errors -------------------------------------------------------------------


@pytest.mark.parametrize("bits", [0, 3, 16, -1, True, "4", None])
def test_bad_bits(bits):
  with pytest.raises(ValueError, match="bits"):
    quantize(bits)


@pytest.mark.parametrize("kwargs,field", [
    ({"scheme": "log"}, "scheme"), ({"scheme": None}, "scheme"),
    ({"chunk": 0}, "chunk"), ({"chunk": -4}, "chunk"),
    ({"chunk": 2.5}, "chunk"), ({"chunk": True}, "chunk"),
    ({"stochastic": "yes"}, "stochastic"), ({"stochastic": 1}, "stochastic"),
    ({"stochastic": True, "scheme": "statistical"}, "stochastic"),
])
def test_bad_options(kwargs, field):
  with pytest.raises(ValueError, match=field):
    quantize(4, **kwargs)


def test_stochastic_needs_a_key():
  codec = quantize(4, stochastic=True)
  with pytest.raises(ValueError, match="key"):
    codec.encode(jnp.ones(4))


@pytest.mark.parametrize("chunk", [None, 5])
def test_e3m0_rounds_to_the_nearest_of_its_sixteen_values(chunk):
  """Against a brute-force nearest value among 0 and +-scale*2**-k, k=0..6,
  per tensor or chunk (scale: the largest magnitude)."""
  from lowbw.transforms import e3m0
  x = np.random.default_rng(0).standard_normal(23).astype(np.float32)
  x[3], x[7] = 0.0, 1e-4
  codec = e3m0(chunk)
  got = np.asarray(roundtrip(codec, jnp.asarray(x)))
  size = chunk or x.size
  for start in range(0, x.size, size):
    part = x[start:start + size]
    scale = np.abs(part).max()
    grid = np.concatenate([[0.0], scale * 2.0 ** -np.arange(7)])
    grid = np.concatenate([-grid[1:], grid])
    want = grid[np.argmin(np.abs(part[:, None] - grid[None]), axis=1)]
    np.testing.assert_allclose(got[start:start + size], want, rtol=1e-6)
  chunks = -(-x.size // size)
  assert payload_nbytes(codec, jnp.asarray(x)) == -(-x.size // 2) + 4 * chunks
  assert parse_codec(codec.name).name == codec.name


def test_e3m0_bad_settings_are_one_line_errors():
  from lowbw.transforms import e3m0
  with pytest.raises(ValueError, match="^chunk=0 is invalid"):
    e3m0(0)
  with pytest.raises(ValueError, match="^codec='e3m0:fast' is invalid: stage "
                     "'e3m0:fast': unknown e3m0 option 'fast'"):
    parse_codec("e3m0:fast")
