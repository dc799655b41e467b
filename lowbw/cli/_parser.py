"""The command line's parser: it knows its flags, and a bad flag value is a
structured error, not a sentence to re-read.

argparse checks a value with the option's ``type`` and ``choices`` and reports
a failure as text. Here every option's type and choices are wrapped, when the
option is added, into one check that raises ``FlagError`` (the flag, the
value, what is allowed); argparse chains it under the ``ArgumentError`` it
raises (``exit_on_error=False``), where ``main`` finds it. The options are
recorded as they are added (``Parser.flags``), from the Action objects that
``add_argument`` returns, so nothing reads argparse's private lists.
"""

import argparse
from typing import Any

from lowbw import _validate

_KIND = {int: "an integer", float: "a number"}


class FlagError(argparse.ArgumentTypeError):
  """A flag's value is not allowed: ``flag`` (``--inner-lr``), ``value`` (the
  text given) and ``allowed`` (a sentence)."""

  def __init__(self, flag: str, value: Any, allowed: str):
    self.flag, self.value, self.allowed = flag, value, allowed
    super().__init__(f"{flag}={value!r} is invalid: {allowed}")


def long_name(action: argparse.Action) -> str:
  """The option's long form (``--inner-lr``)."""
  longs = [o for o in action.option_strings if o.startswith("--")]
  return (longs or action.option_strings)[0]


def checked(flag: str, convert, choices) -> Any:
  """``convert`` (a type function) and a choices check, failing with a
  ``FlagError`` (config files read the original type, kept in
  ``Parser.types``)."""

  def check(text):
    try:
      value = text if convert is None else convert(text)
    except _validate.ConfigError as e:
      raise FlagError(flag, text, e.allowed) from None
    except FlagError:
      raise
    except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
      allowed = (f"expected {_KIND[convert]}" if convert in _KIND
                 else str(e))
      raise FlagError(flag, text, allowed) from None
    if choices is not None and value not in choices:
      raise FlagError(flag, text, "expected one of " + ", ".join(
          map(repr, choices)) + _validate.suggest(value, choices))
    return value

  return check


class _Group:
  """An argument group that records the options added to it."""

  def __init__(self, group, record):
    self._group, self._record = group, record

  def add_argument(self, *args, **kwargs):
    return self._record(self._group.add_argument(*args, **kwargs))

  def __getattr__(self, name):
    return getattr(self._group, name)


class Parser(argparse.ArgumentParser):
  """Usage errors as one line, not a usage block; every option's value
  checked into a ``FlagError``; ``flags``: dest -> long option name."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("exit_on_error", False)
    # No prefix matching: another tool's --device must not become
    # --devices (its value then judged as a device count).
    kwargs.setdefault("allow_abbrev", False)
    super().__init__(*args, **kwargs)
    self.flags: dict[str, str] = {}
    self.types: dict[str, Any] = {}

  def add_argument(self, *args, **kwargs):
    return self._record(super().add_argument(*args, **kwargs))

  def add_argument_group(self, *args, **kwargs):
    return _Group(super().add_argument_group(*args, **kwargs), self._record)

  def add_mutually_exclusive_group(self, **kwargs):
    return _Group(super().add_mutually_exclusive_group(**kwargs),
                  self._record)

  def _record(self, action: argparse.Action) -> argparse.Action:
    if isinstance(action.help, str) and "%(" not in action.help:
      # argparse %-formats every help text: a plain "0.05%" would crash
      # --help. Texts that use %(default)s escape their own.
      action.help = action.help.replace("%", "%%")
    if not action.option_strings or action.dest == "help":
      return action
    flag = long_name(action)
    self.flags[action.dest] = flag
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
      self.types[action.dest] = bool
      return action
    self.types[action.dest] = action.type or str
    if action.choices is not None and action.metavar is None:
      action.metavar = "{" + ",".join(map(str, action.choices)) + "}"
    action.type = checked(flag, action.type, action.choices)
    action.choices = None
    return action

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def flag_error(error: argparse.ArgumentError) -> str:
  """One line for an argparse error: the ``FlagError`` behind it, or
  argparse's own words (a missing value) prefixed with the flag."""
  cause = error.__context__
  while cause is not None and not isinstance(cause, FlagError):
    cause = cause.__context__
  if cause is not None:
    return str(cause)
  flag = error.argument_name
  if flag and error.message.startswith("expected"):  # a value is missing
    return (f"{flag} is invalid: {error.message}; a value that starts with "
            f"'-' is written {flag}=-VALUE")
  return str(error)


def settings(field: str, example: str, numbers: bool = False):
  """An argparse type: ``name=value`` pairs, comma-separated, as a dict
  (``--predict params=1e9,tokens=2e10``, ``--candidate strategy=diloco,
  H=50``); a value is an int or a float where it reads as one (with
  ``numbers``, it must); an error names ``field`` and shows ``example``."""

  def parse(text: str) -> dict:
    out = {}
    for part in text.split(","):
      name, sep, value = (w.strip() for w in part.partition("="))
      number = _number(value)
      if not sep or not name or not value or (numbers and number is None):
        kind = "number" if numbers else "value"
        raise _validate.fail(field, text, f"expected name={kind} pairs, "
                             f"comma-separated ({example})")
      out[name] = value if number is None else number
    return out

  return parse


def _number(text: str):
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      continue
  return None
