"""The optimizers a strategy names as its defaults, described as data.

A strategy's paper fixes its inner (and outer) optimizer. ``Optimizer`` holds
that choice as plain values, so one description serves the factory (which
builds it when ``inner=None``), the command line (whose ``--inner``,
``--inner-lr``, ... default to it) and the docs' tables. Every optimizer built
here injects its hyperparameters, so learning rates and momenta are state
leaves: logged, and sweepable without recompiling.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import optax
from optax.contrib import MuonDimensionNumbers, muon

from lowbw import _validate
from lowbw._types import Params
from lowbw.strategies._schedule import outer_schedule, peak_schedule

INNER_KINDS = ("adamw", "adam", "adopt", "sgd", "muon")
# The kinds an outer optimizer (of the global parameters) may be: DiLoCo's
# Nesterov SGD, or FedAdam's Adam (Reddi et al., "Adaptive Federated
# Optimization", arXiv 2003.00295).
OUTER_KINDS = ("sgd", "adam")

# The settings each kind owns besides its learning rate (inner or outer);
# the command line rejects another kind's as unused.
USES = {"adamw": ("weight_decay", "b1", "b2", "eps"),
        "adam": ("b1", "b2", "eps"),
        "adopt": ("b1", "b2", "eps"),
        "sgd": ("momentum",),
        "muon": ("weight_decay",)}


class Optimizer(NamedTuple):
  """An optimizer as values.

  Attributes:
    kind: one of ``INNER_KINDS`` (an outer optimizer: one of
      ``OUTER_KINDS``).
    lr: (peak) learning rate.
    weight_decay: decoupled weight decay (adamw, muon).
    momentum: SGD momentum; 0 for none. Outer SGD with momentum > 0 is
      Nesterov, as in DiLoCo.
    min_lr_ratio: a cosine schedule's floor as a fraction of the peak (the
      paper's, where it states one: MuLoCo decays to 0.1x).
    max_norm: clip each worker's gradient to this global norm before the
      optimizer (per worker: the inner optimizer runs under ``vmap``); None:
      no clipping.
    b1: Adam's first-moment decay (adam, adamw, adopt).
    b2: Adam's second-moment decay (adam, adamw, adopt); None: the kind's
      own default (0.999 for Adam, 0.9999 for ADOPT).
    nesterov: outer SGD's momentum is Nesterov's (DiLoCo); False: heavy
      ball (NoLoCo's authors' outer step).
    schedule: the paper's schedule after warm-up, "constant" or "cosine"
      (to ``min_lr_ratio`` times the peak at the run's last step).
    warmup: the paper's linear warm-up as a fraction of the run's steps
      (MuLoCo: 1,000 of 13,740); a run of ``steps`` warms up for
      ``warmup_steps(steps)``.
    eps: Adam's epsilon (adam, adamw, adopt; FedAdam's tau, its degree of
      adaptivity); None: the kind's own (optax's 1e-8; ADOPT's 1e-6).
  """

  kind: str
  lr: float
  weight_decay: float = 0.0
  momentum: float = 0.0
  min_lr_ratio: float = 0.0
  max_norm: float | None = None
  b1: float = 0.9
  b2: float | None = None
  nesterov: bool = True
  schedule: str = "constant"
  warmup: float = 0.0
  eps: float | None = None

  def describe(self) -> str:
    """A short human description, e.g. ``adamw, lr 0.0004, wd 0.1``."""
    parts = [self.kind, f"lr {self.lr:g}"]
    if "weight_decay" in USES.get(self.kind, ()):
      parts.append(f"wd {self.weight_decay:g}")
    if "b1" in USES.get(self.kind, ()) and (self.b1, self.b2) != (0.9, None):
      parts.append(f"betas {self.b1:g}, {self.second_decay:g}")
    if self.eps is not None and "eps" in USES.get(self.kind, ()):
      parts.append(f"eps {self.eps:g}")
    if self.kind == "sgd" and self.momentum:
      parts.append(f"momentum {self.momentum:g}")
    if self.max_norm is not None:
      parts.append(f"clipped at {self.max_norm:g}")
    if self.warmup:
      parts.append(f"warm-up {self.warmup:.1%} of the run")
    if self.schedule == "cosine":
      parts.append(f"cosine to {self.min_lr_ratio:g}x")
    elif self.min_lr_ratio:
      parts.append(f"cosine floor {self.min_lr_ratio:g}x")
    return ", ".join(parts)

  def warmup_steps(self, steps: int | None) -> int:
    """The warm-up of a run of ``steps`` steps (0 when unknown); errors
    name ``warmup``, a fraction in [0, 1)."""
    warmup = _validate.non_negative("warmup", self.warmup)
    if warmup >= 1:
      raise _validate.fail("warmup", warmup, "expected a fraction of the "
                           "run's steps in [0, 1)")
    return round(warmup * steps) if steps else 0

  @property
  def second_decay(self) -> float:
    """b2, or the kind's own default."""
    return B2.get(self.kind, 0.999) if self.b2 is None else self.b2


