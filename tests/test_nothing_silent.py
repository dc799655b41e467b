"""Runs that cannot mean much say so, and log folders are checked before
anything compiles (degenerate runs, output folders, seeds)."""

import json
import os

import jax
import numpy as np
import pytest

import lowbw
from lowbw import cli, data, models, network, strategies
from lowbw.strategies import _optim

_RUN = dict(model=models.mlp(hidden=(8,)), data=data.digits(),
            strategy=strategies.diloco(H=5), workers=2, batch_size=4,
            steps=10, progress=False)
_TINY = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "10", "--H", "5", "--eval-every",
         "5", "--no-progress"]


def _faults(**kwargs):
  return network.network("1Gbps", "10ms", faults=network.Faults(**kwargs))


def test_every_worker_down_is_a_loud_degenerate_run(tmp_path):
  with pytest.warns(lowbw.RunWarning, match="2 of 2 communications had no "
                    "participating worker.*degenerate"):
    down = lowbw.simulate(**_RUN, network=_faults(drop_prob=1.0),
                          out=str(tmp_path / "down"))
  assert down.summary["degenerate"] is True
  saved = json.loads((tmp_path / "down" / "summary.json").read_text())
  assert saved["degenerate"] is True and saved["warnings"]
  # The shared model never moved: every sync averaged nobody.
  start = _build().initial(0)[0].strategy.params_W  # every worker alike
  for got, first in zip(jax.tree.leaves(down.params), jax.tree.leaves(start)):
    np.testing.assert_array_equal(got, first[0])


def _build(**changes):
  args = {k: v for k, v in {**_RUN, **changes}.items() if k != "progress"}
  return lowbw.build(**args, compile=False)


def test_a_healthy_run_has_no_warnings():
  ok = lowbw.simulate(**_RUN, network=_faults(drop_prob=0.0))
  assert ok.summary["degenerate"] is False and ok.summary["warnings"] == []


def test_every_worker_failing_warns_on_the_command_line(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(_TINY + ["--failures", "0@0,1@0", "--out", str(out)]) == 0
  captured = capsys.readouterr()
  assert "WARNING           2 of 2 communications" in captured.out
  assert "lowbw: warning: 2 of 2 communications" in captured.err
  assert json.loads((out / "summary.json").read_text())["degenerate"]


def test_a_folder_holding_another_run_is_refused_unless_overwritten(
    tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(_TINY + ["--out", str(out)]) == 0
  (out / "notes.txt").write_text("mine")
  old_events = set(os.listdir(out / "tensorboard"))
  for name in old_events:  # marked: a file named alike in the same second
    with open(out / "tensorboard" / name, "ab") as f:
      f.write(b"OLD-RUN")
  capsys.readouterr()
  assert cli.main(_TINY + ["--out", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f"lowbw: error: --out='{out}' is invalid: holds "
                        "another run (config.json, metrics.csv"), err
  assert "--overwrite" in err and "\n" not in err
  assert cli.main(_TINY + ["--out", str(out), "--overwrite"]) == 0
  events = set(os.listdir(out / "tensorboard"))
  assert len(events) == 1  # one run's events: the old file is gone
  assert all(b"OLD-RUN" not in (out / "tensorboard" / n).read_bytes()
             for n in events)
  assert (out / "notes.txt").read_text() == "mine"  # not ours: kept


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_text("x"), "exists and is not a folder"),
    (lambda p: None, "cannot be created"),
])
def test_a_log_folder_that_cannot_be_written_is_refused_before_compiling(
    tmp_path, make, message):
  target = tmp_path / "file"
  make(target)
  log_dir = target if message.startswith("exists") else target / "a"
  if not message.startswith("exists"):
    target.write_text("a file where a folder should be")
  sim = _build()
  with pytest.raises(ValueError, match=f"out=.* is invalid: {message}"):
    sim.run(out=str(log_dir))
  assert sim.take_compile_s() == 0.0  # refused before compiling


