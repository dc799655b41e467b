"""Quantizing codecs: linear (min-max) and statistical quantization, and sign.

Codes of ``bits`` bits are bit-packed, 8 / bits codes per byte (four 2-bit
codes per byte), little end first: code j of a byte sits at bits
[j * bits, (j + 1) * bits). A tensor of n entries costs ceil(n * bits / 8)
bytes of codes plus its scales or codebooks.

A build with a traced bit width (``lowbw.build(config, traced=("bits",))``)
compiles the linear quantizer with the largest width of its runs and reads,
while a message is traced, a run's own level count (``leveling``): codes of
a narrower width fit the wider packing, so every receiver decodes what the
run's own width sends.
"""

import contextlib
import math
import threading

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._types import Array
from lowbw.transforms._chunk import flat as flat_chunks
from lowbw.transforms._codec import Codec, make_codec, worker_key

BITS = (1, 2, 4, 8)
SCHEMES = ("linear", "statistical")
# Where the statistical scheme's bins fall: lowbw's equal bins over mean
# +- 3 sigma, or the MuLoCo authors' rounding grid.
GRIDS = ("lowbw", "muloco")


def pack(codes: Array, bits: int) -> Array:
  """Packs integer codes in [0, 2**bits) into uint8, 8 // bits per byte."""
  per_byte = 8 // bits
  codes = codes.reshape(-1).astype(jnp.uint8)
  pad = -codes.size % per_byte
  codes = jnp.pad(codes, (0, pad)).reshape(-1, per_byte)
  shifts = (jnp.arange(per_byte, dtype=jnp.uint8) * bits).astype(jnp.uint8)
  packed = jnp.bitwise_or.reduce(codes << shifts[None, :], axis=1)
  return packed.astype(jnp.uint8)


def unpack(packed: Array, bits: int, size: int) -> Array:
  """The first ``size`` codes of ``pack``'s output, as int32."""
  per_byte = 8 // bits
  shifts = (jnp.arange(per_byte, dtype=jnp.uint8) * bits).astype(jnp.uint8)
  mask = jnp.uint8((1 << bits) - 1)
  codes = (packed[:, None] >> shifts[None, :]) & mask
  return codes.reshape(-1)[:size].astype(jnp.int32)


_TRACE = threading.local()


def level_numbers(bits: int) -> dict:
  """The linear quantizer's numbers at ``bits``: ``count``, its 2**bits - 1
  steps, and ``inverse``, 1 / count rounded once to float32 on the host.

  A step is (max - min) x inverse, at a fixed width (constants) and a
  traced one (``leveling``) alike. XLA compiles a division by a scalar
  into a product with its reciprocal (on the CPU for a constant and a
  traced divisor alike: a quantizer written with a division computed these
  bits already), but whether it does is the compiler's choice, per
  backend and divisor; written out, the product keeps the two equal
  anywhere."""
  count = np.float32((1 << bits) - 1)
  return {"count": count, "inverse": np.float32(1) / count}


@contextlib.contextmanager
def leveling(numbers: dict | None):
  """While tracing a message, the linear quantizer's ``level_numbers``:
  traced float32 scalars (a build with a traced bit width, whose codes are
  packed at the build's width); None: its own width's."""
  stack = _TRACE.__dict__.setdefault("levels", [])
  stack.append(numbers)
  try:
    yield
  finally:
    stack.pop()


def _levels(bits: int) -> dict:
  """The level numbers in force: a traced width's (``leveling``), else
  ``bits``'."""
  stack = getattr(_TRACE, "levels", None)
  numbers = stack[-1] if stack else None
  return level_numbers(bits) if numbers is None else numbers


def _linear_step(lo, hi, bits):
  return (hi - lo) * _levels(bits)["inverse"]


def _linear_encode(values, valid, bits, noise):
  lo = jnp.min(jnp.where(valid, values, jnp.inf), axis=1, keepdims=True)
  hi = jnp.max(jnp.where(valid, values, -jnp.inf), axis=1, keepdims=True)
  step = _linear_step(lo, hi, bits)
  scaled = jnp.where(step > 0, (values - lo) / jnp.where(step > 0, step, 1), 0)
  codes = jnp.floor(scaled + noise) if noise is not None else jnp.round(scaled)
  return jnp.clip(codes, 0, _levels(bits)["count"]), lo[:, 0], hi[:, 0]


def _linear_decode(codes, lo, hi, bits):
  return lo[:, None] + codes * _linear_step(lo, hi, bits)[:, None]


