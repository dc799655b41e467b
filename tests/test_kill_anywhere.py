"""Kill anywhere: a run or a study killed at any point (mid-step, mid-
checkpoint, mid-row, before a rename) and resumed logs what the
uninterrupted one logs, no row lost or written twice, in metrics.csv and in
TensorBoard as TensorBoard reads it; its final parameters are the same bits.

The kills are deterministic: ``LOWBW_KILL_AT`` makes the process SIGKILL
itself at a named point of its writes (``lowbw.telemetry.kill_point``).
benchmarks/kill_campaign.py runs the same checks at random points, hundreds
of times.
"""

import csv
import glob
import os
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

import lowbw
from lowbw import cli

TRAIN = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "10", "--H", "5", "--eval-every",
         "5", "--checkpoint-every", "5", "--log-every", "1", "--eval-examples",
         "32", "--no-progress", "--no-plot"]


def csv_rows(folder) -> list[dict]:
  with open(os.path.join(folder, "metrics.csv"), newline="") as f:
    return [{k: v for k, v in r.items() if k != "wall_time_s"}
            for r in csv.DictReader(f)]


def tensorboard_scalars(folder) -> list[tuple[int, str, float]]:
  """(step, tag, value) of every scalar as TensorBoard shows it: files read
  in name order, and a session start at step s discarding the events at or
  after s read before it (how a resumed run's purge_step works)."""
  from tensorboardX.proto.event_pb2 import Event
  seen: list[tuple[int, str, float]] = []
  for path in sorted(glob.glob(os.path.join(folder, "tensorboard",
                                            "events.out.tfevents.*"))):
    raw, i = open(path, "rb").read(), 0
    while i + 12 <= len(raw):
      (n,) = struct.unpack("<Q", raw[i:i + 8])
      event = Event.FromString(raw[i + 12:i + 12 + n])
      i += 16 + n
      if event.HasField("session_log") and event.session_log.status == 1:
        seen = [s for s in seen if s[0] < event.step]
      for v in event.summary.value:
        if v.tag != "wall_time_s":
          seen.append((event.step, v.tag, v.simple_value))
  return seen


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  out = tmp_path_factory.mktemp("whole") / "run"
  assert cli.main(TRAIN + ["--out", str(out)]) == 0
  return out


def test_resuming_a_finished_run_writes_its_last_row_once(whole, tmp_path,
                                                          capsys):
  # A run killed after its last checkpoint resumes from that checkpoint, at
  # its last step: the last row was in the checkpoint's rows and was then
  # finalized and written a second time.
  out = tmp_path / "run"
  assert cli.main(TRAIN + ["--out", str(out)]) == 0
  assert cli.main(["train", "--resume", str(out), "--no-progress",
                   "--no-plot"]) == 0
  capsys.readouterr()
  assert [r["step"] for r in csv_rows(out)] == [str(s) for s in range(1, 11)]
  assert csv_rows(out) == csv_rows(whole)
  assert tensorboard_scalars(out) == tensorboard_scalars(whole)
  # The interrupted run's event file, all of it purged, is gone.
  assert len(os.listdir(out / "tensorboard")) == 1
  with np.load(out / "params.npz") as a, np.load(whole / "params.npz") as b:
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
      np.testing.assert_array_equal(a[k], b[k])


