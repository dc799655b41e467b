"""MuLoCo: DiLoCo with Muon as the inner optimizer, compressed pseudo-gradients
and error feedback (Thérien et al., 2025, "MuLoCo: Muon is a practical inner
optimizer for DiLoCo", arXiv 2505.23725)."""

import optax

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import build
from lowbw.transforms import Codec, as_codec, compression

def muloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 30,
    codec: Codec | str | None = "quant:2:statistical:muloco",
    error_feedback: float | None = _spec.WithCodec(0.9),
    message: optax.GradientTransformation | None = None,
    aggregation: str = "all_gather",
) -> _base.Strategy:
  """MuLoCo: DiLoCo whose workers run Muon, with compressed pseudo-gradients.

  Defaults are the paper's (arXiv 2505.23725, Tables 2 and 4): inner Muon at
  lr 2.6827e-3 (``muon_inner``), outer SGD with Nesterov momentum (lr 0.8,
  momentum 0.9), H = 30, and its headline compression: 2-bit statistical
  quantization with error feedback beta = 0.9 (Algorithm 1, lines 14-17),
  on the authors' grid (``grid="muloco"``, as their code bins), which sends
  1/16 of DiLoCo's float32 bytes plus 20 bytes per tensor (a 4-entry
  codebook and the mean). ``codec=None`` gives uncompressed MuLoCo (error feedback then
  defaults to off).

  Bytes per worker and sync: the codec's payload of the pseudo-gradient,
  all-gathered for quantizers ((W-1) x payload sent), or with
  ``aggregation="reduce_scatter"`` a quantized all-reduce (2(W-1)/W x
  payload; the mean is quantized a second time, as the authors' sweeps
  assume).

  Args:
    inner: per-worker optimizer; default ``muon_inner()``.
    outer: optimizer of the global parameters.
    H: inner steps per round (>= 1).
    codec: codec of the pseudo-gradients (a codec or spec string); default
      ``quantize(2, "statistical", grid="muloco")``.
    error_feedback: residual decay beta; default 0.9 with a codec, None without.
    aggregation: "all_gather" or "reduce_scatter" (see ``diloco``).

  Example:
    >>> strategy = lowbw.strategies.muloco(codec=lowbw.transforms.top_k(0.1))
  """
  inner = _base.optimizer("inner", inner, _optim.muon_inner)
  outer = _base.optimizer(
      "outer", outer, lambda: _optim.outer(_optim.MULOCO_OUTER))
  H = _validate.positive_int("H", H)
  codec = as_codec("codec", codec)
  error_feedback = _spec.with_codec(error_feedback, codec, message)
  return build("muloco", inner, outer, H,
               compression(codec, error_feedback, message, aggregation))


SPEC = _spec.spec(
    muloco, inner=_optim.MULOCO_INNER, outer=_optim.MULOCO_OUTER,
    paper="Thérien et al. 2025, arXiv 2505.23725",
    where="§4 and Table 4: Muon lr 2.6827e-3, weight decay 7.2e-5, clipping 1.0, 1,000 warm-up steps of 13,740 then cosine to 0.1x; outer lr 0.8, Nesterov 0.9; 2-bit codes with error feedback 0.9 (Algorithm 1)",
    help={"codec": "codec of the pseudo-gradients"})
