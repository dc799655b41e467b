"""The strategy and optimizer settings of a run, made from the strategies'
specs (``lowbw.strategies.SPECS``).

Nothing here knows a strategy by name: each setting, its type, its help, its
per-strategy default, which strategies use it, and how the strategy is built
from the settings come from the spec its module declares.
"""

import functools

import optax

from lowbw import _validate
from lowbw.config import _defaults, _fields
from lowbw import strategies as strategies_lib
from lowbw.strategies import Param
from lowbw.strategies import _optim, _schedule
from lowbw.strategies._spec import WithCodec, with_codec
from lowbw.transforms import Codec, as_codec

DEFAULT_STRATEGY = "diloco"
SCHEDULES = _optim.SCHEDULES
# Optimizer settings every strategy reads, each defaulting to the spec's
# paper optimizer (the warm-up: its fraction of the run's steps).
OPTIMIZER = ("inner", "inner_lr", "weight_decay", "momentum", "warmup_steps",
             "schedule", "min_lr_ratio", "max_norm", "b1", "b2", "eps")
OUTER_SCHEDULE = tuple("outer_" + k for k in _schedule.OUTER_SCHEDULE)
_MOMENTUM_SCHEDULE = tuple(k for k in OUTER_SCHEDULE
                           if k.startswith("outer_momentum"))
# The outer optimizer's settings every kind has; the others belong to its
# kind (``outer_uses``).
OUTER = ("outer", "outer_lr",
         *(k for k in OUTER_SCHEDULE if k not in _MOMENTUM_SCHEDULE))


def outer_uses() -> dict[str, set[str]]:
  """Outer optimizer kind -> the settings it owns, read from the kind's
  own fields (``strategies._optim.USES``): ``outer_momentum`` and its
  schedule for SGD, ``outer_b1``, ``outer_b2``, ``outer_eps`` for Adam."""
  out = {}
  for kind in _optim.OUTER_KINDS:
    names = {"outer_" + name for name in _optim.USES[kind]}
    if "outer_momentum" in names:
      names.update(_MOMENTUM_SCHEDULE)
    out[kind] = names
  return out
_COMPRESSION = ("ef", "compress")  # besides codecs: the compression group
# Strategy parameters whose value is traced (the error feedback's beta lives
# in the state) -> the hyperparameter's name.
TRACED = {"ef": "ef_beta"}
_TYPES = {int: int, float: float, str: str, bool: bool, Codec: str}


def specs() -> dict[str, strategies_lib.Spec]:
  return strategies_lib.SPECS


def _cli(spec):
  """The parameters with a command-line flag."""
  return [p for p in spec.params if p.flag is not None]


def _by_flag() -> dict[str, list[tuple[str, Param]]]:
  """flag -> [(strategy, param)] over every registered strategy."""
  out = {}
  for name, spec in specs().items():
    for p in _cli(spec):
      out.setdefault(p.flag, []).append((name, p))
  return out


def _extra_outer(spec) -> dict[str, strategies_lib.Optimizer]:
  """The settings of ``spec``'s further outer optimizers: name_lr,
  name_momentum -> (name, its default)."""
  out = {}
  for name, o in spec.optimizers.items():
    out[name + "_lr"] = (name, o.lr)
    out[name + "_momentum"] = (name, o.momentum)
  return out


def _extra_outer_names() -> list[str]:
  return sorted({n for spec in specs().values() for n in spec.optimizers})


def flag_names() -> set[str]:
  """Every setting the strategy flags define."""
  return (set(_by_flag()) | set(OPTIMIZER) | set(OUTER) | {"strategy"} |
          set().union(*outer_uses().values()) |
          {k for spec in specs().values() for k in _extra_outer(spec)})


def defaults(spec: strategies_lib.Spec, steps: int | None = None) -> dict:
  """The settings ``spec`` fills when they are not given: its parameters'
  defaults and its paper's optimizers (with their schedule over a run of
  ``steps`` steps)."""
  out = dict(inner=spec.inner.kind, inner_lr=spec.inner.lr,
             weight_decay=spec.inner.weight_decay,
             momentum=spec.inner.momentum,
             min_lr_ratio=spec.inner.min_lr_ratio,
             max_norm=spec.inner.max_norm, b1=spec.inner.b1,
             b2=spec.inner.b2, eps=spec.inner.eps,
             schedule=spec.inner.schedule,
             warmup_steps=spec.inner.warmup_steps(steps))
  # A strategy's own parameter may share an optimizer flag (DeMo's
  # weight_decay): its default wins.
  out.update({p.flag: p.cli_default for p in _cli(spec)})
  if spec.outer is not None:
    o = spec.outer
    out.update(outer=o.kind, outer_lr=o.lr, outer_momentum=o.momentum,
               outer_b1=o.b1, outer_b2=o.b2, outer_eps=o.eps)
  out.update({k: v for k, (_, v) in _extra_outer(spec).items()})
  return out