def killed(argv, kill_at: str) -> None:
  """``lowbw ARGV`` in a process that SIGKILLs itself at ``kill_at``."""
  done = subprocess.run([sys.executable, "-m", "lowbw", *argv],
                        capture_output=True, text=True,
                        env={**os.environ, "LOWBW_KILL_AT": kill_at})
  assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def test_a_run_killed_mid_checkpoint_and_mid_row_resumes_bit_identically(
    whole, tmp_path, capsys):
  out = tmp_path / "run"
  # 0-100 ms into the second save (the last step's): inside orbax's write
  # or commit, or just after it.
  killed(TRAIN + ["--out", str(out)], "checkpoint:2:0.05")
  steps = sorted(os.listdir(out / "checkpoints"))
  assert "5" in steps  # the first checkpoint stays; a partial one is hidden
  # The resumed process killed with its third row in metrics.csv but not in
  # TensorBoard.
  resume = ["train", "--resume", str(out), "--no-progress", "--no-plot"]
  killed(resume, "row:3")
  assert csv_rows(out) == csv_rows(whole)[:len(csv_rows(out))]
  assert cli.main(resume) == 0
  capsys.readouterr()
  assert csv_rows(out) == csv_rows(whole)
  assert tensorboard_scalars(out) == tensorboard_scalars(whole)
  with np.load(out / "params.npz") as a, np.load(whole / "params.npz") as b:
    for k in b.files:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_kill_point_that_does_not_exist_is_refused():
  from lowbw.telemetry import _killpoint
  with pytest.raises(ValueError, match="^LOWBW_KILL_AT='rows:1' is invalid: "
                     "expected NAME:N"):
    _killpoint._plan("rows:1")
  with pytest.raises(ValueError, match="LOWBW_KILL_AT='row:0' is invalid"):
    _killpoint._plan("row:0")
  with pytest.raises(ValueError, match="LOWBW_KILL_AT='row:1:soon' is invalid"):
    _killpoint._plan("row:1:soon")
  assert _killpoint._plan("checkpoint:2:0.5") == ("checkpoint", 2, 0.5)
  assert _killpoint._plan("table:3") == ("table", 3, 0.0)
  assert _killpoint._plan(None) is None


SWEEP = ["sweep", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "4", "--H", "2", "--eval-every",
         "4", "--eval-examples", "32", "--grid", "outer_lr=0.5,0.7",
         "--seeds", "0", "--no-progress"]


class _Killed(BaseException):
  """Stands for SIGKILL in-process: nothing after it runs, nothing cleans
  up (``except OSError`` and ``finally`` aside, as after a real kill the
  process is gone; what is on disk is what the test looks at)."""


def test_a_study_killed_while_writing_its_tables_leaves_each_table_whole(
    tmp_path, monkeypatch, capsys):
  # A study run again over a finished one rewrites its tables; killed in
  # the middle of that, each table must be the previous whole one or the
  # new whole one, never a table cut short.
  import dataclasses
  from lowbw.studies import _files
  from lowbw.telemetry import _writers
  out = tmp_path / "study"
  assert cli.main(SWEEP + ["--out", str(out)]) == 0
  capsys.readouterr()
  new = lowbw.studies.load(str(out))
  old = dataclasses.replace(new, points=new.points[:1])  # tables that differ

  def tables():
    return {n: (out / n).read_bytes() if (out / n).exists() else None
            for n in _files.TABLES}

  _files.write_tables(old, str(out))
  before = tables()
  writes = []
  real_write = _writers._File.write
  monkeypatch.setattr(_writers._File, "write",
                      lambda f, data: (writes.append(f.name),
                                       real_write(f, data))[1])
  _files.write_tables(new, str(out))
  after = tables()
  for name in ("final.csv", "points.csv", "study.csv"):
    assert before[name] != after[name], name
  for n in range(len(writes)):
    _files.write_tables(old, str(out))

    def killed_write(f, data, calls=[]):  # noqa: B006  (counts this n's)
      calls.append(f.name)
      if len(calls) == n + 1:   # half of this write reaches the disk
        real_write(f, data[:len(data) // 2])
        raise _Killed()
      real_write(f, data)

    monkeypatch.setattr(_writers._File, "write", killed_write)
    with pytest.raises(_Killed):
      _files.write_tables(new, str(out))
    monkeypatch.setattr(_writers._File, "write", real_write)
    for name, text in tables().items():
      assert text in (before[name], after[name]), (
          f"killed in write {n + 1} ({writes[n]}): {name} is cut short")