@pytest.mark.parametrize("seed", [-1, 2 ** 32, 99999999999999999999, 1.5])
def test_seeds_outside_the_generators_range_are_refused(seed):
  sim = _build()
  with pytest.raises(ValueError, match=r"seed=.* is invalid: expected an "
                     r"integer in \[0, 2\*\*32\)"):
    sim.run(seed=seed)


def test_fewer_steps_than_one_round_is_an_error():
  with pytest.raises(ValueError, match="steps=4 is invalid: the strategy "
                     "syncs every 5 steps"):
    _build(steps=4)


def test_data_with_nan_features_is_refused_with_the_example():
  x = np.ones((20, 3), np.float32)
  x[7, 1] = np.nan
  with pytest.raises(ValueError, match=r"x=.* is invalid: expected finite "
                     r"features; 1 example\(s\) hold NaN .* example 7"):
    data.arrays(x, np.zeros(20, int))


def test_a_garbage_npz_is_named_without_suggesting_pickles(tmp_path, capsys):
  bad = tmp_path / "bad.npz"
  bad.write_bytes(b"not an archive at all")
  with pytest.raises(ValueError, match="not a readable .npy or .npz") as e:
    data.arrays(str(bad))
  assert "allow_pickle" not in str(e.value)
  # On the command line, under --data (not under lowbw plot's --x/--y).
  assert cli.main(_TINY + ["--data", str(bad), "--out",
                           str(tmp_path / "r")]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"lowbw: error: --data='{bad}' is invalid: "), err
  assert "--x" not in err and not (tmp_path / "r").exists()


def test_a_loss_not_finite_from_the_first_step_blames_data_or_model():
  base = models.mlp(hidden=(8,))

  def loss(params, batch, key):
    value, metrics = base.loss(params, batch, key)
    return value * np.nan, metrics

  broken = models.Model(base.init, loss, "classification", "custom", {})
  with pytest.raises(lowbw.NonFiniteLossError, match="step 1 .* the data or "
                     "the model rather than the learning rate"):
    lowbw.simulate(**{**_RUN, "model": broken})


def test_off_a_terminal_each_logged_row_is_a_line_and_csv_ends_lines_lf(
    tmp_path, capsys):
  out = tmp_path / "run"
  argv = [a for a in _TINY if a != "--no-progress"]
  assert cli.main(argv + ["--log-every", "5", "--out", str(out)]) == 0
  # What it does at once (loading, compiling), then one line per row.
  lines = [line for line in capsys.readouterr().out.splitlines()
           if not line.startswith("lowbw: ")]
  assert lines[0].startswith("step 5/10  train_loss ")
  assert lines[1].startswith("step 10/10  train_loss ")
  assert "eval_loss" in lines[1] and "sent " in lines[1]
  raw = (out / "metrics.csv").read_bytes()
  assert b"\r\n" not in raw and raw.count(b"\n") == 3  # header + 2 rows


def test_plot_goes_next_to_the_run_with_units_by_magnitude(tmp_path, capsys):
  pytest.importorskip("matplotlib")
  from lowbw.cli import _plot
  out = tmp_path / "run"
  assert cli.main(_TINY + ["--out", str(out)]) == 0
  capsys.readouterr()
  assert cli.main(["plot", str(out), "--x", "sim_time_s"]) == 0
  printed = capsys.readouterr().out
  assert (out / "plot.png").exists() and str(out / "plot.png") in printed
  assert "against simulated time (s)" in printed or "(ms)" in printed
  assert _plot.axis_unit("sim_time_s", 3 * 3600) == ("simulated time (h)",
                                                     1 / 3600)
  assert _plot.axis_unit("sim_time_s", 40.0) == ("simulated time (s)", 1.0)
  assert _plot.axis_unit("wire_bytes", 3e6)[0] == "wire bytes per worker (MB)"
  assert _plot._title([str(out)]) == "diloco, W=2, H=5"