SCHEDULES = ("constant", "cosine")
# Each Adam-family kind's own second-moment decay (optax's defaults).
B2 = {"adam": 0.999, "adamw": 0.999, "adopt": 0.9999}


def unit_schedule(schedule: str = "constant", warmup_steps: int = 0,
                  steps: int | None = None, min_lr_ratio: float = 0.0
                  ) -> Callable | None:
  """A learning-rate schedule's shape with peak 1, or None for a constant
  rate: linear warm-up over ``warmup_steps``, then constant or a cosine
  decay to ``min_lr_ratio`` at ``steps``."""
  warmup = _validate.non_negative_int("warmup_steps", warmup_steps)
  schedule = _validate.one_of("schedule", schedule, SCHEDULES)
  floor = _validate.fraction("min_lr_ratio", min_lr_ratio, low_open=False)
  if schedule == "cosine":
    if steps is None:
      raise _validate.fail("steps", steps, "a cosine schedule needs the "
                           "run's steps (where it reaches its floor)")
    steps = _validate.positive_int("steps", steps)
    return optax.warmup_cosine_decay_schedule(
        0.0, 1.0, warmup, max(warmup + 1, steps), end_value=floor)
  if warmup:
    return optax.join_schedules(
        [optax.linear_schedule(0.0, 1.0, warmup), optax.constant_schedule(1.0)],
        [warmup])
  return None


def inner_optimizer(kind: str = "adamw", lr: float = 4e-4, *,
                    weight_decay: float = 0.0, momentum: float = 0.0,
                    max_norm: float | None = None,
                    schedule: str = "constant", warmup_steps: int = 0,
                    steps: int | None = None, min_lr_ratio: float = 0.0,
                    b1: float = 0.9, b2: float | None = None,
                    eps: float | None = None
                    ) -> optax.GradientTransformation:
  """An inner optimizer as the command line builds it (``--inner``,
  ``--inner-lr``, ``--max-norm``, ``--schedule``, ...), validated field by
  field; its learning rate's peak is a state leaf (sweepable, logged).

  Args:
    kind: "adamw" | "adam" | "sgd" | "muon".
    lr: (peak) learning rate.
    weight_decay: decoupled weight decay (adamw, muon).
    momentum: SGD momentum, 0 for none.
    max_norm: clip each worker's gradient to this global norm first.
    b1, b2: Adam's moment decays (adam, adamw, adopt), each in [0, 1);
      b2 None: the kind's own (0.999; ADOPT's 0.9999).
    eps: the Adam family's epsilon; None: the kind's own.
    schedule: "constant" or "cosine" (after ``warmup_steps`` of linear
      warm-up; cosine decays to ``min_lr_ratio`` times the peak at
      ``steps``, the run's length).

  Example:
    >>> inner = lowbw.strategies.inner_optimizer(
    ...     "adamw", 3e-4, weight_decay=0.1, max_norm=1.0, schedule="cosine",
    ...     warmup_steps=100, steps=2000, min_lr_ratio=0.1)
  """
  return inner(Optimizer(kind, lr, weight_decay, momentum, min_lr_ratio,
                         max_norm, b1, b2, eps=eps),
               unit_schedule(schedule, warmup_steps, steps, min_lr_ratio))


def paper_inner(spec: Optimizer, steps: int
                ) -> optax.GradientTransformation:
  """``spec`` with its paper's schedule over a run of ``steps`` steps: the
  warm-up fraction and the schedule it names."""
  return inner(spec, unit_schedule(spec.schedule, spec.warmup_steps(steps),
                                   steps, spec.min_lr_ratio))


