"""A new user's first hour: what the default run and the commands say
while they work, and the words they print."""

import re

import pytest

from lowbw import cli
from lowbw.cli import _heartbeat, _train

_TINY = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "40", "--H", "5"]


def test_a_compile_longer_than_the_threshold_is_said_on_stderr(
    capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(_heartbeat, "AFTER_S", 0.0)
  monkeypatch.setattr(_heartbeat, "POLL_S", 0.01)
  assert cli.main(_TINY + ["--out", str(tmp_path / "r")]) == 0
  err = capsys.readouterr().err
  assert re.search(r"lowbw: compiling the workers' training chunk and the "
                   r"evaluation \(\d+ s\)", err), err


def test_no_heartbeat_under_the_threshold_or_with_no_progress(
    capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(_heartbeat, "AFTER_S", 0.0)
  monkeypatch.setattr(_heartbeat, "POLL_S", 0.01)
  assert cli.main(_TINY + ["--no-progress", "--out", str(tmp_path / "r")]) == 0
  assert "compiling" not in capsys.readouterr().err


def test_off_a_terminal_rows_print_about_twenty_lines_and_every_eval(
    capsys, tmp_path):
  assert cli.main(_TINY + ["--eval-every", "5", "--out",
                           str(tmp_path / "r")]) == 0
  rows = [l for l in capsys.readouterr().out.splitlines()
          if l.startswith("step ")]
  steps = [int(l.split()[1].split("/")[0]) for l in rows]
  every = 40 // _train.PRINTED_ROWS
  assert steps == sorted(set(range(every, 41, every)) | set(range(5, 41, 5)))
  assert all("eval_loss" in l for l, s in zip(rows, steps) if s % 5 == 0)


def test_an_explicit_log_every_prints_every_logged_row(capsys, tmp_path):
  assert cli.main(_TINY + ["--log-every", "1", "--out",
                           str(tmp_path / "r")]) == 0
  rows = [l for l in capsys.readouterr().out.splitlines()
          if l.startswith("step ")]
  assert len(rows) == 40


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("run") / "r"
  assert cli.main(_TINY + ["--steps", "10", "--no-progress", "--no-plot",
                           "--out", str(out)]) == 0
  return out


@pytest.mark.parametrize("command", ["train", "bench", "eval"])
def test_a_missing_data_path_is_said_missing(command, tiny_run, capsys,
                                             tmp_path):
  missing = str(tmp_path / "no" / "such")
  argv = {"train": ["train", "--steps", "2"], "bench": ["bench"],
          "eval": ["eval", str(tiny_run)]}[command]
  assert cli.main(argv + ["--data", missing]) == 2
  err = capsys.readouterr().err
  assert f"--data='{missing}' is invalid: no such file or folder" in err, err


def _summary_of(out_dir) -> dict:
  import json
  with open(out_dir / "summary.json") as f:
    return json.load(f)


@pytest.mark.parametrize("speeds", ["1,1,1,0.25", "1,0.5,0.8,1", None])
def test_the_summary_names_the_wait_for_the_slowest(speeds, capsys, tmp_path):
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "4",
          "--batch-size", "4", "--steps", "40", "--H", "5", "--hardware",
          "10ms", "--no-progress", "--no-plot", "--out", str(tmp_path / "r")]
  assert cli.main(argv + (["--speeds", speeds] if speeds else [])) == 0
  out = capsys.readouterr().out
  summary = _summary_of(tmp_path / "r")
  # Reference: each step lasts as long as its slowest worker's.
  step_s = 0.010
  slowest = step_s / min(float(v) for v in (speeds or "1").split(","))
  expected = 40 * (slowest - step_s)
  assert "of the nominal time: compute and communication at the nominal " \
         "speed, without waiting" in out
  if not expected:
    assert "wait_s" not in summary and "  waiting  " not in out
    return
  assert summary["wait_s"] == pytest.approx(expected, rel=1e-5)
  assert summary["wait_share"] == pytest.approx(
      expected / summary["sim_time_s"], rel=1e-5)
  share = f"{expected / summary['sim_time_s']:.1%}"
  assert re.search(r"  waiting +\S+ per step for the slowest workers \("
                   + re.escape(share) + " of the simulated time", out), out
