"""``lowbw.Config``: a whole run as one frozen, validated value.

Its fields are the table in ``_fields`` plus the strategies' parameters
(``_strategy_fields``); each carries its help, default and kind. A ``Config``
remembers which fields were given: the others take their defaults, which for
strategy parameters and optimizers are the chosen strategy's (its papers'),
so ``config.replace(strategy="sparta")`` takes SPARTA's defaults, not the
previous strategy's.
"""

import dataclasses
import json
import os
from typing import Any, NamedTuple

import yaml

from lowbw import _validate
from lowbw import data as data_lib
from lowbw import models as models_lib
from lowbw import network as network_lib
from lowbw import strategies as strategies_lib
from lowbw import transforms
from lowbw.config import _fields, _files, _lanes, _paths, _resolve, _settings
from lowbw.config import _strategy_fields as strategy_fields
from lowbw.telemetry import _cost

# Earlier spellings of some settings -> the setting's one name: refused,
# with the name to use.
RENAMED = {"num_workers": "workers", "log_dir": "out",
           "error_feedback": "ef"}
GROUPS = {
    "strategy": "defaults are each strategy's paper's (see "
                "docs/strategies/)",
    "compression": "codec specs chain stages with commas: " + ", ".join(
        transforms.codec_forms()) + "; e.g. topk:0.1,quant:4",
    "optimizers": None,
    "model and data": None,
    "network (the simulated clock, sim_time_s)":
        "per step: the slowest participating worker's compute, plus the "
        "collective's time on the links (latency per message hop + bytes / "
        "bandwidth); see docs/network.md",
    "run": None, "compute": None, "devices and hosts": None,
}
# Fields that take a user object (a Model, a DataSource, a Strategy) as
# well as a name; such a config runs but cannot be written to a file.
OBJECT_FIELDS = ("model", "data", "strategy", "network", "shadow",
                 "network_profile")


def _check_part(name: str, value) -> None:
  """A data source or a model given as an object is one (said when the
  config is made, not when the run reads it)."""
  if name == "data" and not isinstance(value, data_lib.DataSource):
    raise _validate.fail("data", value, "expected a lowbw.data.DataSource "
                         "or a name (digits, text, a path)")
  if name == "model":
    models_lib.as_model(value)  # its error names what a model may be


def _is_pair(field: _fields.Field, value) -> bool:
  """A model given as an ``(init, loss)`` pair of functions."""
  return (field.name == "model" and isinstance(value, tuple) and
          len(value) == 2 and all(map(callable, value)))


def _all_fields() -> dict[str, _fields.Field]:
  own = strategy_fields.fields()
  # A strategy parameter that is also a network setting (hierarchical
  # DiLoCo's group_size, the hierarchical topology's regions) is one field.
  taken = {f.name for f in own}
  fields = [*own, *(f for f in _fields.RUN_FIELDS if f.name not in taken)]
  order = list(GROUPS)
  fields.sort(key=lambda f: (order.index(f.group),
                             f.name not in ("strategy", "workers")))
  return {f.name: f for f in fields}


FIELDS = _all_fields()
# Every setting's path in the run's parts -> its flat name (``_paths``).
PATHS = _paths.paths(FIELDS)
_UNSET = object()


def _item(field: _fields.Field, value) -> str:
  """One value of a comma-separated setting as its text."""
  if isinstance(value, str):
    return value.strip()
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return repr(value)  # a quantity's parser asks for its unit
  raise _validate.fail(field.name, value, "expected a number or a string "
                       "in the list")


def natural(field: _fields.Field, value):
  """``value`` in the form the field keeps, from the natural Python or YAML
  value: a list or tuple for a comma-separated setting (``hidden=(64, 64)``
  -> ``"64,64"``), a bare number for a comma-separated text setting
  (``hidden: 32`` -> ``"32"``). A bare number for a setting with units
  (``latency: 50``: seconds or milliseconds?) is ambiguous and is left to
  the type check, which asks for the unit. Other values are returned as
  they are."""
  if field.many and isinstance(value, (list, tuple)):
    if not value:
      raise _validate.fail(field.name, list(value), "expected at least one "
                           "value")
    return ",".join(_item(field, v) for v in value)
  if (field.many and field.type is str and isinstance(value, (int, float))
      and not isinstance(value, bool)):
    return _item(field, value)
  return value


