"""Bad inputs that used to be taken silently or misreported: config files
with a key twice or none, study grids and seeds of the wrong kind, resume
folders that are not runs, faults past the run's end. Each is one line
naming the setting and the value, before anything is built."""

import json
import os

import numpy as np
import pytest

import lowbw
from lowbw import cli

TINY = ["--data", "digits", "--hidden", "8", "--workers", "2", "--H", "2",
        "--steps", "8", "--eval-every", "4", "--eval-examples", "32",
        "--no-progress", "--no-plot"]


def _error(argv, capsys) -> str:
  """The one error line of a command that must fail with exit code 2."""
  assert cli.main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert lines[-1].startswith("lowbw: error: "), lines
  return lines[-1]


# ------------------------------------------------------------ config files
@pytest.mark.parametrize("name, text, message", [
    ("twice.yaml", "workers: 2\nworkers: 4\n",
     "not valid YAML (key 'workers' is given twice)"),
    ("twice.json", '{"workers": 2, "workers": 4}',
     "not valid JSON (key 'workers' is given twice)"),
    ("twice.toml", "workers = 2\nworkers = 4\n", "not valid TOML"),
    ("spelled.yaml", "inner-lr: 0.01\ninner_lr: 0.001\n",
     "'inner-lr' and 'inner_lr' are the same setting, given twice"),
    ("empty.toml", "", "holds no options"),
    ("empty.json", "{}", "holds no options"),
])
def test_a_config_file_with_a_key_twice_or_none_is_refused(
    name, text, message, tmp_path, capsys):
  path = tmp_path / name
  path.write_text(text)
  line = _error(["train", "--config", str(path)], capsys)
  assert line.startswith(f"lowbw: error: --config='{path}' is invalid: ")
  assert message in line


# ------------------------------------------------------------------ studies
BASE = dict(data="digits", hidden="8", workers=2, batch_size=4, steps=8,
            H=2, eval_examples=32)


@pytest.mark.parametrize("grid, seeds, message", [
    ({"out": ["a", "b"]}, [0], "^grid='out' is invalid: a setting of how "
     "the study runs"),
    ({"checkpoint_every": [2, 4]}, [0], "^grid='checkpoint_every' is "
     "invalid: a setting of how the study runs"),
    ({"H": [2, 2]}, [0], "^H=2 is invalid: given twice in the grid"),
    ({"H": {"a": 1}}, [0], r"^H=\{'a': 1\} is invalid: expected a list of "
     "values, not a table"),
    ({"H": [2]}, "0,1", "^seeds='0,1' is invalid: expected a list of "
     "integers, or one integer"),
    ({"workers": [2, 5000]}, [0], "^num_workers=5000 is invalid: expected "
     r"at most 1438, the number of training examples of 'digits' \(at grid "
     "point workers=5000"),
    ({"model": ["mlp", "gpt"]}, [0], "^model='gpt' is invalid: is a model "
     "for lm but data 'digits' is classification data"),
])
def test_a_bad_grid_or_seeds_is_refused_before_any_point_runs(
    grid, seeds, message, tmp_path):
  out = tmp_path / "study"
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.study(lowbw.Config(**BASE), grid, seeds=seeds, out=str(out),
                progress=False)
  assert not out.exists()  # nothing ran, nothing was written


def test_one_integer_seed_is_a_list_of_one():
  study = lowbw.study(lowbw.Config(**BASE), {"H": [2]}, seeds=3,
                      progress=False, plots=False)
  assert [p.seed for p in study.points] == [3]


def test_the_cli_refuses_a_grid_value_given_twice(capsys, tmp_path):
  line = _error(["sweep", *TINY[:-1], "--grid", "H=2,2", "--out",
                 str(tmp_path / "s")], capsys)
  assert line == "lowbw: error: --H=2 is invalid: given twice in the grid " \
                 "(each value runs once)"
