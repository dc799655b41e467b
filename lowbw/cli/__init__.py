"""The ``lowbw`` command line: the only layer that prints."""

import argparse
import os
import re
import sys
import warnings

from lowbw.cli import _bench, _plan, _plot, _sweep, _train

# API field names whose command-line flag has another name.
_FLAGS = {"num_workers": "workers", "resume_from": "resume", "log_dir": "out",
          "error_feedback": "ef", "fraction": "keep_fraction"}


class _Parser(argparse.ArgumentParser):
  """Usage errors as one line, not a usage block; a bad value of a flag in
  the same words as every other error (``--flag=value is invalid: ...``)."""

  def error(self, message):
    value = _flag_value_error(message)
    if value:
      self.exit(2, f"lowbw: error: {value}\n")
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _flag_value_error(message: str) -> str | None:
  """argparse's "argument --x: invalid choice: 'v' (choose from ...)" and a
  type function's "argument --x: x='v' is invalid: ..." as one sentence."""
  match = re.fullmatch(r"argument (--[\w-]+): invalid choice: (.*) "
                       r"\(choose from (.*)\)", message)
  if match:
    flag, value, choices = match.groups()
    return f"{flag}={value} is invalid: expected one of {choices}"
  match = re.fullmatch(r"argument (--[\w-]+): \w+=(.* is invalid: .*)",
                       message)
  return f"{match.group(1)}={match.group(2)}" if match else None


def _one_line(error: Exception) -> str:
  """The error's first line, with the API field renamed to its flag."""
  text = str(error).splitlines()[0] if str(error) else type(error).__name__
  match = re.match(r"(\w+)=", text)
  if match:
    name = _FLAGS.get(match.group(1), match.group(1))
    if (name in _train.setting_names() or name in ("resume", "config", "x", "y", "coordinator",
                                        "num_processes", "process_id",
                                        "rounds", "repeats", "warmup",
                                        "grid", "seeds", "points_per_batch")
        or name in _plan.FLAG_NAMES):
      text = "--" + name.replace("_", "-") + text[len(match.group(1)):]
  return text


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(
      prog="lowbw",
      description="Simulate low-bandwidth distributed training on one machine.")
  from lowbw import __version__
  parser.add_argument("--version", action="version",
                      version=f"lowbw {__version__}")
  sub = parser.add_subparsers(title="commands", metavar="COMMAND",
                              parser_class=_Parser)
  _train.add_parser(sub)
  _sweep.add_parser(sub)
  _bench.add_parser(sub)
  _plan.add_parser(sub)
  _plot.add_parser(sub)
  for name in ("train", "sweep", "bench"):
    sub.choices[name].add_argument(
        "--no-compile-cache", action="store_true",
        help="do not use the persistent compilation cache (default: on, in "
        "$LOWBW_COMPILE_CACHE or ~/.cache/lowbw/xla)")
  return parser


def main(argv=None) -> int:
  """Entry point; errors are one line on stderr and a non-zero exit code."""
  from lowbw.simulation import NonFiniteLossError

  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # --help, --version, or a usage error (printed)
    return e.code

  if not hasattr(args, "run"):
    parser.print_help()
    return 2
  from lowbw.simulation import RunWarning
  # A run's warnings are in its printed summary and summary.json.
  warnings.filterwarnings("ignore", category=RunWarning)
  if getattr(args, "no_compile_cache", False):
    os.environ["LOWBW_COMPILE_CACHE"] = "0"   # bench's children inherit it
  try:
    return args.run(args)
  except NonFiniteLossError as e:
    print(f"lowbw: error: {e}", file=sys.stderr)
    return 3
  except (ValueError, OSError, ModuleNotFoundError) as e:
    # Validation errors only: a TypeError or AttributeError is a bug in
    # lowbw and shows its traceback.
    print(f"lowbw: error: {_one_line(e)}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("lowbw: interrupted; what was logged so far is kept", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