def inner(spec: Optimizer,
          shape: Callable | None = None
          ) -> optax.GradientTransformation:
  """The inner optimizer ``spec`` describes, validated field by field.

  With ``shape`` (a ``unit_schedule``: the schedule with peak 1) the
  learning rate is ``spec.lr * shape(step)``, the peak a state leaf
  (``peak_schedule``).
  """
  kind = _validate.one_of("inner", spec.kind, INNER_KINDS)
  peak = _validate.positive_float("inner_lr", spec.lr)
  lr = peak if shape is None else 0.0  # set every step otherwise
  if kind in B2:
    betas = _adam_args("", spec)
  if kind == "adopt":  # Taniguchi et al. 2024, arXiv 2411.02853
    tx = optax.inject_hyperparams(  # its clipping function is no schedule
        optax.contrib.adopt, static_args=("clip_value_fn",))(
            learning_rate=lr, **betas)
  elif kind == "adamw":
    tx = optax.inject_hyperparams(optax.adamw)(
        learning_rate=lr, **betas,
        weight_decay=_validate.non_negative("weight_decay", spec.weight_decay))
  elif kind == "adam":
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=lr, **betas)
  elif kind == "muon":
    tx = muon_inner(  # its clipping is max_norm's, below
        lr, _validate.non_negative("weight_decay", spec.weight_decay),
        clip_norm=None)
  else:
    tx = optax.inject_hyperparams(optax.sgd)(
        learning_rate=lr,
        momentum=_validate.momentum("momentum", spec.momentum) or None)
  if spec.max_norm is not None:  # per worker: the optimizer is vmapped
    tx = optax.chain(optax.clip_by_global_norm(
        _validate.positive_float("max_norm", spec.max_norm)), tx)
  return tx if shape is None else peak_schedule(tx, shape, peak)


def _adam_args(prefix: str, spec: Optimizer) -> dict:
  """The Adam family's moment decays (and epsilon, when given) of ``spec``;
  errors name ``prefix`` + b1, b2, eps."""
  args = {"b1": _beta(prefix + "b1", spec.b1),
          "b2": _beta(prefix + "b2", spec.second_decay)}
  if spec.eps is not None:
    args["eps"] = _validate.positive_float(prefix + "eps", spec.eps)
  return args


def _beta(field: str, value) -> float:
  """An Adam moment decay in [0, 1); errors name ``field``."""
  value = _validate.non_negative(field, value)
  if value >= 1:
    raise _validate.fail(field, value, "expected a decay in [0, 1)")
  return value


def outer(spec: Optimizer, field: str = "outer", **schedule
          ) -> optax.GradientTransformation:
  """The outer optimizer ``spec`` describes, on the mean pseudo-gradient:
  SGD, with Nesterov momentum when ``spec.momentum`` > 0 (DiLoCo; heavy ball
  with ``spec.nesterov`` False), or Adam (FedAdam: b1, b2 and eps, the
  paper's tau). Errors name ``field``_lr, ``field``_momentum, ... Its
  learning rate (and SGD's momentum) follow ``outer_schedule(**schedule)``
  (Pier's warm-up and decay; constant when no parameter is given)."""
  kind = _validate.one_of(field, spec.kind, OUTER_KINDS)
  lr = _validate.positive_float(field + "_lr", spec.lr)
  if kind == "adam":
    for name, value in schedule.items():
      if name.startswith("momentum") and value:
        raise _validate.fail(f"{field}_{name}", value, "schedules SGD's "
                             f"momentum; {field} {kind!r} has none")
    return outer_schedule(optax.inject_hyperparams(optax.adam)(
        learning_rate=lr, **_adam_args(field + "_", spec)), **schedule)
  momentum = _validate.momentum(field + "_momentum", spec.momentum)
  return outer_schedule(optax.inject_hyperparams(optax.sgd)(
      learning_rate=lr, momentum=momentum or None,
      nesterov=bool(momentum) and spec.nesterov), **schedule)


# The papers' optimizers, named once.
DILOCO_INNER = Optimizer("adamw", 4e-4, weight_decay=0.1)   # arXiv 2311.08105
DILOCO_OUTER = Optimizer("sgd", 0.7, momentum=0.9)
MULOCO_INNER = Optimizer("muon", 2.6827e-3, weight_decay=7.2e-5,  # 2505.23725
                         min_lr_ratio=0.1, max_norm=1.0,  # Table 4: 1,000
                         schedule="cosine", warmup=1000 / 13740)  # warm-up
MULOCO_OUTER = Optimizer("sgd", 0.8, momentum=0.9)
AVERAGING = Optimizer("sgd", 1.0)   # outer SGD lr 1: the new model is the mean
DEMO_INNER = Optimizer("sgd", 4e-4)                           # arXiv 2411.19870
SPARSELOCO_INNER = Optimizer("adamw", 1e-3, weight_decay=0.1,  # 2508.15706
                             min_lr_ratio=0.1, max_norm=1.0, b2=0.95)
NOLOCO_INNER = Optimizer("adam", 6e-4, min_lr_ratio=0.1,      # 2506.10911
                         max_norm=1.0)
NOLOCO_OUTER = Optimizer("sgd", 0.7, momentum=0.5, nesterov=False)
DESLOC_INNER = Optimizer("adopt", 2.1e-3, b1=0.95, b2=0.9999)  # 2505.22549
SPARSELOCO_OUTER = Optimizer("sgd", 1.0)   # no momentum: error feedback is it