def fill(s: dict, keep) -> dict:
  """``s`` with the chosen strategy's defaults for every setting not in
  ``keep`` (given or resumed); a codec-only default (MuLoCo's error
  feedback) becomes None without a codec."""
  spec = strategies_lib.spec(s.get("strategy") or DEFAULT_STRATEGY)
  s = dict(s, strategy=spec.name)
  steps = s.get("steps") if isinstance(s.get("steps"), int) else None
  for name, value in defaults(spec, steps).items():
    if name not in keep:
      s[name] = value
  if not keep & {"strategy", "H"} and spec.name == DEFAULT_STRATEGY:
    s["H"] = _defaults.DEFAULT_RUN_H  # the default run: a curve of rounds
  for p in _cli(spec):
    if isinstance(s[p.flag], WithCodec):
      s[p.flag] = with_codec(s[p.flag], as_codec("codec", s["codec"]))
  return s


def used_by() -> dict[str, set[str]]:
  """strategy -> the strategy-specific settings it reads."""
  return {name: {p.flag for p in _cli(spec)} |
          (set(OUTER) if spec.outer is not None else set()) |
          set(_extra_outer(spec))
          for name, spec in specs().items()}


def _default_text(entries) -> str:
  values = {}
  for name, p in entries:
    values.setdefault(p.cli_default, []).append(name)
  if len(values) == 1 and len(entries) == len(specs()):
    return f"default {_show(next(iter(values)))}"
  return "; ".join(f"{', '.join(names)}: {_show(v)}"
                   for v, names in values.items())


def _show(value) -> str:
  if isinstance(value, bool):  # a flag: --eager / --no-eager
    return "on" if value else "off"
  return "none" if value is None else repr(value) if isinstance(
      value, WithCodec) else str(value)


def _help(entries) -> str:
  texts = {}
  for name, p in entries:
    texts.setdefault(p.help, []).append(name)
  if len(texts) == 1:
    text = next(iter(texts))
  else:
    text = "; ".join(f"{', '.join(n)}: {t}" for t, n in texts.items())
  choices = entries[0][1].choices
  return text + (f" ({' | '.join(choices)})" if choices else "")


def _param_fields() -> list[_fields.Field]:
  """A field per strategy parameter flag (``H``, ``codec``, ``ef``, ...)."""
  out = []
  for flag, entries in sorted(_by_flag().items(), key=_flag_order):
    if flag in OPTIMIZER:  # an optimizer field, below
      continue
    p = entries[0][1]
    group = ("compression" if p.kind is Codec or flag in _COMPRESSION
             else "strategy")
    kind, knob = _fields.SHAPE, None
    if flag in TRACED:  # beta of the error feedback: a traced value
      kind, knob = _fields.TRACED, TRACED[flag]
    out.append(_fields.Field(
        flag, None, kind, group, f"{_help(entries)} [{_default_text(entries)}]",
        _TYPES[p.kind], knob=knob))
  return out


def _flag_order(item):
  flag, entries = item
  return (-len(entries), flag.lower())


def _per_strategy(get) -> str:
  values = {}
  for name, spec in specs().items():
    value = get(spec)
    if value is not None:
      values.setdefault(value, []).append(name)
  return "; ".join(f"{', '.join(n)}: {v:g}" if isinstance(v, float) else
                   f"{', '.join(n)}: {v}" for v, n in values.items())


