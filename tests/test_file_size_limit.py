"""A checkpoint over the process's file-size limit (``ulimit -f``) is one
error line naming the checkpoint and the remedy, never a traceback (orbax's
writers report "Event loop is closed" when a save fails under them).

The limit is real (``RLIMIT_FSIZE`` in a child process); SIGXFSZ is
ignored there, so a write past the limit fails with EFBIG instead of
killing the process. Before orbax's late callbacks were dropped
(``_checkpoint._late_callbacks_dropped``), 2 of 7 such runs printed 44 and
57 tracebacks under the error line."""

import errno
import os
import resource
import subprocess
import sys

import pytest

LIMIT = 20_000   # the logs fit; a checkpoint of this model does not
TRAIN = ["train", "--data", "digits", "--hidden", "64", "--workers", "2",
         "--batch-size", "4", "--steps", "10", "--H", "5", "--eval-every", "5",
         "--checkpoint-every", "5", "--no-progress"]


# Set in the child itself (a preexec_fn would run in a fork of this
# multithreaded process), then lowbw in its place.
LIMITED = f"""
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
os.execv(sys.executable, [sys.executable, "-m", "lowbw", *sys.argv[1:]])
"""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"),
                    reason="no file-size limit on this system")
def test_a_checkpoint_over_the_file_size_limit_is_one_line(tmp_path):
  out = tmp_path / "run"
  # The compilation cache's files would meet the limit first.
  env = {**os.environ, "LOWBW_COMPILE_CACHE": "0"}
  proc = subprocess.run([sys.executable, "-c", LIMITED, *TRAIN, "--out",
                         str(out)], env=env, capture_output=True, text=True,
                        timeout=600)
  err = proc.stderr
  assert proc.returncode == 2, err[-3000:]
  assert err.count("\n") == 1, err[-3000:]
  assert "Traceback" not in err and "Event loop is closed" not in err
  checkpoint = os.path.join(out, "checkpoints", "5")
  assert err.startswith(f"lowbw: error: cannot write {checkpoint}"), err
  assert f"(errno {errno.EFBIG})" in err
  assert "raise the file-size limit (ulimit -f)" in err
  # What was logged before the checkpoint stays, whole.
  rows = (out / "metrics.csv").read_text().splitlines()
  assert rows[0].startswith("step,") and len(rows) >= 2
  assert not os.path.exists(checkpoint)  # its partial copy is removed