# Path fragments of the tensors Muon must not orthogonalise: embeddings and
# output layers (Muon's authors and MuLoCo give them to AdamW).
NOT_HIDDEN = ("embed", "head", "wte", "wpe", "logit", "classifier", "readout")

def hidden_matrices(params: Params):
  """Muon's labels: ``MuonDimensionNumbers()`` for hidden 2-D weight matrices,
  None (AdamW) for everything else.

  ``optax.contrib.muon`` alone labels every 2-D leaf as Muon, which would
  include the token embedding and the output head; here a leaf is Muon only if
  it is 2-D and no key on its path contains one of ``NOT_HIDDEN`` (lowbw's
  models name those layers ``*embed*`` and ``head``). Apply the optimizer per
  worker (``per_worker``), so ``ndim`` is one worker's.
  """

  def label(path, x):
    names = "/".join(str(getattr(k, "key", getattr(k, "name", k))).lower()
                     for k in path)
    if x.ndim != 2 or any(part in names for part in NOT_HIDDEN):
      return None
    return MuonDimensionNumbers()

  return jax.tree_util.tree_map_with_path(label, params)


def muon_inner(learning_rate=MULOCO_INNER.lr,
               weight_decay: float = MULOCO_INNER.weight_decay,
               clip_norm: float | None = 1.0, hidden=hidden_matrices
               ) -> optax.GradientTransformation:
  """MuLoCo's inner optimizer (arXiv 2505.23725, section 4 and Table 4).

  Muon (Nesterov momentum 0.9, 5 quintic Newton-Schulz steps) on hidden
  matrices; AdamW (beta1 0.9, beta2 0.99) on embeddings, output layer, biases
  and norms; weight decay 7.2e-5 on both; peak lr 2.6827e-3 for both;
  gradients clipped to global norm 1.0 first. Hyperparameters are injected, so
  the learning rate is logged and schedulable.

  Args:
    learning_rate: float or optax schedule.
    weight_decay: decoupled weight decay for Muon and AdamW parameters.
    clip_norm: global-norm clip of each worker's gradients, or None.
    hidden: ``params -> labels`` tree (see ``hidden_matrices``).
  """
  tx = optax.inject_hyperparams(
      muon, static_args=("muon_weight_dimension_numbers", "nesterov",
                         "ns_coeffs"))(
          learning_rate=learning_rate, weight_decay=weight_decay, beta=0.9,
          adam_b1=0.9, adam_b2=0.99, adam_weight_decay=weight_decay,
          nesterov=True, muon_weight_dimension_numbers=hidden)
  if clip_norm is None:
    return tx
  return optax.chain(optax.clip_by_global_norm(clip_norm), tx)




def outer_optimizer(lr: float = DILOCO_OUTER.lr,
                    momentum: float | None = None, *,
                    kind: str = "sgd", b1: float = 0.9,
                    b2: float | None = None, eps: float | None = None,
                    **schedule) -> optax.GradientTransformation:
  """The DiLoCo family's outer optimizer with other settings, as ``outer=``
  of ``diloco``, ``muloco``, ``sparta_diloco``, ...: SGD at ``lr`` with
  Nesterov momentum ``momentum`` (0 for none; defaults: DiLoCo's, lr 0.7 and
  0.9), or with ``kind="adam"`` Adam with ``b1``, ``b2`` and ``eps``
  (FedAdam's server optimizer, arXiv 2003.00295; ``momentum`` is then
  unused). The rate and momentum are state leaves: ``outer_lr`` and
  ``outer_momentum`` sweep them without a new build (a sweep's momentum > 0
  is Nesterov only when the build had momentum > 0). ``schedule`` keywords
  schedule both over outer steps (``outer_schedule``: ``momentum_warmup``,
  ``momentum_decay_start``, ``momentum_decay_steps``, ``momentum_final``,
  and the same ``lr_*`` with ``lr_final_ratio``), as Pier does (arXiv
  2511.17849); they are state leaves too (``outer_momentum_warmup``, ...
  in sweeps).

  Example:
    >>> muloco_outer = lowbw.strategies.outer_optimizer(0.8, 0.9)
    >>> warmed = lowbw.strategies.outer_optimizer(0.7, 0.9, momentum_warmup=10)
    >>> fedadam_outer = lowbw.strategies.outer_optimizer(
    ...     0.01, kind="adam", b2=0.99, eps=1e-3)
  """
  if kind != "sgd" and momentum is not None:
    raise _validate.fail("momentum", momentum, f"is SGD's; kind {kind!r} "
                         "has b1 and b2")
  if momentum is None:  # SGD's default: DiLoCo's Nesterov 0.9
    momentum = DILOCO_OUTER.momentum if kind == "sgd" else 0.0
  return outer(Optimizer(kind, lr, momentum=momentum, b1=b1, b2=b2,
                         eps=eps), **schedule)
