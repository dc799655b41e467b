"""cast against ml_dtypes' numpy casts (round to nearest even)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowbw.transforms import cast, collective, roundtrip

NUMPY_TYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
               "float16": np.float16,
               "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
               "float8_e5m2": ml_dtypes.float8_e5m2}


def _sample():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 33)).astype(np.float32) * np.float32(3.0)
  x[0, :4] = [0.0, -0.0, 1e-3, 447.0]
  return x


def test_cast_matches_numpy_round_to_nearest():
  x = _sample()
  names = list(NUMPY_TYPES)
  run = jax.jit(lambda x: [(cast(n).encode(x), roundtrip(cast(n), x))
                           for n in names])
  for name, (payload, out) in zip(names, run(jnp.asarray(x))):
    target = NUMPY_TYPES[name]
    assert payload.data["values"].dtype == target
    assert out.dtype == np.float32 and out.shape == x.shape
    expected = x.astype(target).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(out), expected, err_msg=name)


def test_float32_is_lossless():
  x = _sample()
  x[1, :3] = [3e38, -1.17e-38, 1e-45]
  out = jax.jit(lambda x: roundtrip(cast("float32"), x))(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(out), x)


def test_bf16_input_keeps_its_dtype():
  x = jnp.asarray(_sample(), jnp.bfloat16)
  out = jax.jit(lambda x: roundtrip(cast("float8_e5m2"), x))(x)
  assert out.dtype == jnp.bfloat16
  expected = np.asarray(x).astype(ml_dtypes.float8_e5m2).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(out, np.float32), expected)


def test_fp8_range_as_documented():
  x = jnp.array([448.0, 460.0, 464.0, 465.0, 1000.0, -1000.0, 57344.0, 1e5])
  e4m3, e5m2 = jax.jit(lambda x: (roundtrip(cast("fp8"), x),
                                  roundtrip(cast("e5m2"), x)))(x)
  e4m3, e5m2 = np.asarray(e4m3), np.asarray(e5m2)
  # 464 is halfway between 448 and 480 and rounds to even (448)
  np.testing.assert_array_equal(e4m3[:3], [448.0, 448.0, 448.0])
  assert np.all(np.isnan(e4m3[3:]))  # no infinity in e4m3fn
  assert e5m2[6] == 57344.0 and e5m2[7] == np.inf


@pytest.mark.parametrize("alias,name", [
    ("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"),
    ("fp8", "float8_e4m3fn"), ("e4m3", "float8_e4m3fn"),
    ("e5m2", "float8_e5m2"), ("bfloat16", "bfloat16")])
def test_aliases(alias, name):
  codec = cast(alias)
  assert codec.name == f"cast:{name}"
  assert codec.config == {"codec": "cast", "dtype": name}
  assert codec.summable and codec.carries_values and not codec.needs_key
  assert collective(codec) == "ring_allreduce"
  assert cast().name == "cast:bfloat16"  # the default


@pytest.mark.parametrize("bad", ["int8", "float64", "FP16", "", 16, None,
                                 jnp.bfloat16])
def test_bad_dtype(bad):
  with pytest.raises(ValueError, match="dtype"):
    cast(bad)