def _statistical_encode(values, valid, bits, sigmas=3.0):
  levels = 1 << bits
  count = jnp.sum(valid, axis=1, keepdims=True)
  mean = jnp.sum(jnp.where(valid, values, 0), axis=1, keepdims=True) / count
  var = jnp.sum(jnp.where(valid, (values - mean) ** 2, 0), axis=1,
                keepdims=True) / count
  lo = mean - sigmas * jnp.sqrt(var)
  width = 2 * sigmas * jnp.sqrt(var) / levels
  scaled = jnp.where(width > 0, (values - lo) / jnp.where(width > 0, width, 1),
                     0)
  codes = jnp.clip(jnp.floor(scaled), 0, levels - 1).astype(jnp.int32)
  centres = lo + (jnp.arange(levels) + 0.5)[None, :] * width
  return codes, _bin_means(values, valid, codes, levels, centres)


def _bin_means(values, valid, codes, levels, empty):
  """(groups, levels): the mean of each group's valid ``values`` with each
  code, ``empty`` where a code has none."""
  rows = jnp.broadcast_to(jnp.arange(values.shape[0])[:, None], codes.shape)
  bins = jnp.zeros((values.shape[0], levels), values.dtype)
  sums = bins.at[rows, codes].add(jnp.where(valid, values, 0))
  members = bins.at[rows, codes].add(valid.astype(values.dtype))
  return jnp.where(members > 0, sums / jnp.maximum(members, 1), empty)


