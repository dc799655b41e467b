"""The ``lowbw`` command line: the only layer that prints."""

import argparse
import difflib
import os
import re
import sys
import warnings

from lowbw import _validate, telemetry
from lowbw.cli import (_advise, _bench, _calibrate, _data, _fit, _parser,
                       _plan, _plot, _retime, _saved, _sweep, _train)
from lowbw.cli import _export


# Errors whose "what is allowed" speaks its own grammar (a codec chain, a
# grid item, a config file's keys, lane names such as codec=SPEC): its
# names are not the run's settings.
_OWN_GRAMMAR = ("codec", "grid", "config", "seeds", "lanes")


def _rename_fields(text: str, flags: dict[str, str]) -> str:
  """``text`` with each API setting written as ``name=value``
  (``batch_size=4``, ``overwrite=True``) spelled as its flag; plain words
  (a "steps" in a sentence) and quoted names stay."""

  def swap(match):
    name, assigned = match.group(1), match.group(2)
    flag = flags.get(name)
    if flag is None:
      return match.group(0)
    return flag if assigned == "=True" else flag + assigned

  return re.sub(r"(?<![\w'\"`.:\[-])([A-Za-z_][A-Za-z0-9_.]*)(=True|=)",
                swap, text)


def _one_line(error: Exception, flags: dict[str, str]) -> str:
  """The error as one line; a setting the API names its own way
  (``resume_from``) is named by its flag (``--resume``)."""
  if isinstance(error, _validate.ConfigError):
    allowed = error.allowed.splitlines()[0] if error.allowed else ""
    if error.field not in _OWN_GRAMMAR:
      allowed = _rename_fields(allowed, flags)
    return f"{_flag_of(error.field, flags)}={error.value!r} is invalid: {allowed}"
  text = str(error).splitlines()[0] if str(error) else type(error).__name__
  return _rename_fields(text, flags)


def _flag_of(field: str, flags: dict[str, str]) -> str:
  """The flag of an error's field; a field that says where in a file the
  value was ("speeds (line 2 of f.csv)") keeps the place after the flag."""
  name, place = (field.split(" (", 1) + [""])[:2]
  if name not in flags:
    return field
  return flags[name] + (f" ({place}" if place else "")


def _flags_of(parser: _parser.Parser) -> dict[str, str]:
  """API field and setting name -> flag, for one command's parser."""
  flags = dict(parser.flags)
  for action in parser._subparsers._group_actions if parser._subparsers else ():
    for sub in getattr(action, "choices", {}).values():  # lowbw data prepare
      flags.update(getattr(sub, "flags", {}))
  flags.update({api: parser.flags[name] for api, name in
                _train.API_NAMES.items() if name in parser.flags})
  return flags


def _unrecognized(parser, extras: list[str]) -> str:
  """One line for arguments no option took, with the nearest flags."""
  words = [w for w in extras if w.startswith("-")] or extras
  word = words[0]
  hint = _nearest_flags(word.split("=")[0], parser.flags.values())
  what = "argument" if len(extras) == 1 else "arguments"
  return (f"{parser.prog}: error: unrecognized {what} {' '.join(extras)}"
          f"{hint} (see {parser.prog} --help)")


def _nearest_flags(word: str, flags) -> str:
  """" (did you mean --a or --b?)": flags spelled like ``word``, then flags
  with ``word`` as one of their parts (``--lr`` -> ``--inner-lr``)."""
  flags = sorted(set(flags))
  close = difflib.get_close_matches(word, flags, n=3, cutoff=0.75)
  parts = word.lstrip("-").replace("_", "-").split("-")
  close += sorted((f for f in flags if f not in close and parts and
                   all(p in f.lstrip("-").split("-") for p in parts)),
                  key=len)
  close = close[:3]
  return f" (did you mean {' or '.join(close)}?)" if close else ""


def build_parser() -> argparse.ArgumentParser:
  parser = _parser.Parser(
      prog="lowbw",
      description="Simulate low-bandwidth distributed training on one machine.")
  from lowbw import __version__
  parser.add_argument("--version", action="version",
                      version=f"lowbw {__version__}")
  sub = parser.add_subparsers(title="commands", metavar="COMMAND",
                              dest="command", parser_class=_parser.Parser)
  _train.add_parser(sub)
  _sweep.add_parser(sub)
  _bench.add_parser(sub)
  _plan.add_parser(sub)
  _plot.add_parser(sub)
  _retime.add_parser(sub)
  _calibrate.add_parser(sub)
  _fit.add_parser(sub)
  _advise.add_parser(sub)
  _data.add_parser(sub)
  _saved.add_parsers(sub)
  _export.add_parser(sub)
  for name in ("train", "sweep", "bench"):
    sub.choices[name].add_argument(
        "--no-compile-cache", action="store_true",
        help="do not use the persistent compilation cache (default: on, in "
        "$LOWBW_COMPILE_CACHE or ~/.cache/lowbw/xla)")
  from lowbw.simulation import _startup  # the efforts and auto's threshold
  for name in ("train", "sweep"):
    sub.choices[name].add_argument(
        "--compile-effort", choices=_startup.EFFORTS, default=None,
        help="how hard XLA optimises the programs: auto (default: on a CPU, "
        "the quickest settings for a run under "
        f"{_startup.FAST_WORK_FLOPS:.0e} FLOPs, whose programs compile 4-5x "
        "faster and run about 2x slower), fast or full")
  parser.commands = dict(sub.choices)
  return parser


def _parse(parser, argv):
  """(args, None) or (None, the one-line error)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  command = next((a for a in argv if not a.startswith("-")), None)
  if command is not None and command not in parser.commands:
    return None, (f"lowbw: error: unknown command {command!r}"
                  f"{_validate.suggest(command, parser.commands)}; commands: "
                  f"{', '.join(parser.commands)} (see lowbw --help)")
  try:
    args, extras = parser.parse_known_args(argv)
  except argparse.ArgumentError as e:
    return None, f"lowbw: error: {_parser.flag_error(e)}"
  if extras:
    command_parser = parser.commands.get(getattr(args, "command", None),
                                         parser)
    return None, _unrecognized(command_parser, extras)
  return args, None


def main(argv=None) -> int:
  """Entry point; errors are one line on stderr and a non-zero exit code."""
  from lowbw.simulation import DivergenceError, NonFiniteLossError

  parser = build_parser()
  try:
    args, error = _parse(parser, argv)
  except SystemExit as e:  # --help, --version, or a usage error (printed)
    return e.code
  if error:
    print(error, file=sys.stderr)
    return 2
  if not hasattr(args, "run"):
    parser.print_help()
    return 2
  from lowbw.simulation import RunWarning
  # A run's warnings are in its printed summary and summary.json.
  warnings.filterwarnings("ignore", category=RunWarning)
  if getattr(args, "no_compile_cache", False):
    os.environ["LOWBW_COMPILE_CACHE"] = "0"   # bench's children inherit it
  if getattr(args, "compile_effort", None):
    os.environ["LOWBW_COMPILE_EFFORT"] = args.compile_effort
  flags = _flags_of(parser.commands[args.command])
  try:
    with telemetry.quiet_logs():  # a fault reaches the user as one line
      return args.run(args)
  except (NonFiniteLossError, DivergenceError) as e:
    print(f"lowbw: error: {e}", file=sys.stderr)
    return 3
  except (ValueError, OSError, ModuleNotFoundError) as e:
    # Validation errors only: a TypeError or AttributeError is a bug in
    # lowbw and shows its traceback.
    print(f"lowbw: error: {_one_line(e, flags)}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("lowbw: interrupted; what was logged so far is kept", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
