"""``lowbw bench`` and ``lowbw.bench.measure``: the figures are there, the
bytes and the state's memory are exact, bad flags are one-line errors.
(Speed itself is never asserted: it is measured, see docs/performance.md.)"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import bench, cli, data, models, strategies
from lowbw.simulation import build
from lowbw.simulation._backward import Backward

MLP = models.mlp(hidden=(8,))
P = 64 * 8 + 8 + 8 * 10 + 10  # digits: 8x8 inputs, 10 classes


@pytest.fixture(scope="module")
def figures():
  inner = optax.adamw(1e-3)
  return bench.measure(MLP, data.digits(), strategies.diloco(inner, H=2),
                       inner, workers=2, batch_size=4,
                       timing=bench.Timing(rounds=1, repeats=1, warmup=1))


def test_figures_are_measured(figures):
  f = figures
  assert f["workers"] == 2 and f["steps"] == 2 and f["num_params"] == P
  # The Timing was followed: one round per call, one timed call.
  assert f["rounds"] == 1 and len(f["efficiencies"]) == 1
  for key in ("worker_steps_per_s", "examples_per_s",
              "baseline_examples_per_s", "efficiency", "compile_s",
              "peak_bytes", "sync_s"):
    assert f[key] > 0, key
  assert f["examples_per_s"] == pytest.approx(4 * f["worker_steps_per_s"])
  assert f["tokens_per_s"] is None  # classification data
  # A share of timings: positive; its size is not asserted (a sync of this
  # 600-parameter model and the round it is timed against take tens of
  # microseconds, and a loaded test machine can put either above the other).
  assert 0 < f["sync_share"] < float("inf")


@pytest.mark.parametrize("kwargs, field", [
    ({"rounds": 1}, "rounds"),  # a Timing field given as a build setting
    ({"seed": 3}, "seed"),
    ({"timing": (1, 1, 1, True, 0)}, "timing"),  # not a Timing
])
def test_a_misplaced_timing_is_refused_before_building(kwargs, field):
  with pytest.raises(ValueError) as e:
    bench.measure(MLP, data.digits(), strategies.ddp(optax.sgd(0.1)),
                  optax.sgd(0.1), 2, 4, **kwargs)
  assert str(e.value).startswith(f"{field}=") and "\n" not in str(e.value)
  assert "Timing" in str(e.value)


def test_mfu_is_flops_per_token_times_tokens_over_the_device_peak(
    monkeypatch):
  assert bench.device_peak_flops() is None  # a CPU has no preset peak
  monkeypatch.setattr(bench, "device_peak_flops", lambda: 1e12)
  assert bench._mfu(1000.0, 6 * 5e5) == pytest.approx(3e9 / 1e12)
  assert bench._mfu(None, 6 * 5e5) is None


def test_the_baseline_takes_the_runs_precision_and_micro_batches():
  # The one replica computes in the run's autocast type and micro-batches
  # (bench.measure passes the run's Backward): it compiles and runs so.
  sim = build(MLP, data.digits(), strategies.ddp(optax.sgd(0.1)),
              workers=2, batch_size=4)
  _, sampler, _, _ = sim.initial(0)
  run = bench.baseline(MLP, sampler, optax.sgd(0.1), 8, 2, 0,
                       Backward(2, jnp.bfloat16))
  assert run() > 0


def test_bytes_and_state_are_exact(figures):
  # One DiLoCo sync per round: a ring all-reduce of P float32 values,
  # 2(W-1)/W x 4P bytes per worker.
  assert figures["wire_bytes_per_round"] == 2 * (2 - 1) / 2 * 4 * P
  # Per worker: parameters + AdamW's two moments (float32) + its int32 count.
  assert figures["theoretical_per_worker"] == 3 * 4 * P + 4


def test_cli_table_and_json(tmp_path, capsys):
  out = tmp_path / "b.json"
  code = cli.main(["bench", "--model", "mlp", "--hidden", "8", "--workers",
                   "2", "--H", "2", "--batch-size", "4", "--repeats", "1",
                   "--json-out", str(out)])
  assert code == 0
  table = capsys.readouterr().out
  assert "efficiency" in table and "baseline" in table
  # A CPU keeps no allocator peak: the table says so, the JSON holds null.
  assert ("memory estimate vs measured peak: none measured, this backend "
          "(1 x cpu) reports no device peak") in table
  saved = json.loads(out.read_text())
  (row,) = saved["configurations"]
  assert row["workers"] == 2 and row["wire_bytes_per_round"] == 4 * P
  assert row["device_peak_bytes"] is None
  assert row["estimate_over_device_peak"] is None
  assert row["memory_estimate_bytes"] > 0


def test_data_of_your_own_sets_the_model_shapes(tmp_path, capsys):
  # 5 features and 3 classes: an MLP with hidden 8 has 5*8+8 + 8*3+3 = 75
  # parameters (610 on the digits).
  rng = np.random.default_rng(0)
  path = tmp_path / "d.npz"
  np.savez(path, x=rng.normal(size=(64, 5)).astype(np.float32),
           y=rng.integers(0, 3, 64).astype(np.int32))
  out = tmp_path / "b.json"
  code = cli.main(["bench", "--model", "mlp", "--hidden", "8", "--data",
                   str(path), "--workers", "2", "--H", "2", "--batch-size",
                   "4", "--repeats", "1", "--json-out", str(out)])
  assert code == 0, capsys.readouterr().err
  (row,) = json.loads(out.read_text())["configurations"]
  assert row["num_params"] == 75


def test_a_missing_data_path_names_the_flag(tmp_path, capsys):
  code = cli.main(["bench", "--model", "mlp", "--data",
                   str(tmp_path / "none.npz"), "--workers", "2"])
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("lowbw: error: --data="), err


def test_an_unknown_strategy_is_a_usage_error(capsys):
  assert cli.main(["bench", "--strategy", "nope"]) == 2
  assert ("--strategy='nope' is invalid: expected one of" in
          capsys.readouterr().err)


@pytest.mark.parametrize("argv, flag", [
    (["--workers", "0"], "--workers"),
    (["--workers", "2,x"], "--workers"),
    (["--repeats", "0"], "--repeats"),
    (["--devices", "0"], "--devices"),
    (["--workers", "4", "--worker-batch", "3"], "--worker-batch"),
    (["--workers", "2", "--worker-dtype", "fp8"], "--worker-dtype"),
])
def test_bad_flags_are_one_line_errors(argv, flag, capsys):
  code = cli.main(["bench", "--model", "mlp", "--hidden", "8", *argv])
  err = capsys.readouterr().err
  assert code == 2
  assert err.startswith(f"lowbw: error: {flag}=") and err.count("\n") == 1, err


@pytest.mark.parametrize("flag, name", [("--json-out", "b.json"),
                                        ("--plot", "b.png")])
def test_an_unwritable_output_is_refused_before_measuring(tmp_path, capsys,
                                                          flag, name):
  regular = tmp_path / "file"
  regular.write_text("")
  path = str(regular / name)  # under a regular file: never writable
  code = cli.main(["bench", "--model", "mlp", "--hidden", "8", "--workers",
                   "2", flag, path])
  err = capsys.readouterr().err
  assert code == 2
  assert err == (f"lowbw: error: {flag}={path!r} is invalid: cannot be "
                 "written (Not a directory)\n")  # one line, nothing measured


def test_a_plot_file_matplotlib_cannot_write_is_refused(tmp_path, capsys):
  path = str(tmp_path / "b.txt")
  assert cli.main(["bench", "--model", "mlp", "--plot", path]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"lowbw: error: --plot={path!r} is invalid: "
                        "expected an image file ending in .png")
  assert err.count("\n") == 1


def test_checking_an_output_leaves_no_file(tmp_path, capsys):
  out = tmp_path / "b.json"
  assert cli.main(["bench", "--model", "mlp", "--json-out", str(out),
                   "--workers", "0"]) == 2
  assert "--workers=" in capsys.readouterr().err and not out.exists()


def test_a_failed_final_write_names_the_flag(tmp_path, capsys, monkeypatch,
                                             figures):
  from lowbw.cli import _bench
  # The folder goes away while the benchmark runs: the early check passes.
  monkeypatch.setattr(_bench, "_check_outputs", lambda args: None,
                      raising=False)
  monkeypatch.setattr(_bench, "_child", lambda s, w: dict(figures))
  path = str(tmp_path / "gone" / "b.json")
  code = cli.main(["bench", "--model", "mlp", "--hidden", "8", "--workers",
                   "2", "--H", "2", "--batch-size", "4", "--json-out", path])
  captured = capsys.readouterr()
  assert code == 2 and "efficiency" in captured.out
  assert captured.err.splitlines()[-1] == (
      f"lowbw: error: --json-out={path!r} is invalid: cannot be written (No such "
      "file or directory)")


def test_the_estimate_is_set_against_the_allocators_peak():
  # Where the backend keeps a peak (a GPU's allocator): the peak above what
  # was in use before the build, and the plan's estimate over it.
  from types import SimpleNamespace
  from lowbw.cli._bench import estimate_line
  memory = SimpleNamespace(device=True, used=lambda peak: peak - 1_000)
  sim = SimpleNamespace(memory=SimpleNamespace(estimate_bytes=9_000.0))
  got = bench._estimate_against_peak(sim, memory, 11_000)
  assert got == {"device_peak_bytes": 10_000,
                 "estimate_over_device_peak": 0.9}
  cpu = SimpleNamespace(device=False)
  assert bench._estimate_against_peak(sim, cpu, 11_000) == {
      "device_peak_bytes": None, "estimate_over_device_peak": None}
  rows = [{"workers": 8, "device": "1 x NVIDIA H200",
           "memory_estimate_bytes": 9e9, **got, "device_peak_bytes": 1e10,
           "estimate_over_device_peak": 0.9}]
  assert estimate_line(rows).endswith("W=8 9,000.0 / 10,000.0 MB (0.90)")


def test_the_sync_is_timed_on_the_runs_own_state():
  # bfloat16 workers: the sync computes in float32 and its result is cast
  # back, so the run goes on from a state of the stored types.
  inner = optax.sgd(0.1)
  sim = build(MLP, data.digits(), strategies.diloco(inner, H=2), workers=2,
              batch_size=4, steps=2, rounds_per_chunk=1, compile=False,
              worker_dtype="bfloat16")
  state, sampler, _, _ = sim.initial(0)
  exe, state = sim.executables(state, sampler, None)
  types = [x.dtype for x in jax.tree.leaves(state.strategy)]
  seconds, state = bench._time_sync(sim, state, 1)
  assert seconds > 0
  assert [x.dtype for x in jax.tree.leaves(state.strategy)] == types
  assert jnp.bfloat16 in types
  state, out = exe.chunk(state, sampler, 1, None)
  assert np.all(np.isfinite(np.asarray(jax.tree.leaves(state.strategy)[0],
                                       np.float32)))
