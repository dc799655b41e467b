"""Staleness-aware outer transforms: an outer step that knows how old its
pseudo-gradient is.

An asynchronous server (``async_diloco``) applies a pseudo-gradient computed
from a model several outer steps old; its *age* tau is the number of outer
steps applied since the worker pulled. The transforms here take that age as
an extra argument of ``update`` (``age=``), as ``delayed_nesterov`` takes
``arrivals=``, and compose with optax like any other.
"""

import functools
import inspect
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Array, PyTree
from lowbw.strategies import _optim


def cgad_scale(age, alpha: float, cutoff: float) -> Array:
  """CGAD's age gate sigma(tau) = gamma(tau) x exp(-alpha x tau).

  gamma is the cosine gate 0.5 x (1 + cos(pi x tau / cutoff)) for tau below
  ``cutoff`` and 0 from it on: it goes from 1 at tau = 0 smoothly to 0 at
  the cutoff (``cutoff`` 0: no gate, gamma = 1, the paper's Adam-Decay).
  sigma(0) = 1 for every alpha and cutoff; alpha = 0 and no cutoff give
  sigma = 1 at every age.
  """
  age = jnp.asarray(age, jnp.float32)
  decay = jnp.exp(-alpha * age)
  if not cutoff:
    return decay
  gate = 0.5 * (1.0 + jnp.cos(math.pi * jnp.minimum(age, cutoff) / cutoff))
  return jnp.where(age < cutoff, gate, 0.0) * decay


def _check(alpha, cutoff) -> tuple[float, float]:
  alpha = _validate.non_negative("alpha", alpha)
  cutoff = _validate.non_negative("cutoff", cutoff)
  return alpha, cutoff


def scale_by_age(alpha: float, cutoff: float
                 ) -> optax.GradientTransformationExtraArgs:
  """Scales the update by CGAD's gate sigma(age) (``cgad_scale``).

  ``update(updates, state, params, age=tau)``: ``age`` is one number for
  the whole update, or a tree that is a prefix of the updates' (one age per
  fragment or tensor: the paper's per-fragment form, PA-CGAD, for a server
  whose fragments were synchronised at different outer steps). Without
  ``age`` the update is taken as fresh (tau = 0, sigma = 1). Stateless.

  Args:
    alpha: the exponential's rate, >= 0.
    cutoff: the age at which the cosine gate reaches 0, >= 0 (0: no gate).
  """
  alpha, cutoff = _check(alpha, cutoff)

  def update(updates, state, params=None, *, age=0.0, **extra):
    del params, extra
    scaled = jax.tree.map(
        lambda tau, sub: jax.tree.map(lambda u: u * cgad_scale(
            tau, alpha, cutoff).astype(u.dtype), sub), age, updates)
    return scaled, state

  return optax.GradientTransformationExtraArgs(
      lambda params: optax.EmptyState(), update)


def cgad(alpha: float, cutoff: float,
         learning_rate: float = 1e-2, *, b1: float = 0.9, b2: float = 0.99,
         eps: float = 1e-3) -> optax.GradientTransformationExtraArgs:
  """Cosine-Gated Adam-Decay (CGAD): Adam on the age-gated pseudo-gradient.

  Shah and Sun 2026, "Cosine-Gated Adam-Decay: Drop-In Staleness-Aware
  Outer Optimization for Decoupled DiLoCo" (arXiv 2605.09126): each
  pseudo-gradient is scaled by sigma(tau) = gamma(tau) exp(-alpha tau)
  (``cgad_scale``) before it enters Adam's first- and second-moment
  buffers; at tau = 0 it is plain Adam. Here it is ``scale_by_age``
  chained before lowbw's outer Adam (``outer_optimizer(kind="adam")``,
  whose learning rate and betas are state leaves, swept as ``outer_lr``,
  ``outer_b1``, ...). ``async_diloco`` passes each outer step's age.

  The paper says its two hyperparameters' defaults transfer across scales;
  their values are not in the abstract we could read, so ``alpha`` and
  ``cutoff`` have no default here. The Adam defaults are FedAdam's server
  optimizer (arXiv 2003.00295: lr 1e-2, b1 0.9, b2 0.99, eps 1e-3), lowbw's
  outer Adam elsewhere, not the paper's.

  Args:
    alpha: the exponential's rate (information decay per outer step).
    cutoff: the age at which the cosine gate reaches 0 (0: no gate, the
      paper's Adam-Decay baseline).
    learning_rate, b1, b2, eps: the outer Adam's.

  Example:
    >>> outer = lowbw.strategies.cgad(alpha=0.1, cutoff=8.0)
    >>> strategy = lowbw.strategies.async_diloco(H=20, outer=outer)
  """
  gate = scale_by_age(alpha, cutoff)  # checks them first
  adam = _optim.outer_optimizer(learning_rate, kind="adam", b1=b1, b2=b2,
                                eps=eps)
  return optax.chain(gate, adam)



