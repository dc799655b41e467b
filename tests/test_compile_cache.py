"""The persistent compilation cache lowbw turns on: where, how to opt out,
and that a second process loads what the first compiled."""

import os
import subprocess
import sys

import pytest

import lowbw
from lowbw import data, models, strategies
from lowbw.simulation import _compile_cache

_SCRIPT = """
import sys, time, jax, lowbw
from lowbw import data, models, strategies
start = time.perf_counter()
lowbw.build(models.mlp(hidden=(8,), num_classes=10), data.digits(),
            strategies.diloco(H=2), workers=2, batch_size=4, steps=4,
            compile=sys.argv[1] == "compile")
print(jax.config.jax_compilation_cache_dir or "off")
"""


def _run(env_value, compile=True):
  env = {**os.environ, "LOWBW_COMPILE_CACHE": env_value, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", _SCRIPT,
                        "compile" if compile else "no"], env=env, check=True,
                       capture_output=True, text=True, timeout=300)
  return out.stdout.strip().splitlines()[-1]


def test_a_fresh_process_writes_the_cache_and_opting_out_leaves_none(tmp_path):
  folder = tmp_path / "xla"
  assert _run(str(folder)) == str(folder)
  written = sorted(os.listdir(folder))
  assert any(name.endswith("-cache") for name in written)

  def access_times():  # JAX stamps an entry's "-atime" file when read
    return {n: (folder / n).read_bytes() for n in written
            if n.endswith("-atime")}

  before = access_times()
  # Another process with the same configuration reads every entry. (It may
  # add some: a small program that compiled under the 0.2 s threshold in the
  # first process can take longer on a loaded machine and be written now.)
  assert _run(str(folder)) == str(folder)
  assert set(written) <= set(os.listdir(folder))
  after = access_times()
  assert before and all(after[n] != before[n] for n in before)
  # A build turns the cache on before it compiles, compiling or not: the
  # opt-out is read without a cold compile of its own.
  assert _run("0", compile=False) == "off"


def test_default_folder_and_errors(monkeypatch, tmp_path):
  monkeypatch.setenv("LOWBW_COMPILE_CACHE", "off")
  assert _compile_cache.default_dir() is None
  monkeypatch.delenv("LOWBW_COMPILE_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert _compile_cache.default_dir() == str(tmp_path / "lowbw" / "xla")
  assert _compile_cache.check(False) is False
  assert _compile_cache.check(tmp_path) == str(tmp_path)
  with pytest.raises(ValueError, match="compile_cache=3.*True, False or a"):
    _compile_cache.check(3)
  # Through the API, at build time, before anything compiles.
  with pytest.raises(ValueError, match="compile_cache=''.*True, False or a"):
    lowbw.build(models.mlp(hidden=(4,), num_classes=10), data.digits(),
                strategies.ddp(), workers=2, batch_size=2, steps=2,
                compile=False, compile_cache="")
