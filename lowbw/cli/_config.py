"""Config files of the command line: TOML or JSON tables of option names."""

import json
import os
import tomllib
from collections.abc import Iterable

from lowbw import _validate


def read_config(path: str, allowed: Iterable[str]) -> dict:
  """The options in ``path`` (keys with '-' or '_'), each one of ``allowed``."""
  if not os.path.isfile(path):
    raise _validate.fail("config", path, "no such file")
  with open(path, "rb") as f:
    text = f.read()
  try:
    values = (json.loads(text) if path.endswith(".json")
              else tomllib.loads(text.decode()))
  except (ValueError, tomllib.TOMLDecodeError) as e:
    raise _validate.fail("config", path, f"not valid TOML/JSON ({e})") from e
  if not isinstance(values, dict):
    raise _validate.fail("config", path, "expected a table of options")
  values = {k.replace("-", "_"): v for k, v in values.items()}
  allowed = list(allowed)
  unknown = sorted(set(values) - set(allowed))
  if unknown:
    raise _validate.fail("config", path, f"unknown keys {unknown}; allowed: "
                         f"{', '.join(sorted(allowed))}")
  return values


_KINDS = {int: "an integer", float: "a number", str: "a string",
          bool: "true or false", (int, str): "an integer or a string"}


def flag_types(add_flags) -> dict[str, type]:
  """``dest -> type`` of the options ``add_flags(parser)`` defines (str for
  untyped options, bool for on/off switches, a type function's
  ``config_types`` where it has them)."""
  import argparse
  parser = argparse.ArgumentParser(add_help=False)
  add_flags(parser)
  types = {}
  for action in parser._actions:
    if isinstance(action, argparse.BooleanOptionalAction):
      types[action.dest] = bool
    elif action.option_strings:
      types[action.dest] = (getattr(action.type, "config_types", None)
                            or action.type or str)
  return types


def check_types(values: dict, types: dict[str, type], path: str) -> dict:
  """Each value of a config file has its option's type (an int is a valid
  float); anything else is a one-line error naming the key."""
  for key, value in values.items():
    want = types.get(key)
    if want is None or value is None:
      continue
    ok = isinstance(value, want) and not (want is not bool and
                                          isinstance(value, bool))
    if want is float:
      ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
      raise _validate.fail(key, value, f"expected {_KINDS.get(want, want)} "
                           f"(in config file {path})")
  return values