def _optimizer_fields() -> list[_fields.Field]:
  F, S, T, O = (_fields.Field, _fields.SHAPE, _fields.TRACED,
                "optimizers")
  out = [
      F("inner", None, S, O, "inner optimizer [" +
        _per_strategy(lambda s: s.inner.kind) + "]",
        choices=_optim.INNER_KINDS),
      F("inner_lr", None, T, O, "(peak) inner learning rate [" +
        _per_strategy(lambda s: s.inner.lr) + "]", float, knob="inner_lr"),
      F("weight_decay", None, T, O, "decoupled weight decay: adamw and muon "
        "inners, and DeMo's sign step [default: the strategy's paper "
        "optimizer's; " + _per_strategy(
            lambda s: s.inner.weight_decay if s.inner.kind in
            ("adamw", "muon") or s.name == "demo" else None) + "]", float,
        knob="inner_weight_decay"),
      F("momentum", None, T, O, "sgd inner momentum, 0 for none [default: "
        "the strategy's paper optimizer's, 0 unless it is sgd]", float,
        knob="inner_momentum"),
      F("b1", None, T, O, "adam, adamw and adopt inners' first-moment decay "
        "[" + _per_strategy(lambda s: s.inner.b1 if s.inner.kind in
                            _optim.B2 else None) + "]", float,
        knob="inner_b1"),
      F("b2", None, T, O, "adam, adamw and adopt inners' second-moment "
        "decay [default: the kind's own, 0.999 (adopt 0.9999); " +
        _per_strategy(lambda s: s.inner.b2) + "]", float, knob="inner_b2"),
      F("eps", None, T, O, "adam, adamw and adopt inners' epsilon "
        "[default: the kind's own, 1e-8 (adopt 1e-6)]", float,
        knob="inner_eps"),
      F("warmup_steps", None, S, O, "linear learning-rate warm-up [default "
        "0; " + _per_strategy(lambda s: f"{s.inner.warmup:.1%} of the steps"
                              if s.inner.warmup else None) + "]", int,
        unit="steps"),
      F("schedule", None, S, O, "after warm-up [" + _per_strategy(
          lambda s: s.inner.schedule) + "]", choices=SCHEDULES),
      F("min_lr_ratio", None, S, O, "cosine schedule's floor, a fraction of "
        "the peak in [0, 1] [" + _per_strategy(
            lambda s: s.inner.min_lr_ratio) + "]", float),
      F("max_norm", None, S, O, "clip each worker's gradient to this global "
        "norm before the inner optimizer [default: none]", float),

  ]
  out += _outer_fields()
  out += [F(name, None, T, O, _SCHEDULE_HELP[name], float, knob=name)
          for name in OUTER_SCHEDULE]
  for name in _extra_outer_names():
    # Only the strategies with this optimizer have a default to show.
    # Traced like outer_lr: the strategy says where this optimizer lives
    # (Strategy.outer_places), and the knob has the field's name.
    out.append(F(name + "_lr", None, T, O, f"{name} SGD learning rate [" +
                 _per_strategy(lambda s: s.optimizers[name].lr
                               if name in s.optimizers else None) + "]",
                 float, knob=name + "_lr"))
    out.append(F(name + "_momentum", None, T, O, f"{name} Nesterov "
                 "momentum, 0 for plain SGD [" + _per_strategy(
                     lambda s: s.optimizers[name].momentum
                     if name in s.optimizers else None) + "]", float,
                 knob=name + "_momentum"))
  return out


def _outer_fields() -> list[_fields.Field]:
  """The outer optimizer's kind and settings (each kind's own: ``outer_uses``)."""
  F, S, T, O = (_fields.Field, _fields.SHAPE, _fields.TRACED,
                "optimizers")
  return [
      F("outer", None, S, O, "outer optimizer of the global parameters: "
        "sgd (Nesterov momentum, DiLoCo's) or adam (FedAdam's, arXiv "
        "2003.00295) [" + _per_strategy(lambda s: s.outer.kind if s.outer else None)
        + "]", choices=_optim.OUTER_KINDS),
      F("outer_lr", None, T, O, "outer learning rate [" +
        _per_strategy(lambda s: s.outer and s.outer.lr) + "]", float,
        knob="outer_lr"),
      F("outer_momentum", None, T, O, "outer sgd's Nesterov momentum, 0 for "
        "plain SGD [" + _per_strategy(lambda s: s.outer.momentum if s.outer
                                      and s.outer.kind == "sgd" else None) +
        "]", float, knob="outer_momentum"),
      F("outer_b1", None, T, O, "outer adam's first-moment decay [default "
        f"{strategies_lib.Optimizer._field_defaults['b1']:g}]", float,
        knob="outer_b1"),
      F("outer_b2", None, T, O, "outer adam's second-moment decay [default "
        f"{_optim.B2['adam']:g}; " + _per_strategy(lambda s: s.outer.b2 if s.outer and
                                  s.outer.kind == "adam" else None) + "]", float,
        knob="outer_b2"),
      F("outer_eps", None, T, O, "outer adam's epsilon (FedAdam's tau, its "
        "degree of adaptivity) [default 1e-8; " + _per_strategy(
            lambda s: s.outer.eps if s.outer else None) + "]", float,
        knob="outer_eps"),
  ]