class HeLoCoState(NamedTuple):
  """HeLoCo's reference direction: an estimate of the outer momentum.

  Attributes:
    momentum: m <- mu x m + (1 - mu) x (the corrected pseudo-gradient), the
      paper's outer momentum form, kept here because an optax chain cannot
      read the next transformation's state.
  """

  momentum: PyTree


def heloco_block(delta: Array, m: Array, *, keep: float, shrink: float,
                 shrink_cap: float, reorient: float, kappa: float,
                 eps: float = 1e-8) -> Array:
  """HeLoCo's correction of one tensor block ``delta`` by its cosine c with
  the momentum ``m`` (arXiv 2606.00271).

  c >= ``keep``: kept. c < 0: shrunk along m, delta - beta c |delta| m^,
  beta = min(``shrink`` x (-c) x conf, ``shrink_cap``) (beta = 1 removes
  delta's component along m: its projection off m). 0 <= c < ``keep``:
  reoriented, its direction moved a fraction lambda = min(``reorient`` x
  (1 - c) x conf, 1) of the way to m^ and its norm kept. conf = |delta| /
  (|delta| + ``kappa`` |m| + eps) weighs each correction by how large the
  pseudo-gradient is next to the momentum. A block with no momentum yet (or
  a zero pseudo-gradient) is kept.
  """
  d, v = delta.astype(jnp.float32), m.astype(jnp.float32)
  norm = lambda x: jnp.sqrt(jnp.sum(x * x))  # noqa: E731  (any rank, 0 too)
  nd, nm = norm(d), norm(v)
  live = (nd > 0) & (nm > 0)
  u_hat = d / jnp.where(live, nd, 1.0)
  v_hat = v / jnp.where(live, nm, 1.0)
  c = jnp.clip(jnp.sum(u_hat * v_hat), -1.0, 1.0)
  conf = nd / (nd + kappa * nm + eps)
  beta = jnp.minimum(shrink * -c * conf, shrink_cap)
  shrunk = d - beta * c * nd * v_hat
  lam = jnp.minimum(reorient * (1.0 - c) * conf, 1.0)
  u_tilde = (1.0 - lam) * u_hat + lam * v_hat
  turned = nd * u_tilde / jnp.maximum(norm(u_tilde), eps)
  fixed = jnp.where(c < 0, shrunk, turned).astype(delta.dtype)
  return jnp.where(live & (c < keep), fixed, delta)


def heloco(keep: float = 0.2, shrink: float = 1.0, shrink_cap: float = 1.0,
           reorient: float = 0.5, kappa: float = 1.0, momentum: float = 0.9
           ) -> optax.GradientTransformationExtraArgs:
  """HeLoCo: each tensor of a stale pseudo-gradient kept, shrunk or
  reoriented by its cosine with the outer momentum (``heloco_block``).

  Asif et al. 2026, "HeLoCo: Efficient asynchronous low-communication
  training under data and device heterogeneity" (arXiv 2606.00271). The
  paper's reference is the outer Nesterov momentum; an optax transform
  cannot read the outer optimizer's state, so this one keeps its own
  estimate m <- ``momentum`` x m + (1 - ``momentum``) x (the corrected
  pseudo-gradient), the paper's momentum form. With lowbw's outer SGD of the
  same Nesterov momentum (whose trace is m' <- mu m' + g) it is (1 - mu)
  times the outer momentum: the same direction. One block per tensor; every
  outer step is corrected whatever its age. The rule is read from a summary
  of the paper's equations; the defaults are lowbw's choice (the paper's
  values could not be read); ``momentum`` 0.9 is DiLoCo's outer momentum.

  Args:
    keep: the keep threshold c_ok: blocks whose cosine is at least this
      pass unchanged (-1: every block, plain outer step).
    shrink, shrink_cap: the shrinkage strength k_s and cap beta_max (>= 0).
    reorient: the reorientation strength k_d (>= 0).
    kappa: the momentum norm's weight in the confidence (>= 0).
    momentum: the reference momentum's coefficient mu, in [0, 1).
  """
  keep = _validate.finite_float("keep", keep)
  if not -1.0 <= keep <= 1.0:
    raise _validate.fail("keep", keep, "expected a cosine in [-1, 1]")
  shrink, shrink_cap, reorient, kappa = (
      _validate.non_negative(f, v) for f, v in (
          ("shrink", shrink), ("shrink_cap", shrink_cap),
          ("reorient", reorient), ("kappa", kappa)))
  momentum = _validate.momentum("momentum", momentum)
  correct = functools.partial(heloco_block, keep=keep, shrink=shrink,
                              shrink_cap=shrink_cap, reorient=reorient,
                              kappa=kappa)

  def update(updates, state, params=None, **extra):
    del params, extra
    fixed = jax.tree.map(correct, updates, state.momentum)
    m = jax.tree.map(lambda m, g: momentum * m + (1.0 - momentum) * g.astype(
        m.dtype), state.momentum, fixed)
    return fixed, HeLoCoState(m)

  return optax.GradientTransformationExtraArgs(
      lambda params: HeLoCoState(optax.tree.zeros_like(params)), update)