def _check_type(field: _fields.Field, value):
  """``value`` if it has the field's type (an int is a valid float; a
  quantity is checked by its parser); else a ConfigError naming it."""
  if field.python and value is None:
    raise _validate.fail(field.name, value, "leave it out for the network "
                         "the settings describe, or give clock=False to run "
                         "without the simulated clock")
  if field.python and type(value) in (str, dict, list, tuple, bool):
    raise _validate.fail(field.name, value, "expected a Python object: "
                         + field.help + "; a file or the command line gives "
                         "those settings instead")
  if field.name in ("inner", "outer") and not isinstance(value, str) and (
      value is not None):
    raise _validate.fail(field.name, type(value).__name__, "expected an "
                         "optimizer's name (adamw, sgd, ...); for an optax "
                         "optimizer give it to the strategy: strategy="
                         f"lowbw.strategies.diloco({field.name}=...)")
  if field.name == _lanes.FIELD and value is not None:
    return list(_lanes.names(value))  # a list: a file writes it as one
  if field.name in ("data", "model") and value is not None and not (
      isinstance(value, (str, dict, list)) or (
          type(value) is tuple and not _is_pair(field, value))):
    _check_part(field.name, value)
  if value is None or (field.name in OBJECT_FIELDS and (
      type(value) not in (str, dict, list, tuple) or _is_pair(field, value)
      or field.check is not None)):  # its rule says what it takes
    return value  # a model, dataset, strategy or optimizer as an object
  kinds = getattr(field.type, "config_types", ())
  if isinstance(value, dict) and dict in kinds:  # a table of terms
    field.type.parse(value, field.name)
    return value
  value = natural(field, value)
  if isinstance(value, (dict, list, tuple)):
    raise _validate.fail(field.name, value, "expected a single value, not a "
                         + ("table" if isinstance(value, dict) else "list"))
  want = field.type
  kinds = getattr(want, "config_types", want)
  ok = isinstance(value, kinds) and not (kinds is not bool and
                                         isinstance(value, bool))
  if kinds is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if hasattr(want, "parse"):  # a bare number: the forms with units
    want.parse(value if ok else str(value), field.name)
  if not ok:
    raise _validate.fail(field.name, value,
                         f"expected {_files.KINDS.get(kinds, kinds)}")
  if field.name == "strategy":
    strategies_lib.spec(value)  # names the registered strategies
  if field.choices and value not in field.choices:
    raise _validate.fail(field.name, value, "expected one of " + ", ".join(
        map(str, field.choices)) + _validate.suggest(value, field.choices))
  return float(value) if kinds is float else value


def check_value(name: str, value):
  """``value`` checked against the type and choices of setting ``name``."""
  return _check_type(FIELDS[canonical(name)], value)


def _parts(word: str) -> str:
  """" (did you mean 'inner_lr' or 'outer_lr'?)": settings with ``word``
  as one of their parts."""
  parts = [p for p in word.split("_") if p]
  close = sorted((n for n in FIELDS if parts and
                  all(p in n.split("_") for p in parts)), key=len)[:3]
  return (" (did you mean " + " or ".join(map(repr, close)) + "?)"
          if close else "")


def canonical(name: str) -> str:
  """A setting's name from a key of a file, a grid or a keyword ('-' or
  '_'); a ConfigError if unknown. A setting has one name: the keyword
  earlier spellings (``num_workers``, ``log_dir``, ``error_feedback``) are
  refused with the name to use."""
  key = str(name).replace("-", "_")
  if "." in key:  # a path: strategy.H, strategy.outer.lr, network.latency
    if key in PATHS:
      return PATHS[key]
    raise _validate.fail("config", name, "not a setting's path" +
                         _validate.suggest(key, list(PATHS)) +
                         "; paths are the parts' settings: strategy.H, "
                         "strategy.outer.lr, network.bandwidth, model.layers")
  if key in RENAMED:
    raise _validate.fail("config", name, f"lowbw.simulate, a Config, a "
                         f"config file and the command line call it "
                         f"{RENAMED[key]!r} (did you mean {RENAMED[key]!r}?)")
  if key not in FIELDS:
    close = _validate.suggest(key, list(FIELDS)) or _parts(key)
    raise _validate.fail("config", name, "not a setting" + close +
                         "; see lowbw.Config.help() or lowbw train --help")
  return key