_SCHEDULE_HELP = {
    "outer_lr_warmup": "outer steps of linear outer-lr warm-up [default 0]",
    "outer_lr_decay_start": "outer step where the outer lr starts its "
                            "linear decay [default 0]",
    "outer_lr_decay_steps": "outer steps of that decay; 0: none [default 0]",
    "outer_lr_final_ratio": "the decayed outer lr, a fraction of its peak "
                            "[default 0]",
    "outer_momentum_warmup": "outer steps of linear outer-momentum warm-up "
                             "(Pier, arXiv 2511.17849) [default 0]",
    "outer_momentum_decay_start": "outer step where the outer momentum "
                                  "starts its linear decay [default 0]",
    "outer_momentum_decay_steps": "outer steps of that decay; 0: none "
                                  "[default 0]",
    "outer_momentum_final": "the decayed outer momentum [default 0]",
    "outer_momentum_restart": "zero the outer momentum buffer every this "
                              "many outer steps (outer-momentum restarts, "
                              "arXiv 2605.28585); 0: never [default 0]",
}


def fields() -> tuple[_fields.Field, ...]:
  """``strategy``, every strategy parameter's field and the optimizers'
  (their defaults are the chosen strategy's, filled by ``fill``)."""
  return (_fields.Field("strategy", DEFAULT_STRATEGY, _fields.SHAPE,
                        "strategy", "one of " + ", ".join(sorted(specs()))
                        + f" (default {DEFAULT_STRATEGY} with H="
                        f"{_defaults.DEFAULT_RUN_H}, 10 rounds of the "
                        "default 200 steps; named, a strategy's H is its "
                        "own; a strategy registered later is accepted "
                        "too)"),
          *_param_fields(), *_optimizer_fields())


def build_inner(s: dict) -> optax.GradientTransformation:
  """The settings' inner optimizer; its peak learning rate is a state leaf
  (``peak_schedule``), so sweeps of inner_lr work."""
  return _made(strategies_lib.inner_optimizer, s["inner"], s["inner_lr"],
               weight_decay=s["weight_decay"], momentum=s["momentum"],
               max_norm=s["max_norm"], b1=s["b1"], b2=s["b2"], eps=s["eps"],
               schedule=s["schedule"], warmup_steps=s["warmup_steps"],
               steps=s["steps"], min_lr_ratio=s["min_lr_ratio"])


def _made(factory, *args, **kwargs):
  """``factory(*args, **kwargs)``, the same object for the same settings:
  an optimizer is a pure value, and its description (``strategies._base.
  describe``, which runs its ``init``) is then made once, not once per
  config of a study's grid (6 ms a point). Unhashable settings build
  afresh."""
  try:
    return _made_once(factory, args, tuple(kwargs.items()))
  except TypeError:  # unhashable
    return factory(*args, **kwargs)


@functools.lru_cache(maxsize=128)
def _made_once(factory, args: tuple, kwargs: tuple):
  return factory(*args, **dict(kwargs))


def spec_of(s: dict) -> strategies_lib.Spec:
  """The spec of the settings' strategy (the default one if unset)."""
  return strategies_lib.spec(s.get("strategy") or DEFAULT_STRATEGY)


def build(s: dict) -> strategies_lib.Strategy:
  """The strategy the settings describe, built by its spec's factory."""
  spec = strategies_lib.spec(s["strategy"])
  kwargs = {p.name: s[p.flag] for p in _cli(spec)}
  if spec.outer is not None:
    kwargs["outer"] = _made(strategies_lib.outer, spec.outer._replace(
        kind=s["outer"], lr=s["outer_lr"], momentum=s["outer_momentum"],
        b1=s["outer_b1"], b2=s["outer_b2"], eps=s["outer_eps"]), **{
            name[len("outer_"):]: s[name] for name in OUTER_SCHEDULE
            if s.get(name) is not None})
  for name, o in spec.optimizers.items():
    kwargs[name] = _made(strategies_lib.outer, o._replace(
        lr=s[name + "_lr"], momentum=s[name + "_momentum"]), name)
  try:
    return spec.factory(inner=build_inner(s), **kwargs)
  except _validate.ConfigError as e:
    # The factory names its keyword (Streaming DiLoCo's ``alpha``); the
    # command line knows it by its flag (``merge_alpha``, not Dirichlet's
    # ``alpha``).
    raise _validate.renamed(e, {p.name: p.flag for p in _cli(spec)}
                            ) from None
