"""Two processes that write one table at once (two ``lowbw sweep`` of one
study, each writing ``study.csv`` when its points are done) each write a
temporary file of their own and rename it: both succeed, and the table is
one of the two, whole. With one temporary name for both, the second
process truncated the first's temporary file and the first's rename then
found it gone ("cannot write study.csv: No such file or directory")."""

import os

from lowbw.telemetry import _writers


def test_a_second_process_writing_the_same_table_meanwhile(tmp_path,
                                                           monkeypatch):
  path = str(tmp_path / "study.csv")
  real_pid, real_kill_point = os.getpid(), _writers.kill_point
  done = []

  def other_process_meanwhile(name):
    # Between this process's write of its temporary file and its rename,
    # another process (another pid) writes the same table completely.
    if name == "replace" and not done:
      done.append(True)
      monkeypatch.setattr(os, "getpid", lambda: real_pid + 1)
      _writers.write_bytes(path, b"the other process's table\n")
      monkeypatch.setattr(os, "getpid", lambda: real_pid)
    real_kill_point(name)

  monkeypatch.setattr(_writers, "kill_point", other_process_meanwhile)
  _writers.write_bytes(path, b"this process's table\n")
  assert done
  with open(path, "rb") as f:
    assert f.read() == b"this process's table\n"   # the last rename's
  assert os.listdir(tmp_path) == ["study.csv"]      # no temporary left
