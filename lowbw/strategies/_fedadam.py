"""FedAdam: DiLoCo whose outer optimizer is Adam (Reddi et al., 2021,
"Adaptive Federated Optimization", arXiv 2003.00295)."""

import optax

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import build
from lowbw.transforms import Codec, compression

# The paper fixes beta1 = 0.9 and beta2 = 0.99 for FedAdam and tunes the
# server rate and tau (Adam's epsilon, "the degree of adaptivity"); lr 0.01
# and tau 1e-3 are lowbw's defaults for short runs on the embedded data.
FEDADAM_OUTER = _optim.Optimizer("adam", 1e-2, b1=0.9, b2=0.99, eps=1e-3)


def fedadam(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
    message: optax.GradientTransformation | None = None,
    aggregation: str = "all_gather",
) -> _base.Strategy:
  """FedAdam: H local inner steps, then an Adam step on the mean pseudo-gradient.

  The server optimizer of Reddi et al. (arXiv 2003.00295, Algorithm 2) on
  DiLoCo's rounds: the workers' mean pseudo-gradient feeds Adam (b1 0.9,
  b2 0.99, the paper's; lr 0.01 and epsilon, the paper's tau, 1e-3), whose
  per-coordinate step sizes adapt where DiLoCo's outer Nesterov SGD takes
  one rate for all. Adam's bias correction is kept (the paper's Algorithm 2
  leaves it out; the two differ in the first ~1/(1 - b2) = 100 rounds
  only). Workers run DiLoCo's inner AdamW (lr 4e-4, weight decay 0.1); the
  paper's clients run SGD (``inner=optax.sgd(...)``).

  Bytes per worker and sync: as DiLoCo's, the pseudo-gradient (4 bytes x P
  in float32, or the codec's payload), 2(W-1)/W x payload on a ring.

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: optimizer of the global parameters; default Adam as above
      (``lowbw.strategies.outer_optimizer(kind="adam", ...)``).
    H: inner steps per round (>= 1).
    codec: a codec (or spec string) for the pseudo-gradients, or None.
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None.
    message: the per-worker message chain replacing codec's default one.
    aggregation: "all_gather" or "reduce_scatter" (see ``diloco``).

  Example:
    >>> strategy = lowbw.strategies.fedadam(H=20)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer,
                          lambda: _optim.outer(FEDADAM_OUTER))
  H = _validate.positive_int("H", H)
  return build("fedadam", inner, outer, H,
               compression(codec, error_feedback, message, aggregation),
               clients=True)


SPEC = _spec.spec(
    fedadam, inner=_optim.DILOCO_INNER, outer=FEDADAM_OUTER,
    paper="Reddi et al. 2021, arXiv 2003.00295",
    where="its experiments: server Adam with beta1 0.9, beta2 0.99, tau and the server "
    "rate tuned (lowbw: lr 0.01, tau 1e-3); workers as DiLoCo's (the "
    "paper's clients run SGD)",
    help={"codec": "codec of the pseudo-gradients"})
