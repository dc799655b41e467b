"""Every command's and subcommand's ``--help``, found by walking the parser
(so that a command added later is covered without editing this list)."""

import argparse

import pytest

from lowbw import cli


def _commands(parser, path=()):
  """Each (command path, parser) under ``parser``, itself included."""
  yield path, parser
  for action in parser._actions:  # argparse keeps its subcommands here only
    if isinstance(action, argparse._SubParsersAction):
      for name, sub in action.choices.items():
        yield from _commands(sub, (*path, name))


COMMANDS = [path for path, _ in _commands(cli.build_parser())]


def test_the_walk_finds_the_nested_commands():
  assert ("data", "prepare") in COMMANDS and ("train",) in COMMANDS
  assert len(COMMANDS) >= 10


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or
                         "lowbw")
def test_help_exits_zero_with_text(path, capsys):
  assert cli.main([*path, "--help"]) == 0
  printed = capsys.readouterr()
  assert "usage: lowbw" in printed.out and "--help" in printed.out
  assert printed.err == ""
