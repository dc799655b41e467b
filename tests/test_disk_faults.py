"""A full disk or a folder that cannot be written: one error line naming the
file and what to do, at once; what was logged stays whole; resuming after
the fault is fixed equals an uninterrupted run.

Faults are simulated (tests may run as root, where permissions do not block
writes): ``Fault`` makes the operating system's answers fail for the files
whose path contains a given text, at the ``os`` level and at ``open()``.
"""

import builtins
import csv
import errno
import glob
import json
import logging
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading

import chex
import optax
import pytest

import lowbw
from lowbw import cli, data, models, strategies, telemetry
from lowbw.telemetry import _checkpoint, _writers
from lowbw.simulation import _logdir

TRAIN = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "20", "--H", "5", "--eval-every",
         "5", "--checkpoint-every", "5", "--log-every", "1", "--no-progress"]
NO_SPACE = "No space left on device (errno 28)"


class Fault:
  """Writes (ENOSPC, a disk that fills up) or opens and folder creations
  (EACCES, a folder whose permission was taken) of files whose path holds
  ``match`` fail once ``after`` of them succeeded. A failing write first
  writes half its bytes, as a disk that fills in the middle of one does."""

  def __init__(self, monkeypatch, match: str, code: int = errno.ENOSPC,
               after: int = 0):
    self.match, self.code, self.left = match, code, after
    self.fds: set[int] = set()
    self._real = {"open": os.open, "write": os.write, "mkdir": os.mkdir,
                  "builtin": builtins.open}
    monkeypatch.setattr(os, "open", self._os_open)
    monkeypatch.setattr(os, "write", self._os_write)
    monkeypatch.setattr(os, "mkdir", self._mkdir)
    monkeypatch.setattr(builtins, "open", self._open)

  def _hit(self, path) -> bool:
    return isinstance(path, (str, os.PathLike)) and self.match in os.fspath(
        path)

  def _fails(self) -> bool:
    self.left -= 1
    return self.left < 0

  def _error(self, path=None):
    return OSError(self.code, os.strerror(self.code), *([path] if path else []))

  def _os_open(self, path, flags, *args, **kw):
    if (self._hit(path) and self.code == errno.EACCES and flags & os.O_CREAT
        and self._fails()):
      raise self._error(path)
    fd = self._real["open"](path, flags, *args, **kw)
    if self._hit(path):
      self.fds.add(fd)
    return fd

  def _os_write(self, fd, data):
    if fd in self.fds and self.code == errno.ENOSPC and self._fails():
      self._real["write"](fd, bytes(data)[:len(data) // 2])
      raise self._error()
    return self._real["write"](fd, data)

  def _mkdir(self, path, *args, **kw):
    if self._hit(path) and self.code == errno.EACCES and self._fails():
      raise self._error(path)
    return self._real["mkdir"](path, *args, **kw)

  def _open(self, file, mode="r", *args, **kw):
    writes = any(c in mode for c in "wax+")
    if (writes and self._hit(file) and self.code == errno.EACCES
        and self._fails()):
      raise self._error(file)
    f = self._real["builtin"](file, mode, *args, **kw)
    return _FaultyFile(f, self) if writes and self._hit(file) else f


class _FaultyFile:
  """A file object from ``open()`` whose writes ``Fault`` can fail."""

  def __init__(self, f, fault: Fault):
    self._f, self._fault = f, fault

  def write(self, data):
    if self._fault.code == errno.ENOSPC and self._fault._fails():
      self._f.write(data[:len(data) // 2])
      self._f.flush()
      raise self._fault._error()
    return self._f.write(data)

  def __getattr__(self, name):
    return getattr(self._f, name)

  def __iter__(self):
    return iter(self._f)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()


def rows(path) -> list[dict]:
  with open(path, newline="") as f:
    return [{k: v for k, v in r.items() if k != "wall_time_s"}
            for r in csv.DictReader(f)]


def stderr_lines(capfd) -> list[str]:
  return capfd.readouterr().err.splitlines()


def lingering(before: set) -> list[str]:
  """Threads started since ``before`` that keep the process from exiting
  (idle thread-pool workers end with the process and are left out)."""
  return [t.name for t in threading.enumerate()
          if t not in before and t.is_alive() and not t.daemon
          and not t.name.startswith(("asyncio_", "ThreadPoolExecutor"))]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """The uninterrupted run's folder."""
  out = tmp_path_factory.mktemp("whole") / "run"
  assert cli.main(TRAIN + ["--out", str(out)]) == 0
  return out


# ------------------------------------------------------------ lowbw train


def test_a_full_disk_in_metrics_csv_is_one_line_and_keeps_its_rows(
    whole, tmp_path, monkeypatch, capfd):
  out = tmp_path / "run"
  capfd.readouterr()
  before = set(threading.enumerate())
  Fault(monkeypatch, "metrics.csv", after=1 + 12)  # the header, 12 rows
  assert cli.main(TRAIN + ["--out", str(out)]) == 2
  assert stderr_lines(capfd) == [
      f"lowbw: error: cannot write {out}/metrics.csv: {NO_SPACE}; free "
      f"space and resume with --resume='{out}'"]
  assert not lingering(before)
  monkeypatch.undo()
  assert (out / "metrics.csv").read_text().endswith("\n")  # no cut row
  assert rows(out / "metrics.csv") == rows(whole / "metrics.csv")[:12]


@pytest.mark.parametrize("match, when", [
    ("tfevents", "mid-run"), ("summary.json", "at the end"),
    (os.sep + "checkpoints", "second checkpoint")])
def test_every_file_of_a_run_names_itself_when_the_disk_is_full(
    tmp_path, monkeypatch, capfd, match, when):
  out = tmp_path / "run"
  capfd.readouterr()
  before = set(threading.enumerate())
  # tfevents: its first events and 12 rows; checkpoints: its first save
  # (which orbax writes partly through open()) is left alone.
  fault = Fault(monkeypatch, match, after=13 if match == "tfevents" else 0)
  if when == "second checkpoint":
    fault.left = 10 ** 9
    real_save = _checkpoint.save

    def save(directory, step, *args, **kw):
      fault.left = 0 if step > 5 else 10 ** 9
      return real_save(directory, step, *args, **kw)
    monkeypatch.setattr(_checkpoint, "save", save)
  assert cli.main(TRAIN + ["--out", str(out)]) == 2
  lines = stderr_lines(capfd)
  assert len(lines) == 1, lines
  named = {"tfevents": f"{out}/tensorboard/events.out.tfevents.",
           "summary.json": f"{out}/summary.json",
           os.sep + "checkpoints": f"{out}/checkpoints:"}[match]
  assert lines[0].startswith(f"lowbw: error: cannot write {named}"), lines
  assert lines[0].endswith(f"{NO_SPACE}; free space and resume with "
                           f"--resume='{out}'"), lines
  assert not lingering(before)
  monkeypatch.undo()
  assert not glob.glob(str(out / "**" / "*.tmp"), recursive=True)
  assert not glob.glob(str(out / "checkpoints" / "*orbax-checkpoint-tmp*"))
  if match == "tfevents":  # whole records only, each one readable
    events = read_events(out / "tensorboard")
    assert max(e.step for e in events) == 12
  if when == "second checkpoint":  # the first one stays, to resume from
    assert sorted(os.listdir(out / "checkpoints")) == ["5"]


def read_events(folder) -> list:
  from tensorboardX.proto.event_pb2 import Event
  from tensorboardX.record_writer import masked_crc32c
  events = []
  for path in glob.glob(str(folder / "events.out.tfevents.*")):
    raw, i = open(path, "rb").read(), 0
    while i < len(raw):
      (n,) = struct.unpack("<Q", raw[i:i + 8])
      body = raw[i + 12:i + 12 + n]
      assert struct.unpack("<I", raw[i + 8:i + 12])[0] == masked_crc32c(
          raw[i:i + 8])
      assert struct.unpack("<I", raw[i + 12 + n:i + 16 + n])[0] == (
          masked_crc32c(body))
      events.append(Event.FromString(body))
      i += 16 + n
  return events


def test_a_checkpoint_folder_lost_mid_run_fails_at_once_without_a_stall(
    tmp_path):
  # Orbax's own folder for the second checkpoint cannot be made (EACCES):
  # the process must end as soon as the error is printed, not wait out
  # orbax's 300 s coordination timeout. A process of its own, as the stall
  # is in its exit.
  out = tmp_path / "run"
  script = textwrap.dedent(f"""
      import errno, os, sys
      from lowbw import cli
      real = os.mkdir
      def mkdir(path, *args, **kw):
        if "10.orbax-checkpoint-tmp" in os.fspath(path):
          raise PermissionError(errno.EACCES, "Permission denied", path)
        return real(path, *args, **kw)
      os.mkdir = mkdir
      sys.exit(cli.main({TRAIN + ["--out", str(out)]!r}))
      """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=200)
  assert done.returncode == 2
  assert done.stderr.splitlines() == [
      f"lowbw: error: cannot write {out}/checkpoints/10: Permission denied "
      f"(errno 13); make {out} writable and resume with --resume='{out}'"]


# ------------------------------------------------------------ resume


MLP = models.mlp(hidden=(8,))


def simulate(log_dir, **kw):
  return lowbw.simulate(
      model=MLP, data=data.digits(), strategy=strategies.diloco(
          optax.adam(1e-3), H=5), workers=2, batch_size=4, eval_every=5,
      log_every=1, checkpoint_every=5, progress=False, out=str(log_dir),
      **kw)


def test_resuming_after_a_full_disk_equals_an_uninterrupted_run(
    tmp_path, monkeypatch):
  whole = simulate(tmp_path / "whole", steps=20)
  part = tmp_path / "part"
  Fault(monkeypatch, "metrics.csv", after=1 + 12)
  with pytest.raises(OSError, match=re.escape(
      f"cannot write {part}/metrics.csv: {NO_SPACE}; free space and resume "
      f"with resume_from='{part}'")):
    simulate(part, steps=20)
  monkeypatch.undo()  # space freed
  resumed = simulate(part, steps=20, resume_from=str(part))
  keys = [k for k in whole.history if k != "wall_time_s"]
  chex.assert_trees_all_equal({k: whole.history[k] for k in keys},
                              {k: resumed.history[k] for k in keys})
  chex.assert_trees_all_equal(whole.params, resumed.params)
  chex.assert_trees_all_equal(whole.state, resumed.state)
  assert rows(part / "metrics.csv") == rows(tmp_path / "whole" /
                                            "metrics.csv")


# ------------------------------------------------------------ the writers


def test_a_csv_row_cut_short_by_a_full_disk_is_removed(tmp_path, monkeypatch):
  (tmp_path / "config.json").write_text("{}")  # a run's folder
  path = tmp_path / "sweep.csv"
  Fault(monkeypatch, "sweep.csv", after=2)  # the header and one row
  writer = _writers.CSVWriter(str(path), ["step", "loss"])
  writer.write({"step": 1, "loss": 0.5})
  with pytest.raises(OSError) as e:
    writer.write({"step": 2, "loss": 0.25})
  writer.close()
  monkeypatch.undo()
  assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
  assert str(e.value) == (
      f"cannot write {path}: {NO_SPACE}; free space and run again "
      f"with overwrite=True (it replaces what {tmp_path} holds)")
  assert path.read_text() == "step,loss\n1,0.5\n"


def test_the_hint_fits_the_folder_a_write_failed_in(tmp_path):
  """A study's point or table: run the study again (finished points
  resume; overwriting would clear them); a folder that holds no run (a
  plot's): only the cause."""
  study = tmp_path / "study"
  (study / "points" / "0002").mkdir(parents=True)
  (study / "study.json").write_text("{}")
  for folder in (study / "points" / "0002", study):
    error = telemetry.WriteError(str(folder / "metrics.csv"),
                                 OSError(errno.ENOSPC, "full"))
    assert error.hint == (f"free space and run the study again with the "
                          f"same out ({study}): its finished points resume")
  plain = telemetry.WriteError(str(tmp_path / "plot.png"),
                               OSError(errno.EACCES, "denied"))
  assert plain.hint == f"make {tmp_path} writable"


def test_a_json_file_that_cannot_be_replaced_keeps_its_old_copy(
    tmp_path, monkeypatch):
  path = tmp_path / "sweep.json"
  _writers.write_json(str(path), {"a": 1})
  Fault(monkeypatch, "sweep.json")
  with pytest.raises(OSError, match=re.escape(f"cannot write {path}: "
                                              f"{NO_SPACE}")):
    _writers.write_json(str(path), {"a": 2})
  monkeypatch.undo()
  assert json.loads(path.read_text()) == {"a": 1}
  assert os.listdir(tmp_path) == ["sweep.json"]  # no partial copy left


def test_a_log_folder_on_a_full_disk_is_refused_before_compiling(
    tmp_path, monkeypatch):
  Fault(monkeypatch, str(tmp_path / "out"))
  with pytest.raises(ValueError, match=r"^out=.* is invalid: is not "
                     r"writable \(No space left on device\)"):
    _logdir.prepare(str(tmp_path / "out"))


def test_third_party_logs_are_quiet_in_the_block_and_restored_after(
    caplog):
  orbax, jax_log = logging.getLogger("orbax.checkpoint"), logging.getLogger(
      "jax._src.x")
  with caplog.at_level(logging.INFO):
    with telemetry.quiet_logs():
      orbax.error("hidden")
      jax_log.warning("hidden")
      jax_log.error("shown")
    orbax.error("shown after")
  assert [r.getMessage() for r in caplog.records] == ["shown", "shown after"]


def test_write_errors_are_os_errors_naming_the_file():
  error = telemetry.WriteError("/x/metrics.csv", ValueError(
      "RESOURCE_EXHAUSTED: ... [os_error_code='28']"), "/x")
  assert isinstance(error, OSError) and error.errno == errno.ENOSPC
  assert str(error).startswith(f"cannot write /x/metrics.csv: {NO_SPACE}; "
                               "free space")
  assert error.filename == "/x/metrics.csv"


# ------------------------------------------------ a folder replaced mid-save


def _save_that_fails(monkeypatch, tmp_path, replace_folder: bool):
  """Orbax's save raises what it raised when the run's folder was replaced
  by a file while it wrote ("Event loop is closed", from whichever of its
  threads saw it first), after replacing the folder when asked."""
  import numpy as np
  import orbax.checkpoint as ocp
  from lowbw.telemetry import _checkpoint

  run = tmp_path / "run"
  folder = run / _checkpoint.CHECKPOINTS

  def save(self, *args, **kwargs):
    if replace_folder:
      import shutil
      shutil.rmtree(run)
      run.write_text("a file where the run's folder was\n")
    raise RuntimeError("Event loop is closed")

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  return lambda: _checkpoint.save(str(folder), 5, {"w": np.zeros(3)},
                                  {"rows": []})


def test_a_run_folder_replaced_by_a_file_mid_save_is_one_write_error(
    tmp_path, monkeypatch):
  # Orbax's words for it vary from run to run; the error names the
  # checkpoint and why (the folder is no longer a folder), never a traceback.
  save = _save_that_fails(monkeypatch, tmp_path, replace_folder=True)
  with pytest.raises(telemetry.WriteError) as raised:
    save()
  assert raised.value.filename == str(tmp_path / "run" / "checkpoints" / "5")
  assert raised.value.errno in (errno.ENOTDIR, errno.EEXIST)


def test_a_failed_save_the_disk_does_not_explain_is_raised_as_a_bug(
    tmp_path, monkeypatch):
  # The folder is fine: the RuntimeError is orbax's or lowbw's bug and keeps
  # its traceback rather than being reported as a disk fault.
  save = _save_that_fails(monkeypatch, tmp_path, replace_folder=False)
  with pytest.raises(RuntimeError, match="Event loop is closed"):
    save()


def test_a_run_folder_replaced_by_a_file_while_it_runs_is_one_write_error(
    tmp_path):
  # The run writes its rows into files it holds open: the next row finds
  # its metrics.csv gone with the folder. It used to end at the summary
  # with a bare "[Errno 17] File exists" from os.makedirs, the rows written
  # meanwhile lost without a word.
  out = tmp_path / "run"

  def replace_folder(row):
    if row["step"] == 10 and out.is_dir():
      import shutil
      shutil.rmtree(out)
      out.write_text("a file where the run's folder was\n")

  with pytest.raises(telemetry.WriteError) as raised:
    lowbw.simulate(model=MLP, data=data.digits(), strategy=strategies.diloco(
        optax.adam(1e-3), H=5), workers=2, batch_size=4, steps=20,
                   eval_every=5, log_every=5, progress=False,
                   out=str(out), callback=replace_folder)
  assert str(raised.value).startswith(
      f"cannot write {out / 'metrics.csv'}: it was deleted or replaced while "
      "the run wrote it")


def test_a_full_disk_while_preparing_a_corpus_names_the_file_and_leaves_no_meta(
    tmp_path, monkeypatch):
  """``meta.json`` is written last and atomically: a prepare that fails
  leaves a folder that is not taken for a prepared corpus (no 0-byte
  meta.json), and the error names the file and what to do."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(f"document {i} about low bandwidth training.\n\n"
                            for i in range(60)))
  out = tmp_path / "prepared"
  with monkeypatch.context() as m:
    Fault(m, "meta.json")
    with pytest.raises(ValueError, match=r"^out=.* cannot be written "
                       r"\(.*meta\.json\.part: No space left on device\); "
                       "free space"):
      data.prepare(str(corpus), str(out), vocab_size=300, val_fraction=0.2)
  assert not (out / "meta.json").exists()
  meta = data.prepare(str(corpus), str(out), vocab_size=300,
                      val_fraction=0.2)  # not refused: no corpus there yet
  assert json.loads((out / "meta.json").read_text()) == meta


def test_a_full_disk_at_the_tokenizer_copy_is_one_write_error(tmp_path,
                                                              monkeypatch):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(f"text {i} of a tiny corpus for a run.\n\n"
                            for i in range(80)))
  data.prepare(str(corpus), str(tmp_path / "p"), vocab_size=300,
               val_fraction=0.2)
  out = tmp_path / "run"
  with monkeypatch.context() as m:
    Fault(m, os.path.join("run", "tokenizer.json"))
    with pytest.raises(telemetry.WriteError) as raised:
      lowbw.simulate(lowbw.Config(
          data=str(tmp_path / "p"), model="gpt", layers=1, d_model=8,
          heads=2, seq_len=8, workers=2, batch_size=2, steps=2, H=2,
          eval_every=2, eval_examples=4, devices=1, progress=False,
          out=str(out)))
  assert raised.value.filename.startswith(str(out / "tokenizer.json"))
  assert NO_SPACE in str(raised.value)
  assert not (out / "tokenizer.json").exists()


@pytest.mark.parametrize("victim", ["metrics.csv", "tensorboard"])
def test_a_log_deleted_while_the_run_writes_it_is_an_error_naming_it(
    tmp_path, victim):
  """metrics.csv or the TensorBoard folder removed mid-run: the next row's
  write says which file is gone (it used to end with exit 0, the logs
  lost)."""
  out = tmp_path / "run"

  def delete(row):
    path = out / victim
    if row["step"] == 10 and path.exists():
      import shutil
      shutil.rmtree(path) if path.is_dir() else path.unlink()

  with pytest.raises(telemetry.WriteError) as raised:
    lowbw.simulate(model=MLP, data=data.digits(), strategy=strategies.diloco(
        optax.adam(1e-3), H=5), workers=2, batch_size=4, steps=20,
                   eval_every=5, log_every=5, progress=False,
                   out=str(out), callback=delete)
  assert victim in raised.value.filename
  assert "was deleted or replaced while the run wrote it" in str(
      raised.value)


@pytest.mark.parametrize("part", ["meta", "state"])
def test_a_checkpoint_missing_a_part_is_the_damaged_checkpoint_message(
    tmp_path, capsys, part):
  """A checkpoint whose meta/ (or state/) folder is gone: one line naming
  the step and what to do, not orbax's KeyError traceback."""
  out = tmp_path / "run"
  assert cli.main(TRAIN + ["--steps", "10", "--out", str(out)]) == 0
  import shutil
  shutil.rmtree(out / "checkpoints" / "10" / part)
  capsys.readouterr()
  assert cli.main(["train", "--resume", str(out)]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith(
      f"lowbw: error: --resume='{out}' is invalid: its checkpoint at step 10 "
      "cannot be read ("), err
  assert err[0].endswith("delete that step's folder under checkpoints/ to "
                         "resume from the one before")
