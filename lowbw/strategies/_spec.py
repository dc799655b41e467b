"""What a strategy takes, read from its factory: the one source of truth.

A strategy module defines its factory (whose signature holds the defaults and
whose docstring the documentation) and, next to it, a ``Spec`` made by
``spec(factory, ...)``: the parameters' types and defaults come from the
signature, the help text and the papers' optimizers from the call. The Python
API, ``lowbw train``, ``lowbw sweep``, ``lowbw bench`` and the docs' defaults
table all read it; adding a strategy is one module plus one registry line.
"""

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, NamedTuple

import optax

from lowbw.strategies._optim import Optimizer
from lowbw.strategies._stale import stale_forms
from lowbw.transforms import Codec
from lowbw.transforms._compression import AGGREGATIONS
from lowbw.transforms._sparse import SELECTORS

# Parameters that mean the same in every strategy that takes them: their help
# (and allowed values) live here once; a strategy's own help= adds the rest.
HELP = {
    "H": "inner steps per sync",
    "error_feedback": "error-feedback beta in [0, 1] (needs a codec)",
    "message": "the per-worker message chain (an optax transformation; "
               "Python only)",
    "p": "fraction of each tensor averaged per step, in (0, 1]",
    "selector": "how the averaged indices are drawn",
    "sparta_interval": "average the sparse subset every this many steps",
    "dylu_weighted": "with dylu: the mean pseudo-gradient weighted by the "
                     "inner steps each worker took",
    "robust": "how the workers' pseudo-gradients are combined: mean, "
              "median (coordinate-wise), trimmed_mean[:F] (F cut from "
              "each end, default 0.2) or selected_mean (each entry over "
              "the workers whose message has it); not the mean: "
              "all-gathered",
    "dylu": "time-budgeted rounds (DyLU, arXiv 2401.09135): each worker "
            "takes floor(H x its speed / the fastest's) inner steps per "
            "round, at least 1",
    "stale_outer": "a staleness rule before the outer optimizer: "
                   + ", ".join(stale_forms()) + " (CGAD, arXiv 2605.09126; "
                   "HeLoCo, arXiv 2606.00271)",
    "aggregation": "how payloads that cannot be summed are combined: "
                   "all_gather, or reduce_scatter (a quantized all-reduce: "
                   "the mean encoded again, 2(W-1)/W x payload)",
}
CHOICES = {"selector": SELECTORS, "aggregation": AGGREGATIONS}

# The command line's short names for some parameters.
FLAGS = {"error_feedback": "ef", "alpha": "merge_alpha"}


# Parameter types with no command-line flag (set from Python only).
_PYTHON_ONLY = (optax.GradientTransformation, dict, tuple)


class WithCodec(float):
  """A default that applies only when the strategy has a codec (MuLoCo's error
  feedback 0.9): without one it means None."""

  def __repr__(self):
    return f"{float(self)!r} with a codec"


def with_codec(value, codec, message=None):
  """``value``, or None when it is a ``WithCodec`` default and there is no
  codec or a custom message chain replaces the default one. A value given
  explicitly is kept (and then validated with the codec and chain)."""
  if isinstance(value, WithCodec):
    return None if codec is None or message is not None else float(value)
  return value


class Param(NamedTuple):
  """One parameter of a strategy factory.

  Attributes:
    name: the factory's keyword, e.g. ``"H"``.
    kind: ``int``, ``float``, ``str`` or ``Codec`` (given as a codec spec
      string on the command line).
    default: the factory's default.
    optional: whether None is allowed.
    help: one line for ``--help`` and the docs.
    flag: the command line's setting name (``ef`` for ``error_feedback``);
      None for Python-only parameters (an optax transformation).
    choices: the allowed strings, when there is a fixed set.
    cli_default: the command line's default, where it differs from the
      factory's (SPES's H, merge warm-up and interval, scaled to the
      embedded data).
  """

  name: str
  kind: type
  default: Any
  optional: bool
  help: str
  flag: str | None
  choices: tuple[str, ...] = ()
  cli_default: Any = None


class Spec(NamedTuple):
  """A strategy as data: the factory, its parameters and its papers'
  optimizers.

  Attributes:
    name: registry name.
    factory: the function that builds it (``inner=``, ``outer=`` and the
      parameters below as keywords).
    params: the factory's parameters other than ``inner`` and ``outer``.
    inner: the default inner optimizer.
    outer: the default outer optimizer, None for strategies without one.
    paper: the reference its defaults come from.
    summary: the factory's first docstring line.
    optimizers: further outer optimizers the factory takes as keywords
      (hierarchical DiLoCo's ``global_outer``) and their defaults; the
      command line sets each with ``--<name>-lr`` and ``--<name>-momentum``.
    model: the built-in language model the command line trains when none
      is named (SPES needs ``moe_gpt``); None: ``gpt``.
    where: where in the paper the defaults come from (sections, tables).
  """

  name: str
  factory: Callable
  params: tuple[Param, ...]
  inner: Optimizer
  outer: Optimizer | None
  paper: str
  summary: str
  optimizers: dict[str, Optimizer] = {}
  model: str | None = None
  where: str = ""


