"""Casting codec: send values in a narrower floating-point type."""

import jax.numpy as jnp

from lowbw import _validate
from lowbw.transforms._codec import Codec, make_codec

DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
            "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
            "e5m2": "float8_e5m2"}


def cast(dtype: str = "bfloat16") -> Codec:
  """Rounds values to ``dtype`` (round to nearest even) and sends them as is.

  Payloads are plain numbers at the same positions on every worker, so they
  are all-reduced. ``float32`` is lossless for float32 tensors. float8_e4m3fn
  has no infinity: magnitudes that round beyond 448 (above 464) become NaN, so
  scale first (or use ``quantize``) for tensors that large; float8_e5m2
  reaches 57,344 (values that round beyond it become +-inf).

  Bytes per tensor of n entries: n x itemsize (2 for bf16/fp16, 1 for fp8).

  Args:
    dtype: "float32", "bfloat16" (bf16), "float16" (fp16),
      "float8_e4m3fn" (fp8, e4m3) or "float8_e5m2" (e5m2).
  """
  name = _ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
  name = _validate.one_of("dtype", name, DTYPES)
  target = jnp.dtype(name)

  def encode(x, key, worker):
    del key, worker
    return {"values": x.astype(target)}

  def decode(payload, key):
    del key
    return payload.data["values"]

  return make_codec(f"cast:{name}", encode, decode, summable=True,
                    carries_values=True, needs_key=False,
                    config={"codec": "cast", "dtype": name})