# --------------------------------------------- a rule as a spec string
def _defaults(build: Callable) -> dict:
  """A rule's fields, read from its factory's signature: field -> default
  (None: required)."""
  return {name: (None if p.default is inspect.Parameter.empty
                 else p.default)
          for name, p in inspect.signature(build).parameters.items()}


class _Rule(NamedTuple):
  build: Callable        # its fields as keywords -> a transformation
  what: str              # one line for help and errors

  @property
  def fields(self) -> dict:
    """field -> default (None: required), from ``build``'s signature."""
    return _defaults(self.build)


RULES = {
    "cgad": _Rule(scale_by_age, "CGAD's age gate sigma(age) before the "
                  "outer optimizer (arXiv 2605.09126)"),
    "heloco": _Rule(heloco, "HeLoCo's per-tensor keep / shrink / reorient "
                    "by the cosine with the outer momentum (arXiv "
                    "2606.00271)"),
}
HELOCO_DEFAULTS = _defaults(heloco)
NO_RULE = "none"


def stale_forms() -> tuple[str, ...]:
  """Every form a ``stale_outer`` spec may take, as help and errors show
  it: each rule with its fields (``=A``: required; ``=0.2``: its default)."""
  def form(name, rule):
    fields = ",".join(f"{k}={k[0].upper() if d is None else f'{d:g}'}"
                      for k, d in rule.fields.items())
    return f"{name}:{fields}"
  return (*(form(n, r) for n, r in RULES.items()), NO_RULE)


def parse_stale_outer(spec: str | None, field: str = "stale_outer"
                      ) -> tuple[str, dict[str, float]] | None:
  """``(rule, its fields)`` from a spec such as ``"cgad:alpha=0.1,cutoff=8"``
  (fields left out take their defaults), or None for None or ``"none"``.
  Errors name ``field``, the spec and what is allowed."""
  if spec is None:
    return None
  if not isinstance(spec, str) or not spec.strip():
    raise _validate.fail(field, spec, "expected a staleness rule: " +
                         ", ".join(stale_forms()))
  name, _, rest = spec.strip().partition(":")
  name = name.strip().lower()
  if name == NO_RULE and not rest:
    return None
  if name not in RULES:
    raise _validate.fail(field, spec, f"unknown rule {name!r}" +
                         _validate.suggest(name, [*RULES, NO_RULE]) +
                         "; rules are " + ", ".join(stale_forms()))
  rule, given = RULES[name], {}
  for item in (s.strip() for s in rest.split(",") if rest.strip()):
    key, eq, value = (s.strip() for s in item.partition("="))
    if key not in rule.fields:
      raise _validate.fail(field, spec, f"{name} has no field {key!r}" +
                           _validate.suggest(key, rule.fields) +
                           "; its fields are " + ", ".join(rule.fields))
    if not eq or key in given:
      raise _validate.fail(field, spec, f"expected each field of {name} "
                           "once, as field=number")
    try:
      given[key] = float(value)
    except ValueError:
      raise _validate.fail(field, spec, f"{name}'s {key}={value!r} is not "
                           "a number") from None
  missing = [k for k, d in rule.fields.items() if d is None and k not in given]
  if missing:
    raise _validate.fail(field, spec, f"{name} needs " + " and ".join(
        missing) + ": " + dict(zip(RULES, stale_forms()))[name])
  return name, {**rule.fields, **given}


def stale_outer(spec: str | None, outer: optax.GradientTransformation,
                field: str = "stale_outer"
                ) -> optax.GradientTransformationExtraArgs:
  """``outer`` with the staleness rule ``spec`` chained before it.

  The rule is a choice with its own fields, written as a spec string
  (``stale_forms()``): ``"cgad:alpha=0.1,cutoff=8"`` scales each outer
  step's pseudo-gradient by CGAD's sigma(age) (``scale_by_age``): with an
  Adam ``outer`` that is CGAD exactly (``cgad``); with SGD and Nesterov
  momentum the gated pseudo-gradient enters the momentum and the step at
  its own scale (Adam's normalisation, which makes the gate relative to the
  recent arrivals, is absent). ``"heloco"`` or ``"heloco:keep=0.3"``
  corrects it by its cosine with the outer momentum (``heloco``). None or
  ``"none"``: ``outer`` itself. The strategy's ``update`` passes ``age=``
  (and ``arrivals=``); rules read what they need.

  Example:
    >>> outer = lowbw.strategies.outer_optimizer(1e-2, kind="adam")
    >>> tx = lowbw.strategies.stale_outer("cgad:alpha=0.1,cutoff=8", outer)
  """
  outer = optax.with_extra_args_support(outer)
  parsed = parse_stale_outer(spec, field)
  if parsed is None:
    return outer
  name, fields = parsed
  try:
    rule = RULES[name].build(**fields)
  except _validate.ConfigError as e:
    raise _validate.fail(field, spec, f"{name}'s {e.field}={e.value!r} is "
                         f"invalid: {e.allowed}") from None
  return optax.chain(rule, outer)
