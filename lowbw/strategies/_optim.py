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

import optax

from lowbw import _validate
from lowbw.strategies._schedule import peak_schedule

INNER_KINDS = ("adamw", "adam", "sgd", "muon")

# The settings each inner kind reads besides its learning rate; the command
# line rejects the others as unused.
USES = {"adamw": ("weight_decay",), "adam": (), "sgd": ("momentum",),
        "muon": ("weight_decay",)}


class Optimizer(NamedTuple):
  """An optimizer as values.

  Attributes:
    kind: one of ``INNER_KINDS`` (outer optimizers are ``"sgd"``).
    lr: (peak) learning rate.
    weight_decay: decoupled weight decay (adamw, muon).
    momentum: SGD momentum; 0 for none. Outer SGD with momentum > 0 is
      Nesterov, as in DiLoCo.
  """

  kind: str
  lr: float
  weight_decay: float = 0.0
  momentum: float = 0.0

  def describe(self) -> str:
    """A short human description, e.g. ``adamw, lr 0.0004, wd 0.1``."""
    parts = [self.kind, f"lr {self.lr:g}"]
    if "weight_decay" in USES.get(self.kind, ()):
      parts.append(f"wd {self.weight_decay:g}")
    if self.kind == "sgd" and self.momentum:
      parts.append(f"momentum {self.momentum:g}")
    return ", ".join(parts)


def inner(spec: Optimizer,
          unit_schedule: Callable | None = None
          ) -> optax.GradientTransformation:
  """The inner optimizer ``spec`` describes, validated field by field.

  With ``unit_schedule`` (the schedule's shape with peak 1) the learning rate
  is ``spec.lr * unit_schedule(step)``, the peak a state leaf
  (``peak_schedule``).
  """
  kind = _validate.one_of("inner", spec.kind, INNER_KINDS)
  peak = _validate.positive_float("inner_lr", spec.lr)
  lr = peak if unit_schedule is None else 0.0  # set every step otherwise
  if kind == "adamw":
    tx = optax.inject_hyperparams(optax.adamw)(
        learning_rate=lr,
        weight_decay=_validate.non_negative("weight_decay", spec.weight_decay))
  elif kind == "adam":
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=lr)
  elif kind == "muon":
    from lowbw.strategies._muloco import muon_inner
    tx = muon_inner(
        lr, _validate.non_negative("weight_decay", spec.weight_decay))
  else:
    tx = optax.inject_hyperparams(optax.sgd)(
        learning_rate=lr,
        momentum=_validate.momentum("momentum", spec.momentum) or None)
  return tx if unit_schedule is None else peak_schedule(tx, unit_schedule,
                                                        peak)


def outer(spec: Optimizer, field: str = "outer"
          ) -> optax.GradientTransformation:
  """Outer SGD: Nesterov momentum when ``spec.momentum`` > 0 (DiLoCo);
  errors name ``field``_lr and ``field``_momentum."""
  _validate.one_of(field, spec.kind, ("sgd",))
  lr = _validate.positive_float(field + "_lr", spec.lr)
  momentum = _validate.momentum(field + "_momentum", spec.momentum)
  return optax.inject_hyperparams(optax.sgd)(
      learning_rate=lr, momentum=momentum or None, nesterov=bool(momentum))


# The papers' optimizers, named once.
DILOCO_INNER = Optimizer("adamw", 4e-4, weight_decay=0.1)   # arXiv 2311.08105
DILOCO_OUTER = Optimizer("sgd", 0.7, momentum=0.9)
MULOCO_INNER = Optimizer("muon", 2.6827e-3, weight_decay=7.2e-5)  # 2505.23725
MULOCO_OUTER = Optimizer("sgd", 0.8, momentum=0.9)
AVERAGING = Optimizer("sgd", 1.0)   # outer SGD lr 1: the new model is the mean
DEMO_INNER = Optimizer("sgd", 4e-4)                           # arXiv 2411.19870
