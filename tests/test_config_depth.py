"""A config file that nests lists or tables thousands of levels deep is one
line naming the file, not a RecursionError's traceback; so is a run's
config.json read back."""

import pytest

import lowbw
from lowbw import cli
from lowbw.config import _files


def _error(argv, capsys) -> str:
  assert cli.main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("lowbw: error: "), lines
  return lines[0]


def _nested(depth: int, kind: str) -> str:
  inner = "[" * depth + "]" * depth
  return {"json": '{"steps": ' + inner + "}", "yaml": f"steps: {inner}\n",
          "toml": f"steps = {inner}\n"}[kind]


@pytest.mark.parametrize("kind", ["json", "yaml", "toml"])
@pytest.mark.parametrize("depth", [10_000, 40])
def test_a_deeply_nested_config_is_one_line_naming_the_file(
    kind, depth, tmp_path, capsys):
  path = tmp_path / f"deep.{kind}"
  path.write_text(_nested(depth, kind))
  line = _error(["train", "--config", str(path)], capsys)
  assert line == (f"lowbw: error: --config='{path}' is invalid: nests lists "
                  f"or tables more than {_files.MAX_DEPTH} levels deep; "
                  "settings are values, lists of values or small tables")


def test_a_list_that_holds_itself_is_refused(tmp_path, capsys):
  path = tmp_path / "alias.yaml"
  path.write_text("steps: &x [*x]\n")
  assert "more than 32 levels deep" in _error(
      ["train", "--config", str(path)], capsys)


def test_nesting_as_deep_as_allowed_reads():
  """The walk counts levels as a plain recursive depth does."""
  def depth(v):
    if isinstance(v, dict):
      v = list(v.values())
    return 1 + max(map(depth, v), default=0) if isinstance(v, list) else 0

  for value in ([], [[1, [2]], {"a": [[3]]}], {"a": {"b": [1]}},
                [[[[]]]], 5, "x"):
    for limit in range(6):
      deep = _files._oversized(value, limit, 10**6) == "deep"
      assert deep == (depth(value) > limit)


def test_a_saved_runs_deep_config_json_names_the_folder(tmp_path):
  (tmp_path / "config.json").write_text("[" * 10_000 + "]" * 10_000)
  with pytest.raises(lowbw.ConfigError, match="^run_dir=.*its config.json "
                     "nests lists or objects too deeply"):
    lowbw.load(str(tmp_path))


def test_aliases_of_aliases_are_refused_at_once(tmp_path, capsys):
  # Nine lines of YAML standing for 9^9 values ("billion laughs"): read in
  # milliseconds, but any walk over them took hours (the command hung).
  lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", '
           '"lol"]']
  lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]"
            for i in range(1, 9)]
  path = tmp_path / "laughs.yaml"
  path.write_text("\n".join(lines) + "\n")
  assert "holds more than 100,000 values" in _error(
      ["train", "--config", str(path)], capsys)


def test_the_value_count_stops_at_its_limit():
  assert _files._oversized(list(range(10)), 32, 10) == "large"
  assert _files._oversized(list(range(9)), 32, 10) is None
