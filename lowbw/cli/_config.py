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
          bool: "true or false", (int, str): "an integer or a string",
          (str,): "a string"}


def flag_types(add_flags) -> dict[str, type]:
  """``dest -> type`` of the options ``add_flags(parser)`` defines (str for
  untyped options, bool for on/off switches, or the type function, whose
  ``config_types`` say what a config file may give)."""
  import argparse
  parser = argparse.ArgumentParser(add_help=False)
  add_flags(parser)
  types = {}
  for action in parser._actions:
    if isinstance(action, argparse.BooleanOptionalAction):
      types[action.dest] = bool
    elif action.option_strings:
      types[action.dest] = action.type or str
  return types


def quantity(parse, field: str):
  """An argparse type for a setting with units ("50ms", "100Mbps"): the
  text, checked by ``parse(text, field)`` (which names the accepted forms);
  a config file gives it as a string too, never a bare number."""
  import argparse

  def check(text):
    try:
      parse(text, field)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None
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
      except ValueError as e:
        raise ValueError(f"{e} (in config file {path})") from None
    if not ok:
      raise _validate.fail(key, value, f"expected {_KINDS.get(kinds, kinds)} "
                           f"(in config file {path})")
  return values