def test_resume_help_lists_every_setting_that_may_change():
  from lowbw.cli import _train
  train = cli.build_parser()._subparsers._group_actions[0].choices["train"]
  (resume,) = [a for a in train._actions if a.dest == "resume"]
  for name in _train.RESUME_MAY_CHANGE:
    assert "--" + name.replace("_", "-") in resume.help


def test_optax_multisteps_is_accepted_as_an_inner_optimizer():
  import optax
  wrapped = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2)
  run = {**_RUN, "strategy": strategies.diloco(inner=wrapped, H=5)}
  got = lowbw.simulate(**run)
  same = lowbw.simulate(**{**run, "strategy": strategies.diloco(
      inner=wrapped.gradient_transformation(), H=5)})
  start = _build().initial(0)[0].strategy.params_W
  for a, b, first in zip(jax.tree.leaves(got.params),
                         jax.tree.leaves(same.params),
                         jax.tree.leaves(start)):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, f[0]) for a, f in
             zip(jax.tree.leaves(got.params), jax.tree.leaves(start)))


def test_a_checkpoint_from_four_devices_resumes_in_a_one_device_process(
    tmp_path):
  """docs/scale.md: a run may resume on a different number of devices. The
  checkpoint is written by a process that sees 4 devices; this process sees
  one (orbax used to refuse: "Topology mismatch")."""
  import csv
  import subprocess
  import sys
  first, whole = tmp_path / "first", tmp_path / "whole"
  args = ["--data", "digits", "--hidden", "8", "--workers", "4",
          "--batch-size", "4", "--H", "5", "--eval-every", "10",
          "--no-progress"]
  env = {**os.environ, "XLA_FLAGS": os.environ.get(
      "LOWBW_TEST_FAST_COMPILE", "") + " --xla_force_host_platform_device_count=4"}
  subprocess.run([sys.executable, "-m", "lowbw", "train", *args, "--steps",
                  "10", "--devices", "4", "--checkpoint-every", "10",
                  "--out", str(first)], check=True, env=env, timeout=300,
                 capture_output=True)
  assert jax.device_count() == 1
  assert cli.main(["train", "--resume", str(first), "--steps", "20",
                   "--devices", "1", "--no-progress"]) == 0
  assert cli.main(["train", *args, "--steps", "20", "--out", str(whole)]) == 0

  def rows(folder):
    with open(folder / "metrics.csv") as f:
      return list(csv.DictReader(f))

  resumed, uninterrupted = rows(first), rows(whole)
  assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted]
  for a, b in zip(resumed, uninterrupted):
    assert a["wire_bytes"] == b["wire_bytes"]
    for key in ("train_loss", "eval_loss", "sim_time_s"):
      if a[key] or b[key]:  # 4 devices sum in another order: float tolerance
        np.testing.assert_allclose(float(a[key]), float(b[key]), rtol=1e-5)


def test_row_means_are_exact_sums_rounded_once():
  """Finding 5: a resume re-spaces rows by merging their sums, so a row's
  mean must not depend on how its steps were grouped. A float64 running sum
  loses the 1 in 2**60 + 1 - 2**60; the exact sum does not, over any split."""
  from fractions import Fraction

  from lowbw.simulation import _sums
  wide = np.array([2.0 ** 60, 1.0, -2.0 ** 60, 3.0], np.float32)
  assert float(np.cumsum(wide.astype(np.float64))[2]) == 0.0
  cum = _sums.ExactCumsum(wide)
  assert cum.span(-1, 2) == 1 and cum.span(0, 3) == 4 - 2 ** 60
  rng = np.random.default_rng(0)
  losses = (rng.lognormal(size=1000) * 3).astype(np.float32)
  cum = _sums.ExactCumsum(losses)
  reference = sum(map(Fraction, losses[100:700].tolist()), Fraction(0))
  assert cum.span(99, 699) == reference
  assert _sums.mean(cum.span(99, 399) + cum.span(399, 699), 600) == float(
      reference / 600)
  assert not _sums.ExactCumsum([1.0, np.nan]).exact