def read_settings(path: str) -> dict:
  """The settings of a YAML, TOML or JSON file by their flat names: keys
  with '-' or '_', paths (``strategy.H``) and nested tables of parts
  (``strategy: {name: diloco, H: 50}``); an old spelling gets
  ``canonical``'s "did you mean", a setting given twice is refused."""
  values = _files.read_config(path, [*FIELDS, *RENAMED, *PATHS,
                                     *_paths.PARTS], shown=FIELDS)
  out = {}
  for key, value in _paths.flatten(values).items():
    name = canonical(key)
    if name in out:
      raise _validate.fail("config", path, f"{name} is given twice (as "
                           f"{key!r} too)")
    out[name] = value
  return out


class _ConfigBase:
  """The methods of ``Config`` (its fields are made from ``FIELDS``)."""

  def __init__(self, **values):
    given = {}
    for name, value in _paths.flatten(values).items():
      key = canonical(name)
      if key in given:
        raise _validate.fail(name, value, f"{key} is given twice")
      given[key] = _check_type(FIELDS[key], value)
    resolved, built = resolve(given)
    # The lanes (``_lanes``): configs of their own, resolved the same way.
    built = built._replace(lanes=_lanes.configs(type(self), given,
                                                resolved, built))
    for name in FIELDS:
      object.__setattr__(self, name, resolved[name])
    object.__setattr__(self, "given", frozenset(given))
    # What validating the config built: the run reuses it (one strategy,
    # one network and one check of the settings per run).
    object.__setattr__(self, "_built", built)

  def __reduce__(self):
    # Pickled (a study's process pool) as its settings: what it built holds
    # functions, and is built again where it is loaded.
    return (_restore, (type(self), self.values()))

  def __repr__(self):
    shown = ", ".join(f"{k}={_show(v)}" for k, v in self.to_dict().items()
                      if k in self.given)
    return f"lowbw.Config({shown})"

  def __eq__(self, other):
    return (isinstance(other, _ConfigBase) and
            self.to_dict() == other.to_dict())

  def __hash__(self):
    return hash(json.dumps(self.to_dict(), sort_keys=True, default=id))

  def built(self) -> "Built":
    """What validating the config built: its strategy and its build settings
    as ``check_settings`` returned them (the network among them). A run of
    the config uses these: the strategy and the network are built once."""
    return self._built

  def values(self) -> dict[str, Any]:
    """The fields given explicitly (what ``replace`` starts from)."""
    return {name: getattr(self, name) for name in FIELDS
            if name in self.given}

  def replace(self, **changes) -> "Config":
    """A new config with ``changes``; defaults follow the new choices. A
    change of run settings only (``out``, ``seed``, ``progress``, ...)
    keeps what was built: the strategy and the network do not change."""
    keys = {canonical(name): value for name, value in changes.items()}
    if keys and all(FIELDS[k].kind == _fields.RUN for k in keys) and (
        len(keys) == len(changes)):
      return self._with_run(keys)
    return type(self)(**{**self.values(), **changes})

  def _with_run(self, changes: dict) -> "Config":
    """A copy with run settings ``changes``, checked as ``resolve`` does."""
    new = object.__new__(type(self))
    new.__dict__.update(self.__dict__)
    for name, value in changes.items():
      object.__setattr__(new, name, _check_type(FIELDS[name], value))
    object.__setattr__(new, "given", self.given | set(changes))
    _check_run_settings({n: getattr(new, n) for n in FIELDS},
                        self._built.strategy)
    return new

  def without(self, *names: str) -> "Config":
    """A new config with ``names`` back to their defaults (a strategy's
    parameters to the strategy's own)."""
    drop = {canonical(n) for n in names}
    return type(self)(**{k: v for k, v in self.values().items()
                         if k not in drop})

  def to_dict(self) -> dict[str, Any]:
    """Every setting the run reads, resolved (defaults filled in)."""
    s = {name: getattr(self, name) for name in FIELDS}
    used = _resolve.used(s)
    return {name: value for name, value in s.items() if name in used}

  def to_yaml(self) -> str:
    """The resolved settings as YAML; ``Config.load`` reads it back."""
    values = self.to_dict()
    # A profile object or file is written as its terms: the file stands
    # alone, wherever the profile's own file goes.
    profile = values.get("network_profile")
    if profile is not None and not (isinstance(profile, str)
                                    and profile in network_lib.PROFILES):
      values["network_profile"] = network_lib.profile(profile).describe()
    for name in OBJECT_FIELDS:
      if not isinstance(values.get(name), (str, dict, type(None))):
        raise _validate.fail(name, type(values[name]).__name__,
                             "a Python object cannot be written to a file; "
                             "give a registry name (for the network, its "
                             "settings) to save the config")
    return yaml.safe_dump(values, sort_keys=False, allow_unicode=True)

  def save(self, path: str) -> str:
    """Writes ``to_yaml()`` to ``path`` (atomically); returns the path."""
    text = self.to_yaml()
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
    return path

  @classmethod
  def load(cls, path: str, **changes) -> "Config":
    """A config from a YAML, TOML or JSON file (by extension), with
    ``changes`` on top."""
    values = read_settings(path)
    try:
      return cls(**{**values, **changes})
    except _validate.ConfigError as e:
      if e.field in values and e.field not in changes:
        raise _validate.fail(e.field, e.value, f"{e.allowed} (in config "
                             f"file {path})") from None
      raise

  @staticmethod
  def help() -> str:
    """Every field: name, default, kind and help."""
    return "\n".join(
        f"{f.name} = {f.default!r} [{f.kind}] {f.help}"
        for f in FIELDS.values())


