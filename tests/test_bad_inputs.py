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
    ({"workers": [2, 5000]}, [0], "^workers=5000 is invalid: expected "
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


# ------------------------------------------------------- out and resume
def test_an_empty_out_is_refused_not_replaced_by_a_default(capsys):
  assert _error(["train", *TINY, "--out", ""], capsys) == \
      "lowbw: error: --out='' is invalid: expected a folder path"


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "not the log folder of a lowbw train run"),
    ("{bad", "its config.json is not valid JSON (Expecting property name"),
])
def test_resume_from_a_folder_whose_record_is_not_a_run(text, message,
                                                        tmp_path, capsys):
  (tmp_path / "config.json").write_text(text)
  line = _error(["train", "--resume", str(tmp_path)], capsys)
  assert line.startswith(f"lowbw: error: --resume='{tmp_path}' is invalid: ")
  assert message in line


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
  out = tmp_path_factory.mktemp("run") / "r"
  assert cli.main(["train", *TINY, "--checkpoint-every", "4", "--out",
                   str(out)]) == 0
  return out


def test_resume_names_the_setting_that_changed_not_what_follows(
    checkpointed, tmp_path, capsys):
  capsys.readouterr()
  run = tmp_path / "r"
  import shutil
  shutil.copytree(checkpointed, run)
  record = json.loads((run / "config.json").read_text())
  (settings,) = record["metadata"].values()
  settings["workers"] = 4  # the channels' sizes change with it
  (run / "config.json").write_text(json.dumps(record))
  line = _error(["train", "--resume", str(run), "--steps", "12"], capsys)
  assert "the checkpoint was made with --workers=2 but this run has " \
         "--workers=4; only steps, eval_every, log_every, " \
         "checkpoint_every, eval_examples, devices, worker_batch may " \
         "change on resume" in line


def test_a_checkpoint_that_cannot_be_read_is_one_line_naming_its_step(
    checkpointed, monkeypatch, capsys):
  from lowbw.telemetry import _checkpoint

  def damaged(*args, **kwargs):
    raise RuntimeError("Error reading ...: DATA_LOSS\nspec: {...}\nmore")

  monkeypatch.setattr(_checkpoint, "restore", damaged)
  capsys.readouterr()
  line = _error(["train", "--resume", str(checkpointed), "--steps", "12"],
                capsys)
  assert line.endswith("its checkpoint at step 8 cannot be read (Error "
                       "reading ...: DATA_LOSS); if it is damaged, delete "
                       "that step's folder under checkpoints/ to resume "
                       "from the one before")


# ------------------------------------------------------------------- faults
def test_faults_after_the_last_step_are_warned_about(tmp_path, capsys):
  """A failure or window past the end changes nothing in this run (a run
  resumed to more steps meets it), so it is a warning, not an error."""
  assert cli.main(["train", *TINY, "--failures", "1@500", "--windows",
                   "0:3-5,1:40-50", "--out", str(tmp_path / "r")]) == 0
  err = capsys.readouterr().err
  assert "lowbw: warning: worker 1's failure at step 500, worker 1's " \
         "window from step 40 start after the run's last step (7): no " \
         "effect in this run" in err
  assert "window from step 3" not in err