def test_clock_params_prices_compute_and_messages_as_a_larger_model(tmp_path):
  net = dict(bandwidth="100Mbps", latency="0ms", hardware="h100",
             profile="ideal")  # linear in the bytes: no per-call cost
  small = lowbw.simulate(**_RUN, network=network.network(**net))
  n = small.summary["num_params"]
  big = lowbw.simulate(**_RUN, network=network.network(
      **net, clock_params=f"{1000 * n / 1e6}M"))
  a, b = small.config["network"], big.config["network"]
  assert b["clock_params"] == 1000 * n
  assert b["compute_s_per_step"] == pytest.approx(1000 * a["compute_s_per_step"],
                                                  rel=1e-12)
  for name, seconds in a["comm_s_per_event"].items():  # no latency: linear
    assert b["comm_s_per_event"][name] == pytest.approx(1000 * seconds,
                                                        rel=1e-9)
  # The bytes counted stay the model's; only the clock is scaled.
  assert big.summary["wire_bytes"] == small.summary["wire_bytes"]
  assert big.summary["sim_time_s"] == pytest.approx(
      1000 * small.summary["sim_time_s"], rel=1e-5)
  # The split of the nominal time: compute per step x steps + messages.
  assert small.summary["compute_s"] == pytest.approx(
      10 * a["compute_s_per_step"])
  assert small.summary["comm_share"] == pytest.approx(
      small.summary["comm_s"] / (small.summary["comm_s"] +
                                 small.summary["compute_s"]))
  with pytest.raises(ValueError, match="clock_params='1X' is invalid"):
    network.network(**net, clock_params="1X")


def test_stragglers_on_a_communication_bound_clock_are_a_warning(capsys,
                                                                 tmp_path):
  assert cli.main(_TINY + ["--jitter", "0.5", "--out", str(tmp_path / "r")]
                  ) == 0
  out = capsys.readouterr().out
  assert "time per step     compute " in out
  assert "stragglers and jitter, which slow compute, barely change" in out


def test_sizes_beyond_int32_negative_rates_and_nan_jitter_are_refused():
  with pytest.raises(ValueError, match=r"workers=2147483648 is invalid: "
                     r"expected an integer below 2\*\*31"):
    _build(workers=2 ** 31)
  with pytest.raises(ValueError, match=r"inner_lr=-1.0 is invalid: expected "
                     r"a finite number > 0"):
    _build().run(hparams={"inner_lr": -1.0})
  for bad in (float("inf"), float("nan")):
    with pytest.raises(ValueError, match=r"inner_lr=.* is invalid: expected "
                       "a finite number > 0"):
      _optim.inner(_optim.Optimizer("adamw", bad))  # what the CLI builds
  with pytest.raises(ValueError, match="jitter=nan is invalid"):
    _build(network=network.network(stragglers=network.Stragglers(
        jitter=float("nan"))))


def test_a_memory_refusal_names_memory_budget_when_given_as_a_share(
    monkeypatch):
  from lowbw.config import _resources
  monkeypatch.setattr(_resources, "free_bytes", lambda: (1e5, "host memory"))
  with pytest.raises(ValueError, match=r"^memory_budget=.* is invalid: the "
                     r"run needs about .*\(50% of the 100 kB"):
    _build(memory_budget="50%")
  with pytest.raises(ValueError, match=r"^too big for memory: .*or give "
                     "memory_budget$"):
    _build()


def test_clock_params_of_a_network_built_by_hand_are_checked():
  net = network.network()._replace(clock_params="1B")
  assert _build(network=net).config.network.clock_params == 1e9
  with pytest.raises(ValueError, match="clock_params='lots' is invalid"):
    _build(network=net._replace(clock_params="lots"))