def _kind(annotation) -> tuple[type, bool]:
  """(type, optional) from ``int``, ``float | None``, ``Codec | str | None``."""
  args = (typing.get_args(annotation)
          if isinstance(annotation, types.UnionType) or
          typing.get_origin(annotation) is typing.Union else (annotation,))
  optional = type(None) in args
  args = tuple(a for a in args if a is not type(None))
  if Codec in args:
    return Codec, optional
  if len(args) == 1 and args[0] in _PYTHON_ONLY:
    return args[0], optional  # Python only
  if len(args) != 1 or args[0] not in (int, float, str, bool):
    raise TypeError(f"unsupported strategy parameter type {annotation!r}")
  return args[0], optional


def spec(factory: Callable, *, inner: Optimizer, outer: Optimizer | None,
         paper: str, help: dict[str, str],
         choices: dict[str, tuple[str, ...]] | None = None,
         optimizers: dict[str, Optimizer] | None = None,
         cli: dict[str, Any] | None = None,
         model: str | None = None, where: str = "") -> Spec:
  """The ``Spec`` of ``factory``, read from its signature.

  Every parameter besides ``inner``/``outer`` needs a help line, in ``help``
  or the shared ``HELP``; a parameter added to a factory without one fails
  here, at import.
  """
  choices = {**CHOICES, **(choices or {})}
  given, help = help, {**HELP, **help}
  params = []
  signature = inspect.signature(factory)
  for name, p in signature.parameters.items():
    if name in ("inner", "outer"):
      continue
    if name in (optimizers or {}):
      continue
    if name not in help:
      raise TypeError(f"{factory.__name__}: parameter {name!r} has no help")
    kind, optional = _kind(p.annotation)
    flag = None if kind in _PYTHON_ONLY else FLAGS.get(name, name)
    params.append(Param(name, kind, p.default, optional, help[name], flag,
                        tuple(choices.get(name, ())),
                        (cli or {}).get(name, p.default)))
  unknown = set(cli or {}) - {p.name for p in params}
  if unknown:
    raise TypeError(f"{factory.__name__}: cli default for unknown "
                    f"{sorted(unknown)}")
  extra = set(given) - {p.name for p in params}
  if extra:
    raise TypeError(f"{factory.__name__}: help for unknown {sorted(extra)}")
  has_outer = "outer" in signature.parameters
  if has_outer != (outer is not None):
    raise TypeError(f"{factory.__name__}: outer= and the outer default "
                    "must come together")
  missing = set(optimizers or {}) - set(signature.parameters)
  if missing:
    raise TypeError(f"{factory.__name__}: no parameter {sorted(missing)}")
  summary = (inspect.getdoc(factory) or "").split("\n")[0]
  return Spec(factory.__name__, factory, tuple(params), inner, outer, paper,
              summary, dict(optimizers or {}), model, where)


def _value(value) -> str:
  if value is None:
    return "none"
  if isinstance(value, WithCodec):
    return f"{float(value):g} (with a codec)"
  return f"`{value!r}`" if isinstance(value, str) else f"{value:g}" if \
      isinstance(value, float) else str(value)


def _outer(o: Optimizer) -> str:
  if o.kind != "sgd":
    return o.describe()
  kind = "Nesterov" if o.nesterov else "heavy-ball"
  return f"sgd, lr {o.lr:g}" + (f", {kind} momentum {o.momentum:g}"
                                if o.momentum else "")


def defaults_table(specs: dict[str, Spec]) -> str:
  """A markdown table of every strategy's defaults, for the docs (a test
  keeps docs/strategies/README.md equal to it)."""
  rows = ["| strategy | inner | outer | parameters | paper (where) |",
          "| --- | --- | --- | --- | --- |"]
  for name, s in specs.items():
    params = ", ".join(
        [f"`{name}` {_outer(o)}" for name, o in s.optimizers.items()] +
        [f"`{p.name}` {_value(p.default)}" + (
            f" (command line: {_value(p.cli_default)})"
            if p.cli_default != p.default else "") for p in s.params])
    outer = "" if s.outer is None else _outer(s.outer)
    paper = s.paper + (f" ({s.where})" if s.where else "")
    rows.append(f"| `{name}` | {s.inner.describe()} | {outer} | {params} | "
                f"{paper} |")
  return "\n".join(rows) + "\n"
