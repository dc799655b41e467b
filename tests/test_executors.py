"""A study's points run by other processes: ``local:N`` workers, Ray tasks,
Slurm jobs through submitit (its local cluster; its batch script read
without a cluster), two studies on one folder, a killed study resumed the
other way. Every way gives the tables of the study run in one process: the
same bytes but for the wall-clock columns (``wall_time_s``: each run's own
time).
"""

import csv
import json
import os
import subprocess
import sys

import pytest

import lowbw
from lowbw import cli
from lowbw.cli import _sweep
from lowbw.studies import _claims, _exec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = dict(data="digits", hidden="8", workers=2, batch_size=4, steps=4,
            eval_examples=32, eval_every=4, strategy="diloco")
# 2 values of H (one build: H is traced) x 5 outer learning rates x 4
# seeds: 40 points.
GRID = {"H": [2, 4], "outer_lr": [0.3, 0.5, 0.7, 0.9, 1.0]}
SEEDS = [0, 1, 2, 3]
ROWS = 4  # logged rows per point (one per step)
TABLES = ("study.csv", "final.csv", "points.csv")


def study(out, **kwargs):
  return lowbw.study(BASE, GRID, SEEDS, out=str(out), progress=False,
                     plots=False, **kwargs)


def tables(out) -> dict:
  """Each table's rows without its wall-clock columns."""
  found = {}
  for name in TABLES:
    with open(os.path.join(out, name), newline="") as f:
      rows = list(csv.reader(f))
    keep = [i for i, c in enumerate(rows[0]) if not c.startswith(
        "wall_time_s")]
    found[name] = [[row[i] for i in keep] for row in rows]
  return found