def _restore(cls, values: dict):
  return cls(**values)


def _show(value) -> str:
  return repr(value) if isinstance(value, (str, int, float, type(None))) \
      else type(value).__name__


def resolve(given: dict) -> dict:
  """Every field's value: the given ones, the strategy's defaults for its
  parameters, the table's for the rest; checks that every given setting is
  used and that the strategy and the network can be made."""
  s = {name: f.default for name, f in FIELDS.items()}
  s.update(given)
  if isinstance(s["strategy"], str):
    s = strategy_fields.fill(s, set(given))
  _resolve.check_used(s, set(given))
  strategy = _resolve.build_strategy(s)
  if s["eval_every"] is None:
    s["eval_every"] = _resolve.default_eval_every(
        strategy.period, s["steps"] if isinstance(s["steps"], int) else None)
  if s["model"] is None:
    s["model"] = _resolve.model_name(s)
  for model, sizes in (("mlp", "hidden"), ("cnn", "channels")):
    if s["model"] == model:  # said now, not when the data is loaded
      _resolve.ints(sizes, s[sizes])
  built = Built(strategy, _check_build(s, strategy))
  _check_run_settings(s, strategy)
  return s, built


class Built(NamedTuple):
  """What validating a config builds, kept for its run: the strategy, the
  build settings as ``check_settings`` returned them (the network among
  them), and the counterfactual lanes as ``(name, Config, reset
  settings)`` (``_lanes.configs``)."""

  strategy: Any
  checked: dict
  lanes: tuple = ()


def _check_build(s: dict, strategy) -> dict:
  """What the build will check without data or a model: sizes against the
  strategy's period, the network, precision; the checked settings."""
  given = {f.name: s[f.name] for f in _settings.BUILD_FIELDS}
  if given["network"] is None and s["clock"]:
    given["network"] = _resolve.build_network(s)
  return _settings.check_settings(strategy, **given)


def _check_run_settings(s: dict, strategy) -> None:
  """The run settings' checks: the seed, checkpoints at syncs, and the
  prices (a GPU price needs the clock)."""
  _settings.check_seed(s["seed"])
  _cost.check_prices(s["gpu_price"], s["egress_price"],
                     clock=s["network"] is not None or s["clock"])
  _settings.multiple_of_period("checkpoint_every", s["checkpoint_every"],
                                strategy.period)
  if s["checkpoint_every"] and s["out"] is None:
    raise _validate.fail("checkpoint_every", s["checkpoint_every"],
                         "needs a log folder, out (checkpoints go to "
                         "out/checkpoints)")


Config = dataclasses.make_dataclass(
    "Config", [(name, Any, dataclasses.field(
        default=_UNSET, metadata={"field": f})) for name, f in FIELDS.items()],
    bases=(_ConfigBase,), init=False, repr=False, eq=False, frozen=True)
Config.__module__ = "lowbw"
Config.__doc__ = """A whole run: model, data, strategy and its parameters,
workers, batch, steps, network, faults, precision and logging, validated on
construction.

Every field has a default (the papers'; a strategy's parameters default to
its own, see ``lowbw.strategies.spec``) and a kind: ``shape`` (a new value
needs a new compiled program), ``traced`` (a value of the compiled program,
changed without compiling) or ``run`` (the seed, the log folder).
``Config.help()`` lists them; ``lowbw train --help`` shows the same as flags.

Example:
  >>> config = lowbw.Config(strategy="diloco", H=50, data="digits",
  ...                       workers=8, steps=200)
  >>> config.replace(strategy="sparta", p=0.005).to_yaml()
  >>> lowbw.simulate(config)
"""