def _muloco_encode(values, valid, bits):
  """The MuLoCo authors' statistical quantizer (facebookresearch/MuLoCo,
  torchtitan/quantization.py, range 6 sigma): codes round((x - mean) /
  (6 sigma / 2**bits) + 2**(bits-1)), clamped, with sigma the unbiased
  standard deviation (a step of 1 when it is 0 or not finite); each code
  decodes to the mean of its bin's centred entries (0 if empty) plus the
  mean, sent as ``shift``."""
  levels = 1 << bits
  count = jnp.sum(valid, axis=1, keepdims=True)
  mean = jnp.sum(jnp.where(valid, values, 0), axis=1, keepdims=True) / count
  centred = jnp.where(valid, values - mean, 0)
  std = jnp.sqrt(jnp.sum(centred ** 2, axis=1, keepdims=True) /
                 jnp.maximum(count - 1, 1))
  step = jnp.where(count > 1, 6 * std / levels, 0)
  step = jnp.where((step > 0) & jnp.isfinite(step), step, 1.0)
  codes = jnp.clip(jnp.round(centred / step + levels // 2), 0,
                   levels - 1).astype(jnp.int32)
  return codes, mean[:, 0], _bin_means(centred, valid, codes, levels, 0.0)


def _checked(bits, scheme, stochastic, grid, sigmas) -> tuple:
  """``quantize``'s arguments, validated field by field."""
  if not isinstance(bits, (int, np.integer)) or isinstance(bits, bool) or (
      bits not in BITS):
    raise _validate.fail("bits", bits, "expected one of 1, 2, 4, 8")
  scheme = _validate.one_of("scheme", scheme, SCHEMES)
  _validate.boolean("stochastic", stochastic)
  grid = _validate.one_of("grid", grid, GRIDS)
  if grid != "lowbw" and scheme != "statistical":
    raise _validate.fail("grid", grid, "a grid is a choice of the "
                         "statistical scheme; give scheme='statistical'")
  if stochastic and scheme != "linear":
    raise _validate.fail("stochastic", stochastic,
                         "stochastic rounding is only defined for "
                         "scheme='linear'")
  sigmas = _validate.positive_float("sigmas", sigmas)
  if sigmas != 3.0 and (scheme, grid) != ("statistical", "lowbw"):
    raise _validate.fail("sigmas", sigmas, "sets the width of lowbw's "
                         "statistical bins; give scheme='statistical' "
                         "without a grid")
  return int(bits), scheme, stochastic, grid, sigmas


def quantize(bits: int, scheme: str = "linear", stochastic: bool = False,
             chunk: int | None = None, grid: str = "lowbw",
             sigmas: float = 3.0) -> Codec:
  """Quantizes each tensor (or each ``chunk`` of its flattened entries) to
  ``bits``-bit codes.

  * ``linear``: 2**bits evenly spaced levels from the minimum to the maximum;
    decode(encode(x)) is within half a step, (max - min) / (2**bits - 1) / 2.
    Scales: min and max, float32, per tensor or chunk (8 bytes each).
    ``stochastic=True`` rounds up with probability equal to the remainder
    (unbiased), from noise private to each worker.
  * ``statistical``: MuLoCo's scheme (arXiv 2505.23725): the range
    mean +- 3 standard deviations is cut into 2**bits equal bins (values
    outside go to the edge bins), and each code decodes to the mean of the
    entries in its bin (the bin's centre when it is empty). Codebook:
    2**bits float32 values per tensor or chunk. ``grid="muloco"`` bins as
    the MuLoCo authors' code does instead: step 6 sigma / 2**bits (unbiased
    sigma) and codes round((x - mean) / step + 2**(bits-1)), so at 2 bits
    the edges are -2.25, -0.75 and +0.75 sigma (lowbw's: -1.5, 0, +1.5);
    each code decodes to its bin's mean, sent as a centred codebook plus
    the mean (4 bytes more per chunk).

  Bytes per tensor of n entries: ceil(n * bits / 8) + 8 per chunk (linear), or
  + 4 * 2**bits per chunk (statistical). Workers have their own scales, so
  payloads are all-gathered.

  Args:
    bits: 1, 2, 4 or 8.
    scheme: "linear" or "statistical".
    stochastic: stochastic rounding (linear only).
    chunk: entries per scale group; None = one group per tensor.
    grid: "lowbw" or "muloco" (statistical only).
    sigmas: the statistical bins span mean +- this many standard deviations
      (lowbw's grid; 3 by default, 6 for INTELLECT-1's ``int8``).

  Example:
    >>> codec = quantize(2, "statistical")
  """
  bits, scheme, stochastic, grid, sigmas = _checked(bits, scheme, stochastic,
                                                    grid, sigmas)
  chunker = flat_chunks(chunk)
  chunk = chunker.size

  def encode(x, key, worker):
    flat = x.reshape(-1).astype(jnp.float32)
    values, valid = chunker.split(flat)
    if scheme == "linear":
      noise = (jax.random.uniform(worker_key(key, worker), values.shape)
               if stochastic else None)
      codes, lo, hi = _linear_encode(values, valid, bits, noise)
      scales = {"min": lo, "max": hi}
    elif grid == "muloco":
      codes, shift, lookup = _muloco_encode(values, valid, bits)
      scales = {"shift": shift, "lookup": lookup}
    else:
      codes, codebook = _statistical_encode(values, valid, bits, sigmas)
      scales = {"codebook": codebook}
    return {"codes": pack(codes.reshape(-1)[:flat.size], bits), **scales}

  def decode(payload, key):
    del key
    n = math.prod(payload.shape)
    data = payload.data
    codes = chunker.fill(unpack(data["codes"], bits, n), payload.shape)
    if scheme == "linear":
      values = _linear_decode(codes.astype(jnp.float32), data["min"],
                              data["max"], bits)
    elif grid == "muloco":
      values = (jnp.take_along_axis(data["lookup"], codes, axis=1) +
                data["shift"][:, None])
    else:
      values = jnp.take_along_axis(data["codebook"], codes, axis=1)
    return values.reshape(-1)[:n].reshape(payload.shape)

  name = f"quant:{bits}" + ("" if scheme == "linear" else ":statistical")
  name += ":muloco" if grid == "muloco" else ""
  name += ":stochastic" if stochastic else ""
  name += f":sigmas={sigmas:g}" if sigmas != 3.0 else ""
  name += f":chunk={chunk}" if chunk else ""
  return make_codec(name, encode, decode, summable=False, carries_values=False,
                    needs_key=stochastic,
                    config={"codec": "quantize", "bits": bits,
                            "scheme": scheme, "stochastic": stochastic,
                            "chunk": chunk,
                            **({"grid": grid} if grid != "lowbw" else {}),
                            **({"sigmas": sigmas} if sigmas != 3.0 else {})})


def int8(chunk: int | None = None) -> Codec:
  """INTELLECT-1's 8-bit codec (Jaghouar et al., 2024, "INTELLECT-1
  Technical Report", arXiv 2412.01152, its int8 all-reduce): each tensor (or
  ``chunk``) clipped to mean +- 6 standard deviations, cut into 256 equal
  bins, each code decoding to the mean of the entries in its bin (a
  256-entry float32 codebook). ``quantize(8, "statistical", sigmas=6)``.

  Bytes per tensor of n entries: n + 1,024 per chunk. The report reduces
  the quantized pseudo-gradients in a ring (each hop quantizes again):
  ``aggregation="reduce_scatter"`` on the DiLoCo family simulates that
  (2(W-1)/W x payload); the default all-gather sends (W-1) x payload.
  Its released kernel centres the bins on 0 and spans 6 sigma in all; the
  report's description (mean +- 6 sigma) is what is built here.

  Args:
    chunk: entries per codebook; None = one per tensor.
  """
  codec = quantize(8, "statistical", chunk=chunk, sigmas=6.0)
  chunk = codec.config["chunk"]
  return codec._replace(
      name="int8" + (f":chunk={chunk}" if chunk else ""),
      config={"codec": "int8", "chunk": chunk})


def sign() -> Codec:
  """Scaled sign (Karimireddy et al., 2019, arXiv 1901.09847): one bit per
  entry and one float32 scale, the mean absolute value, so that
  decode(encode(x)) = mean|x| * sign(x) (entries >= 0 count as +).

  Bytes per tensor of n entries: ceil(n / 8) + 4. All-gathered.
  """

  def encode(x, key, worker):
    del key, worker
    flat = x.reshape(-1).astype(jnp.float32)
    scale = jnp.mean(jnp.abs(flat)) if flat.size else jnp.zeros(())
    return {"codes": pack(flat >= 0, 1), "scale": scale.reshape(1)}

  def decode(payload, key):
    del key
    n = math.prod(payload.shape)
    bits = unpack(payload.data["codes"], 1, n).astype(jnp.float32)
    return (payload.data["scale"] * (2 * bits - 1)).reshape(payload.shape)

  return make_codec("sign", encode, decode, summable=False,
                    carries_values=False, needs_key=False,
                    config={"codec": "sign"})


E3M0_SMALLEST = -6  # the smallest non-zero magnitude is scale * 2**-6


def _e3m0_encode(values, valid):
  """(codes, scales): sign in bit 3, exponent field f in bits 0-2 (f = 0 is
  zero, f >= 1 is scale * 2**(f - 7)), nearest value by linear distance."""
  scale = jnp.max(jnp.where(valid, jnp.abs(values), 0.0), axis=1,
                  keepdims=True)
  m = jnp.abs(values) / jnp.where(scale > 0, scale, 1.0)
  k = jnp.floor(jnp.log2(jnp.maximum(m, 2.0 ** -30)))
  e = k + (m >= 1.5 * jnp.exp2(k))          # round to the nearer power of two
  f = jnp.where(m < 2.0 ** (E3M0_SMALLEST - 1), 0,
                jnp.clip(e - E3M0_SMALLEST + 1, 1, 7))
  codes = f.astype(jnp.int32) + 8 * (values < 0)
  return codes, scale[:, 0]


def _e3m0_decode(codes, scale):
  f = codes % 8
  magnitude = jnp.where(f > 0, jnp.exp2((f - 7).astype(jnp.float32)), 0.0)
  return jnp.where(codes >= 8, -1.0, 1.0) * magnitude * scale[:, None]


def e3m0(chunk: int | None = None) -> Codec:
  """4-bit floats with a sign, 3 exponent bits and no mantissa (E3M0), the
  format Streaming DiLoCo sends its outer gradients in (arXiv 2501.18512).

  Each tensor (or each ``chunk`` of its flattened entries) is scaled by its
  largest magnitude; an entry becomes the nearest (by linear distance) of
  0 and ±scale x 2**-k for k = 0..6 (exponent field 0 is zero). The relative
  error of an entry of magnitude at least scale x 2**-6 is at most 1/3.

  Bytes per tensor of n entries: ceil(n / 2) + 4 per chunk (a float32
  scale). Workers have their own scales, so payloads are all-gathered.

  Args:
    chunk: entries per scale; None = one scale per tensor.
  """
  chunker = flat_chunks(chunk)
  chunk = chunker.size

  def encode(x, key, worker):
    del key, worker
    flat = x.reshape(-1).astype(jnp.float32)
    values, valid = chunker.split(flat)
    codes, scale = _e3m0_encode(values, valid)
    return {"codes": pack(codes.reshape(-1)[:flat.size], 4), "scale": scale}

  def decode(payload, key):
    del key
    n = math.prod(payload.shape)
    codes = chunker.fill(unpack(payload.data["codes"], 4, n), payload.shape)
    values = _e3m0_decode(codes, payload.data["scale"])
    return values.reshape(-1)[:n].reshape(payload.shape)

  return make_codec("e3m0" + (f":chunk={chunk}" if chunk else ""), encode,
                    decode, summable=False, carries_values=False,
                    needs_key=False, config={"codec": "e3m0", "chunk": chunk})