def claims_left(out) -> list[str]:
  folder = os.path.join(out, _claims.FOLDER)
  return sorted(n for n in os.listdir(folder) if n.endswith(".json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  out = tmp_path_factory.mktemp("one_process")
  result = study(out)
  # H is traced: one build for both H.
  assert len(result.points) == 40 and result.summary["builds"] == 1
  return str(out), tables(out)


@pytest.fixture
def child_env(monkeypatch):
  """Other processes import this checkout's lowbw."""
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
      filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  return os.environ


def test_local_workers_give_the_one_process_tables(reference, tmp_path,
                                                   child_env):
  out = tmp_path / "local"
  result = study(out, executor="local:2")
  assert tables(out) == reference[1]
  assert [p.index for p in result.points] == list(range(40))
  # Each of the 2 workers built the one shape (H traced) once.
  assert result.summary["builds"] == 2
  assert claims_left(out) == []
  # The returned study is its tables' (the points as their folders hold
  # them), as the one-process study's is.
  again = lowbw.study(BASE, GRID, SEEDS, out=reference[0], progress=False,
                      plots=False)
  assert again.summary["resumed"] == 40
  for mine, theirs in zip(result.points, again.points):
    assert mine.summary["final_eval_loss"] == theirs.summary[
        "final_eval_loss"]
    assert list(mine.history) == list(theirs.history)


def test_ray_tasks_give_the_one_process_tables(reference, tmp_path,
                                               child_env):
  ray = pytest.importorskip("ray")
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  try:
    out = tmp_path / "ray"
    study(out, executor="ray")
  finally:
    ray.shutdown()
  assert tables(out) == reference[1]
  assert claims_left(out) == []


def test_slurm_jobs_through_submitits_local_cluster(reference, tmp_path,
                                                    child_env):
  pytest.importorskip("submitit")
  out = tmp_path / "slurm"
  study(out, executor="slurm", executor_options={"cluster": "local",
                                                "timeout_min": 10})
  assert tables(out) == reference[1]
  # submitit's record of the job (one per compiled shape: H is traced).
  logs = os.listdir(out / "slurm")
  assert sum(name.endswith("_result.pkl") for name in logs) == 1


def test_the_slurm_batch_script_carries_the_options(tmp_path, monkeypatch):
  pytest.importorskip("submitit")
  # submitit looks for Slurm's srun on the PATH; the script is only read.
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
  (bin_dir / "srun").chmod(0o755)
  monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  executor = _exec.slurm_executor(str(tmp_path), {
      "slurm_partition": "gpu", "gpus_per_node": 1, "timeout_min": 60,
      "slurm_additional_parameters": {"account": "lab"}})
  script = executor._executor._make_submission_file_text(
      "python -m submitit.core._submit X", "0")
  for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
               "#SBATCH --time=60", "#SBATCH --account=lab",
               "#SBATCH --job-name=lowbw-study"):
    assert line in script
  assert f"--output={tmp_path}/slurm/" in script


def run_killed(out, executor, kill_at_row):
  """The study in a new process whose study-running processes (the study's
  own, or each local worker) SIGKILL themselves at their ``kill_at_row``-th
  logged row."""
  code = (f"import lowbw; lowbw.study({BASE!r}, {GRID!r}, {SEEDS!r}, "
          f"out={str(out)!r}, progress=False, plots=False, "
          f"executor={executor!r})")
  env = {**os.environ, "LOWBW_KILL_AT": f"row:{kill_at_row}"}
  proc = subprocess.run([sys.executable, "-c", code], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0, proc.stderr[-2000:]
  return proc


def finished(out) -> set[int]:
  from lowbw.studies import _files
  return _files.finished(str(out))


def test_a_killed_study_resumes_whichever_way_it_ran(reference, tmp_path,
                                                     child_env):
  out = tmp_path / "killed"
  # Killed in its own process half-way through its third point.
  run_killed(out, None, 2 * ROWS + 2)
  assert finished(out) == {0, 1}
  assert claims_left(out) == ["0002.json"]  # its dead process's
  # Resumed by 2 local workers, each killed in its third point: the dead
  # process's claim is taken over.
  proc = run_killed(out, "local:2", 2 * ROWS + 2)
  assert "a local study worker exited" in proc.stderr
  assert len(finished(out)) == 6
  # Resumed in one process: the dead workers' claims are taken over too.
  result = study(out)
  assert result.summary["resumed"] == 6
  assert tables(out) == reference[1]
  assert claims_left(out) == []


def test_two_studies_on_one_folder_run_each_point_once(reference, tmp_path,
                                                       child_env):
  out = tmp_path / "shared"
  code = (f"import lowbw; lowbw.study({BASE!r}, {GRID!r}, {SEEDS!r}, "
          f"out={str(out)!r}, progress=False, plots=False)")
  counts = [tmp_path / f"rows{i}.txt" for i in range(2)]
  procs = [subprocess.Popen([sys.executable, "-c", code], env={
      **os.environ, "LOWBW_KILL_COUNTS": str(path)}) for path in counts]
  assert [p.wait(timeout=300) for p in procs] == [0, 0]
  rows = [path.read_text().split().count("row") if path.exists() else 0
          for path in counts]
  # Every point's rows logged once in all: no point ran twice.
  assert sum(rows) == 40 * ROWS
  assert tables(out) == reference[1]
  assert claims_left(out) == []


def test_a_claim_of_a_live_process_holds_and_a_dead_ones_does_not(
    tmp_path):
  out = str(tmp_path)
  never = lambda i: False  # noqa: E731
  assert _claims.take(out, [0, 1], never) == [0, 1]
  assert _claims.take(out, [0, 1, 2], never) == [2]  # this thread's: held
  sleeper = subprocess.Popen([sys.executable, "-c",
                              "import time; time.sleep(60)"])
  try:
    with open(_claims.path(out, 0), "w") as f:  # a live other process's
      json.dump({"host": os.uname().nodename, "pid": sleeper.pid,
                 "start": _claims.start_time(sleeper.pid)}, f)
    assert _claims.holder(out, 0)["pid"] == sleeper.pid
    assert _claims.take(out, [0], never) == []
  finally:
    sleeper.kill()
    sleeper.wait()
  assert _claims.holder(out, 0) is None  # dead: stale
  assert _claims.take(out, [0], never) == [0]
  assert _claims.take(out, [5], lambda i: True) == []  # finished
  _claims.release(out, [0, 1, 2])
  assert claims_left(out) == []


@pytest.mark.parametrize("kwargs, message", [
    ({"executor": "local:0"}, "^executor='local:0' is invalid: expected "
                              "None"),
    ({"executor": "dask"}, "^executor='dask' is invalid"),
    ({"executor": 2}, "^executor=2 is invalid"),
    ({"executor": "local:2", "out": None}, "needs out="),
    ({"executor_options": {"timeout_min": 5}}, "only read by the slurm "
                                               "executor"),
    ({"executor": "slurm", "executor_options": ["x"]}, "expected a dict"),
])
def test_bad_executors_are_one_clear_error(kwargs, message, tmp_path):
  kwargs = {"out": str(tmp_path / "s"), **kwargs}
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.study(BASE, GRID, SEEDS, progress=False, plots=False, **kwargs)


def test_a_missing_package_names_its_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
  with pytest.raises(lowbw.ConfigError, match=r"needs ray: pip install "
                     r"'lowbw\[ray\]'"):
    study(tmp_path / "s", executor="ray")


@pytest.mark.parametrize("argv, message", [
    (["--executor", "local:x"], "--executor='local:x' is invalid: expected "
                                "None"),
    (["--executor", "slurm", "--executor-option", "timeout_min"],
     "--executor-option='timeout_min' is invalid: expected KEY=VALUE"),
    (["--executor-option", "timeout_min=5"],
     "executor_options={'timeout_min': 5} is invalid: only read by the "
     "slurm executor"),
])
def test_sweep_executor_errors_are_one_line(argv, message, capsys, tmp_path):
  code = cli.main(["sweep", "--data", "digits", "--grid", "H=2", "--out",
                   str(tmp_path / "s"), *argv])
  err = capsys.readouterr().err
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_sweep_options_are_typed():
  assert _sweep.parse_options(["timeout_min=60", "slurm_partition=gpu",
                               "mem_gb=1.5", "exclusive=true"]) == {
      "timeout_min": 60, "slurm_partition": "gpu", "mem_gb": 1.5,
      "exclusive": True}
  assert _sweep.parse_options(None) is None


def test_local_workers_on_gpus_get_one_each_or_share_its_memory(
    monkeypatch):
  monkeypatch.setattr(_exec, "gpus", lambda: ["0", "3"])
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  slots = _exec._slots(2)
  assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in slots] == ["0", "3"]
  assert all(cores is None and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
             for env, cores in slots)
  slots = _exec._slots(4)  # two workers on each GPU
  assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in slots] == [
      "0", "3", "0", "3"]
  assert {env["XLA_PYTHON_CLIENT_MEM_FRACTION"] for env, _ in slots} == {
      "0.450"}


