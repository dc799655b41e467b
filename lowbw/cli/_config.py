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
