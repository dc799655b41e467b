"""Config files of the command line: YAML, TOML or JSON tables of option
names, the format told by the file's extension."""

import json
import os
import re
import tomllib
from collections.abc import Iterable

import yaml

from lowbw import _validate


def _yaml(text: bytes):
  # Safe loading: plain values only. YAML 1.1 reads "1e-3" as a string; a
  # number spelled so is meant as one.
  values = yaml.safe_load(text)
  if isinstance(values, dict):
    values = {k: _yaml_number(v) for k, v in values.items()}
  return values


_EXPONENT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def _yaml_number(value):
  return (float(value) if isinstance(value, str) and _EXPONENT.fullmatch(value)
          else value)


# Extension -> (format's name, reader of the file's bytes).
FORMATS = {".yaml": ("YAML", _yaml), ".yml": ("YAML", _yaml),
           ".toml": ("TOML", lambda text: tomllib.loads(text.decode())),
           ".json": ("JSON", json.loads)}


def read_config(path: str, allowed: Iterable[str]) -> dict:
  """The options in ``path`` (keys with '-' or '_'), each one of ``allowed``."""
  if not os.path.isfile(path):
    raise _validate.fail("config", path, "no such file")
  ext = os.path.splitext(path)[1].lower()
  if ext not in FORMATS:
    raise _validate.fail("config", path, "expected a file ending in " +
                         ", ".join(FORMATS) + " (YAML, TOML or JSON)")
  kind, read = FORMATS[ext]
  with open(path, "rb") as f:
    text = f.read()
  try:
    values = read(text)
  except (ValueError, tomllib.TOMLDecodeError, yaml.YAMLError) as e:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise _validate.fail("config", path, f"not valid {kind} ({first})"
                         ) from None
  if not isinstance(values, dict):
    raise _validate.fail("config", path, "expected a table of options")
  values = {str(k).replace("-", "_"): v for k, v in values.items()}
  allowed = list(allowed)
  unknown = sorted(set(values) - set(allowed))
  if unknown:
    hints = "".join(_validate.suggest(k, allowed) for k in unknown[:1])
    raise _validate.fail("config", path, f"unknown keys {unknown}{hints}; "
                         f"allowed: {', '.join(sorted(allowed))}")
  return values


_KINDS = {int: "an integer", float: "a number", str: "a string",
          bool: "true or false", (int, str): "an integer or a string",
          (str,): "a string"}


def flag_types(add_flags) -> dict[str, type]:
  """``dest -> type`` of the options ``add_flags(parser)`` defines (str for
  untyped options, bool for on/off switches, or the type function, whose
  ``config_types`` say what a config file may give)."""
  from lowbw.cli._parser import Parser
  parser = Parser(add_help=False)
  add_flags(parser)
  return parser.types


def quantity(parse, field: str):
  """An argparse type for a setting with units ("50ms", "100Mbps"): the
  text, checked by ``parse(text, field)`` (which names the accepted forms);
  a config file gives it as a string too, never a bare number."""

  def check(text):
    parse(text, field)  # a ConfigError names what is accepted
    return text

  check.config_types = (str,)
  check.parse = parse
  return check


def check_types(values: dict, types: dict[str, type], path: str) -> dict:
  """Each value of a config file has its option's type (an int is a valid
  float); anything else is a one-line error naming the key. A table or a
  list where a single value belongs is an error too."""
  for key, value in values.items():
    want = types.get(key)
    if value is None:
      continue
    if isinstance(value, (dict, list)):
      raise _validate.fail(key, value, "expected a single value, not a "
                           f"{'table' if isinstance(value, dict) else 'list'}"
                           f" (in config file {path})")
    if want is None:
      continue
    kinds = getattr(want, "config_types", want)
    ok = isinstance(value, kinds) and not (kinds is not bool and
                                           isinstance(value, bool))
    if kinds is float:
      ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hasattr(want, "parse"):  # a bare number: the forms with units
      try:
        want.parse(value if ok else str(value), key)
      except _validate.ConfigError as e:
        raise _validate.fail(key, e.value, f"{e.allowed} (in config file "
                             f"{path})") from None
    if not ok:
      raise _validate.fail(key, value, f"expected {_KINDS.get(kinds, kinds)} "
                           f"(in config file {path})")
  return values