def test_local_workers_on_a_cpu_split_its_cores(monkeypatch):
  monkeypatch.setattr(_exec, "gpus", lambda: [])
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
  assert [cores for _, cores in _exec._slots(2)] == [[0, 1], [2, 3]]
  assert [cores for _, cores in _exec._slots(4)] == [[0], [1], [2], [3]]
  # More workers than cores: one core each, in turn.
  assert [cores for _, cores in _exec._slots(6)] == [[0], [1], [2], [3],
                                                      [0], [1]]
  # Each keeps this process's CPU devices (the tests' LOWBW_CPU_DEVICES).
  assert {env["LOWBW_CPU_DEVICES"] for env, _ in _exec._slots(2)} == {
      os.environ["LOWBW_CPU_DEVICES"]}


def test_executor_parts_keep_whole_vmapped_batches():
  group = list(range(10))
  assert _exec.units([group, [], [10, 11]], 2, None) == [
      [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10], [11]]
  assert _exec.units([group], 3, 3) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
  assert _exec.units([group], 4, None) == [[0, 1, 2], [3, 4, 5], [6, 7, 8],
                                           [9]]


def test_workers_run_vmapped_batches_and_the_study_re_times(tmp_path,
                                                             child_env):
  # 4 trainings (outer_lr) in vmapped batches of 2, each also on a second
  # network: re-timed from its training by the study's own process.
  grid = {"bandwidth": ["10Mbps", "1Gbps"], "outer_lr": [0.5, 0.7, 0.9, 1.1]}
  base = {**BASE, "H": 2}
  found = []
  for name, executor in (("one", None), ("local", "local:2")):
    result = lowbw.study(base, grid, [0], out=str(tmp_path / name),
                         progress=False, plots=False, points_per_batch=2,
                         executor=executor)
    assert result.summary["retimed"] == 4
    found.append(tables(tmp_path / name))
  assert found[0] == found[1]
