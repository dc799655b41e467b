"""One writer per run folder: a run holds ``OUT/.lowbw.lock`` while it
writes; a second writer (a run or a resume) is refused with one line
naming the owner before it clears or writes anything; a lock whose
process is gone is taken over; two processes racing for one new folder
get it once."""

import json
import os
import socket
import subprocess
import sys

import pytest

import lowbw
from lowbw import cli
from lowbw.simulation import _logdir

RUN = dict(data="digits", strategy="diloco", H=2, workers=2, batch_size=4,
           hidden="4", steps=4, eval_every=4, eval_examples=16, devices=1,
           progress=False)


def _lock_of(pid: int, folder, host=None):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, _logdir.LOCK), "w") as f:
    json.dump({"pid": pid, "host": host or socket.gethostname(),
               "started": "then", "command": "lowbw train --out x"}, f)


@pytest.fixture(scope="module")
def sim():
  return lowbw.build(lowbw.Config(**RUN))


def test_a_live_owner_refuses_a_second_run_before_it_clears_anything(
    sim, tmp_path):
  out = tmp_path / "run"
  sim.run(seed=0, out=str(out))
  assert not (out / _logdir.LOCK).exists()  # released at the end
  before = (out / "metrics.csv").read_bytes()
  _lock_of(os.getppid(), out)  # a process that is alive: our parent
  with pytest.raises(ValueError, match=r"^out=.* is being written by "
                     rf"process {os.getppid()} on .*lowbw train --out x"):
    sim.run(seed=0, out=str(out), overwrite=True)
  # Nothing was cleared, and the owner's lock stays.
  assert (out / "metrics.csv").read_bytes() == before
  assert json.loads((out / _logdir.LOCK).read_text())["pid"] == os.getppid()
  # Nor may another host's writer be second-guessed.
  _lock_of(1, out, host="elsewhere")
  with pytest.raises(ValueError, match="on elsewhere"):
    sim.run(seed=0, out=str(out), overwrite=True)


def test_a_lock_whose_process_is_gone_is_taken_over(sim, tmp_path):
  done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  out = tmp_path / "run"
  _lock_of(int(done.stdout), out)
  with pytest.warns(UserWarning, match="took over the lock of process "
                    f"{int(done.stdout)}, which is no longer running"):
    sim.run(seed=0, out=str(out))
  assert (out / "summary.json").exists()
  assert not (out / _logdir.LOCK).exists()


def test_a_failed_run_releases_its_lock(tmp_path):
  bad = lowbw.build(lowbw.Config(**{**RUN, "inner_lr": 1e30}))
  out = tmp_path / "run"
  with pytest.raises(lowbw.NonFiniteLossError):
    bad.run(seed=0, out=str(out))
  assert not (out / _logdir.LOCK).exists()


def test_a_resume_of_a_running_folder_is_one_line(tmp_path, capsys):
  out = tmp_path / "run"
  flags = ["--data", "digits", "--hidden", "4", "--steps", "4", "--H", "2",
           "--workers", "2", "--batch-size", "4", "--no-progress",
           "--checkpoint-every", "2"]
  assert cli.main(["train", *flags, "--out", str(out)]) == 0
  capsys.readouterr()
  _lock_of(os.getppid(), out)
  code = cli.main(["train", "--resume", str(out)])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert f"is being written by process {os.getppid()}" in err


RACE = """
import sys, time
from lowbw.simulation._logdir import FolderLock
sys.stdin.readline()  # both start together
try:
  FolderLock(sys.argv[1]).acquire()
  print("held", flush=True)
  time.sleep(2)
except ValueError as e:
  print("refused", flush=True)
"""


def test_two_processes_racing_for_a_new_folder_get_it_once(tmp_path):
  folder = str(tmp_path / "new")
  os.makedirs(folder)
  procs = [subprocess.Popen([sys.executable, "-c", RACE, folder],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True) for _ in range(2)]
  for p in procs:
    p.stdin.write("go\n")
    p.stdin.flush()
  said = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
  assert said == ["held", "refused"]


def test_a_sweep_holds_its_folder_and_refuses_a_second_writer(sim,
                                                             tmp_path):
  # lowbw.sweep writes point_NNN/ and sweep.csv in its folder: one writer.
  out = tmp_path / "sweep"
  _lock_of(os.getppid(), out)
  with pytest.raises(ValueError, match=r"^out=.* is being written by "
                     rf"process {os.getppid()} on .*lowbw train --out x"
                     ) as e:
    lowbw.sweep(sim, grid={"inner_lr": [0.1]}, out=str(out), progress=False)
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(out)) == [_logdir.LOCK]  # nothing written
  os.remove(out / _logdir.LOCK)
  done = lowbw.sweep(sim, grid={"inner_lr": [0.1]}, out=str(out),
                     progress=False)
  assert len(done.points) == 1 and (out / "sweep.csv").exists()
  assert not (out / _logdir.LOCK).exists()  # released at the end
