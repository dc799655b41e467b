"""Config files: YAML, TOML or JSON tables of settings, the format told by
the file's extension."""

import json
import os
import re
import tomllib
from collections.abc import Iterable

import yaml

from lowbw import _validate


class _UniqueKeys(yaml.SafeLoader):
  """Safe loading (plain values only) that refuses a key given twice in one
  table, which PyYAML would resolve silently to the last."""

  def construct_mapping(self, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
      key = self.construct_object(key_node, deep=True)
      if key in seen:
        raise yaml.constructor.ConstructorError(
            None, None, f"key {key!r} is given twice", key_node.start_mark)
      seen.add(key)
    return super().construct_mapping(node, deep)


def _yaml(text: bytes):
  # YAML 1.1 reads "1e-3" as a string; a number spelled so is meant as one.
  values = yaml.load(text, Loader=_UniqueKeys)
  if isinstance(values, dict):
    values = {k: _yaml_number(v) for k, v in values.items()}
  return values


_EXPONENT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+")


def _yaml_number(value):
  return (float(value) if isinstance(value, str) and _EXPONENT.fullmatch(value)
          else value)


def _unique(pairs: list) -> dict:
  """A JSON object, refusing a key given twice (json keeps the last)."""
  out = {}
  for key, value in pairs:
    if key in out:
      raise ValueError(f"key {key!r} is given twice")
    out[key] = value
  return out


# Extension -> (format's name, reader of the file's bytes). TOML itself
# refuses a key given twice.
FORMATS = {".yaml": ("YAML", _yaml), ".yml": ("YAML", _yaml),
           ".toml": ("TOML", lambda text: tomllib.loads(text.decode())),
           ".json": ("JSON", lambda text: json.loads(
               text, object_pairs_hook=_unique))}


def read_file(path: str, field: str = "config"):
  """What a YAML, TOML or JSON file holds (the format by extension); errors
  name ``field``."""
  _validate.existing_file(field, path, "a YAML, TOML or JSON file")
  ext = os.path.splitext(path)[1].lower()
  if ext not in FORMATS:
    raise _validate.fail(field, path, "expected a file ending in " +
                         ", ".join(FORMATS) + " (YAML, TOML or JSON)")
  kind, read = FORMATS[ext]
  with open(path, "rb") as f:
    text = f.read()
  try:
    values = read(text)
  except RecursionError:  # the readers recurse once per level
    raise _too_deep(field, path) from None
  except (ValueError, tomllib.TOMLDecodeError, yaml.YAMLError) as e:
    first = (getattr(e, "problem", None) or str(e).splitlines()[0]
             if str(e) else type(e).__name__)
    raise _validate.fail(field, path, f"not valid {kind} ({first})"
                         ) from None
  too = _oversized(values, MAX_DEPTH, MAX_VALUES)
  if too == "deep":
    raise _too_deep(field, path)
  if too == "large":
    raise _validate.fail(field, path, f"holds more than {MAX_VALUES:,} "
                         "values (a YAML alias repeated inside aliases "
                         "multiplies them); settings are values, lists of "
                         "values or small tables")
  return values


# Settings are values, lists of values or small tables. Deeper values would
# overflow Python's recursion in what reads them next (checks, messages,
# the written config), and a YAML alias can even nest a list in itself.
MAX_DEPTH = 32
# YAML aliases share one node however often they are used, so nine lines of
# aliases of aliases ("billion laughs") read fast but stand for 9^9 values,
# which any walk over the settings (checks, messages, the written config)
# would take hours to visit.
MAX_VALUES = 100_000


def _too_deep(field: str, path: str) -> ValueError:
  return _validate.fail(field, path, f"nests lists or tables more than "
                        f"{MAX_DEPTH} levels deep; settings are values, "
                        "lists of values or small tables")


def _oversized(value, max_depth: int, max_values: int) -> str | None:
  """"deep" when ``value`` nests lists or tables more than ``max_depth``
  levels, "large" when it holds more than ``max_values`` values (a shared,
  aliased list counted each time it appears), else None. A depth-first walk
  with a stack, not recursion, that stops at either limit: a self-containing
  list is "deep", aliases of aliases are "large"."""
  stack, seen = [(value, 0)], 0
  while stack:
    value, level = stack.pop()
    seen += 1
    if seen > max_values:
      return "large"
    if isinstance(value, dict):
      value = list(value.values())
    if isinstance(value, list):
      if level >= max_depth:
        return "deep"
      stack.extend((v, level + 1) for v in value)
  return None


def read_config(path: str, allowed: Iterable[str],
                shown: Iterable[str] | None = None) -> dict:
  """The options in ``path`` (keys with '-' or '_'), each one of ``allowed``;
  an unknown key's error suggests and lists ``shown`` (default: allowed)."""
  values = read_file(path)
  if not isinstance(values, dict):
    raise _validate.fail("config", path, "expected a table of options")
  if not values:
    raise _validate.fail("config", path, "holds no options; give at least "
                         "one, or leave out --config for the defaults")
  spelled: dict[str, str] = {}
  for key in values:
    name = str(key).replace("-", "_")
    if name in spelled:  # inner-lr and inner_lr are one setting
      raise _validate.fail("config", path, f"{spelled[name]!r} and {key!r} "
                           "are the same setting, given twice")
    spelled[name] = str(key)
  values = {str(k).replace("-", "_"): v for k, v in values.items()}
  allowed = list(allowed)
  shown = allowed if shown is None else list(shown)
  unknown = sorted(set(values) - set(allowed))
  if unknown:
    hints = "".join(_validate.suggest(k, shown) for k in unknown[:1])
    raise _validate.fail("config", path, f"unknown keys {unknown}{hints}; "
                         f"allowed: {', '.join(sorted(shown))}")
  return values


KINDS = {int: "an integer", float: "a number", str: "a string",
         bool: "true or false", (int, str): "an integer or a string",
         (str,): "a string", (int, float, str): "a number or a string"}
