"""Build once, run many: ``lowbw.build`` / ``Simulator.run`` reuse one
compilation; ``lowbw.sweep`` runs a grid of traced values and seeds as one
vmapped axis, and each point equals the single run with its values."""

import csv
import os

import jax
import jax.monitoring
import numpy as np
import optax
import pytest

import lowbw
from lowbw import cli, data, models, network, strategies, transforms

W, B, H = 4, 8, 3
MLP = models.mlp(hidden=(16,), num_classes=4)


def toy_arrays(n, seed=0, dim=6):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
  return x, y


SOURCE = data.arrays(*toy_arrays(128), eval=toy_arrays(40, seed=99))


def adamw(lr):
  return optax.inject_hyperparams(optax.adamw)(learning_rate=lr,
                                               weight_decay=0.1)


def outer(lr, momentum=0.9):
  return optax.inject_hyperparams(optax.sgd)(learning_rate=lr,
                                             momentum=momentum, nesterov=True)


def diloco(inner_lr=1e-2, outer_lr=0.7, **kw):
  return strategies.diloco(adamw(inner_lr), outer(outer_lr), H=H, **kw)


NET = network.network("100Mbps", "20ms", hardware="0.01s",
                      faults=network.Faults(drop_prob=0.2))
STEPS = 3 * H + 2  # two steps of tail


def build(strategy=None, net=NET, **kw):
  return lowbw.build(model=MLP, data=SOURCE, strategy=strategy or diloco(),
                     workers=W, batch_size=B, steps=STEPS, network=net,
                     eval_every=H, **kw)


def single(strategy, seed, net=NET):
  return lowbw.simulate(model=MLP, data=SOURCE, strategy=strategy,
                        workers=W, batch_size=B, steps=STEPS, seed=seed,
                        network=net, eval_every=H, progress=False)


HISTORY = ("train_loss", "eval_loss", "lr", "payload_bytes", "wire_bytes",
           "sim_time_s", "sync_workers", "worker_divergence")


def assert_same_run(got_history, got_params, want, rtol=2e-5):
  for name in HISTORY:
    np.testing.assert_allclose(got_history[name], want.history[name],
                               rtol=rtol, atol=1e-6, equal_nan=True,
                               err_msg=name)
  for a, b in zip(jax.tree.leaves(got_params), jax.tree.leaves(want.params)):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6)


@pytest.fixture(scope="module")
def sim():
  return build()


class _Compiles:
  """Counts XLA compilations while active."""

  def __enter__(self):
    self.events = []
    self._listener = lambda event, *_, **__: self.events.append(event) if (
        "backend_compile" in event) else None
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)


# ------------------------------------------------------------ build / run
def test_runs_with_new_values_do_not_compile_and_equal_fresh_runs(sim):
  sim.run(seed=0, hparams={"inner_lr": 2e-2, "bandwidth": "1Gbps"},
          progress=False)  # warms the host-side helpers too
  compiled = sim.compilations
  with _Compiles() as c:
    got = sim.run(seed=3, hparams={"inner_lr": 5e-3, "outer_lr": 0.5,
                                   "outer_momentum": 0.5,
                                   "bandwidth": "10Mbps", "latency": "80ms",
                                   "drop_prob": 0.4}, progress=False)
  assert not c.events and sim.compilations == compiled
  assert got.summary["compile_s"] == 0.0
  # Built and traced for an earlier run: nothing of that is this run's.
  startup = got.summary["startup"]
  assert startup["build_s"] == startup["trace_s"] == 0.0
  assert startup["compile_load_s"] == 0.0 and startup["initial_state_s"] > 0
  want = single(strategies.diloco(adamw(5e-3), outer(0.5, 0.5), H=H), 3,
                network.network("10Mbps", "80ms", hardware="0.01s",
                                faults=network.Faults(drop_prob=0.4)))
  assert_same_run(got.history, got.params, want)
  assert got.config["hparams"]["bandwidth"] == "10Mbps"
  assert got.config["network"]["bandwidth_bps"] == 1e7


def test_simulate_is_build_then_run(sim):
  got = sim.run(seed=1, progress=False)
  want = single(diloco(), 1)
  assert_same_run(got.history, got.params, want, rtol=0)


# ------------------------------------------------------------------- sweep
def test_each_sweep_point_equals_its_single_run(sim):
  grid = {"inner_lr": [3e-3, 2e-2], "bandwidth": ["10Mbps", "1Gbps"]}
  result = lowbw.sweep(sim, grid=grid, seeds=[0, 5], points_per_batch=8,
                       progress=False)
  assert result.summary["points_per_batch"] == 8  # one vmapped program
  assert [p.values for p in result.points[:2]] == [
      {"inner_lr": 3e-3, "bandwidth": "10Mbps"}] * 2
  assert [p.seed for p in result.points] == [0, 5] * 4
  for p in result.points[::3]:  # a spread of values and seeds
    want = sim.run(seed=p.seed, hparams=p.values, progress=False)
    assert_same_run(p.history, p.params, want)
    assert p.summary["payload_bytes"] == want.summary["payload_bytes"]
  # The slower link shows on the clock and nowhere else.
  slow, fast = result.points[0], result.points[2]
  assert slow.history["sim_time_s"][-1] > fast.history["sim_time_s"][-1]
  np.testing.assert_array_equal(slow.history["train_loss"],
                                fast.history["train_loss"])


def test_points_per_batch_pads_and_gives_the_same_points(sim):
  grid = {"outer_lr": [0.3, 0.6, 0.9]}
  whole = lowbw.sweep(sim, grid=grid, points_per_batch=3, progress=False)
  parts = lowbw.sweep(sim, grid=grid, points_per_batch=2, progress=False)
  ones = lowbw.sweep(sim, grid=grid, points_per_batch=1, progress=False)
  assert parts.summary["points_per_batch"] == 2 and len(parts.points) == 3
  for a, b, c in zip(whole.points, parts.points, ones.points):
    np.testing.assert_allclose(a.history["eval_loss"], c.history["eval_loss"],
                               rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(a.history["eval_loss"], b.history["eval_loss"],
                               rtol=1e-6, equal_nan=True)


def test_table_and_mean_std_over_seeds(sim):
  result = lowbw.sweep(sim, grid={"inner_lr": [1e-2, 3e-2]},
                       seeds=[0, 1, 2], progress=False)
  table = result.table()
  rows = len(result.points[0].history["step"])
  assert len(table["point"]) == 6 * rows
  assert list(table["seed"][:rows]) == [0] * rows
  np.testing.assert_array_equal(table["inner_lr"][rows * 3:],
                                np.full(rows * 3, 3e-2))
  np.testing.assert_array_equal(table["train_loss"][:rows],
                                result.points[0].history["train_loss"])
  agg = result.aggregate("final_eval_loss")
  assert [a["inner_lr"] for a in agg] == [1e-2, 3e-2]
  finals = [p.summary["final_eval_loss"] for p in result.points[:3]]
  assert agg[0]["mean"] == pytest.approx(np.mean(finals))
  assert agg[0]["std"] == pytest.approx(np.std(finals))
  assert agg[0]["n"] == 3 and agg[0]["seeds"] == [0, 1, 2]


@pytest.mark.parametrize("points_per_batch", [1, 2])
def test_a_diverging_point_does_not_stop_the_others(points_per_batch):
  sim = lowbw.build(model=MLP, data=SOURCE, workers=W, batch_size=B,
                    steps=2 * H, strategy=strategies.ddp(
                        optax.inject_hyperparams(optax.sgd)(
                            learning_rate=0.1)), compile=False)
  result = lowbw.sweep(sim, grid={"inner_lr": [0.1, 1e30]},
                       points_per_batch=points_per_batch, progress=False)
  ok, bad = result.points
  assert "error" not in ok.summary and np.isfinite(ok.summary["final_eval_loss"])
  assert "non-finite training loss" in bad.summary["error"]
  assert result.aggregate()[1]["failed"] == 1
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(ok.params))


def test_sweep_writes_a_folder_per_point_and_the_tidy_table(tmp_path, sim):
  out = str(tmp_path / "sw")
  result = lowbw.sweep(sim, grid={"inner_lr": [1e-2, 2e-2]}, out=out,
                       progress=False)
  assert sorted(os.listdir(out)) == ["point_000", "point_001", "sweep.csv",
                                     "sweep.json"]
  with open(os.path.join(out, "point_001", "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  np.testing.assert_allclose([float(r["train_loss"]) for r in rows],
                             result.points[1].history["train_loss"], rtol=1e-6)
  with open(os.path.join(out, "sweep.csv")) as f:
    table = list(csv.DictReader(f))
  assert len(table) == 2 * len(rows) and table[0]["inner_lr"] == "0.01"


# ---------------------------------------------------------------- schedules
def test_peak_schedule_equals_the_optax_schedule_and_sweeps_its_peak():
  unit = optax.warmup_cosine_decay_schedule(0.0, 1.0, 2, STEPS)
  peaked = strategies.peak_schedule(adamw(0.0), unit, 2e-2)
  plain = optax.inject_hyperparams(optax.adamw)(
      learning_rate=optax.warmup_cosine_decay_schedule(0.0, 2e-2, 2, STEPS),
      weight_decay=0.1)
  got = single(strategies.diloco(peaked, outer(0.7), H=H), 0)
  want = single(strategies.diloco(plain, outer(0.7), H=H), 0)
  assert_same_run(got.history, got.params, want, rtol=1e-5)
  sim = build(strategies.diloco(peaked, outer(0.7), H=H), compile=False)
  other = sim.run(hparams={"inner_lr": 5e-3}, progress=False)
  lr = other.history["lr"][np.isfinite(other.history["lr"])]
  assert 0 < lr.max() <= 5e-3 + 1e-9 and not np.allclose(
      other.history["train_loss"], got.history["train_loss"])


# ------------------------------------------------------------------- errors
@pytest.mark.parametrize("grid, seeds, match", [
    ({"H": [1, 2]}, [0], r"^grid='H' is invalid: not a traced hyperparameter;"
     r" expected one of 'inner_lr', .*'bandwidth'"),
    ({"inner_lr": []}, [0], r"^inner_lr=\[\] is invalid: expected at least"),
    ({"inner_lr": 0.1}, [0], r"^inner_lr=0.1 is invalid: expected a list"),
    ({"inner_lr": ["fast"]}, [0], r"^inner_lr='fast' is invalid: expected a "
     "finite number"),
    ({"bandwidth": ["fast"]}, [0], r"^bandwidth="),
    ({"jitter": [-1.0]}, [0], r"^jitter="),
    ({}, [0, 0], r"^seeds=\[0, 0\] is invalid: has a seed twice"),
    ({}, [], r"^seeds=\[\] is invalid"),
    ({}, ["a"], r"^seed='a' is invalid"),
])
def test_bad_grids_are_one_line_errors(sim, grid, seeds, match):
  with pytest.raises(ValueError, match=match):
    lowbw.sweep(sim, grid=grid, seeds=seeds, progress=False)


def test_values_without_a_place_are_errors_naming_them():
  ddp = lowbw.build(model=MLP, data=SOURCE, strategy=strategies.ddp(
      adamw(1e-3)), workers=W, batch_size=B, steps=4, compile=False,
      clock=False)
  with pytest.raises(ValueError, match=r"^outer_lr=0.5 is invalid: strategy "
                     "'ddp' has no outer optimizer"):
    ddp.run(hparams={"outer_lr": 0.5})
  with pytest.raises(ValueError, match=r"^bandwidth='1Gbps' is invalid: "
                     "needs a network= at build"):  # clock=False: no clock
    ddp.run(hparams={"bandwidth": "1Gbps"})
  opaque = lowbw.build(model=MLP, data=SOURCE, strategy=strategies.diloco(
      optax.adamw(1e-3), H=2), workers=W, batch_size=B, steps=4,
      compile=False)
  with pytest.raises(ValueError, match=r"^inner_lr=.*inject_hyperparams"):
    opaque.run(hparams={"inner_lr": 1e-2})
  scheduled = lowbw.build(model=MLP, data=SOURCE, strategy=strategies.diloco(
      optax.inject_hyperparams(optax.adamw)(
          learning_rate=optax.cosine_decay_schedule(1e-3, 10)), H=2),
      workers=W, batch_size=B, steps=4, compile=False)
  with pytest.raises(ValueError, match=r"^inner_lr=.*peak_schedule"):
    scheduled.run(hparams={"inner_lr": 1e-2})
  no_faults = build(net=network.network("1Gbps", "5ms"), compile=False)
  with pytest.raises(ValueError, match=r"^drop_prob=0.1 is invalid: needs a "
                     "network built with faults="):
    no_faults.run(hparams={"drop_prob": 0.1})
  with pytest.raises(ValueError, match=r"^hparams='H' is invalid"):
    no_faults.run(hparams={"H": 2})
  with pytest.raises(ValueError, match=r"^build_args='list' is invalid"):
    lowbw.sweep([1, 2])


def test_ef_beta_is_traced_and_each_point_equals_its_own_build():
  sim = build(diloco(codec=transforms.quantize(2), error_feedback=0.9))
  result = lowbw.sweep(sim, grid={"ef_beta": [0.2, 1.0]}, seeds=[1],
                       points_per_batch=2, progress=False)
  for point, beta in zip(result.points, [0.2, 1.0]):
    want = single(diloco(codec=transforms.quantize(2), error_feedback=beta),
                  1)
    assert_same_run(point.history, point.params, want)
  assert not np.allclose(result.points[0].history["train_loss"],
                         result.points[1].history["train_loss"])
  with pytest.raises(ValueError, match=r"^ef_beta=1.5 is invalid: expected a "
                     r"number in \[0, 1\]"):
    sim.run(hparams={"ef_beta": 1.5})
  no_feedback = build(diloco(codec=transforms.quantize(2)), compile=False)
  with pytest.raises(ValueError, match=r"^ef_beta=0.5 is invalid: strategy "
                     "'diloco' runs no error feedback"):
    no_feedback.run(hparams={"ef_beta": 0.5})


def test_a_codec_size_is_a_shape_not_a_traced_value():
  sim = build(diloco(codec=transforms.top_k(0.5)), compile=False)
  with pytest.raises(ValueError, match="need a new lowbw.build"):
    sim.run(hparams={"fraction": 0.1})


# ---------------------------------------------------------------------- CLI
def test_cli_sweep_writes_points_table_and_plot(tmp_path, capsys):
  out = tmp_path / "cli"
  code = cli.main(["sweep", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--H", "2", "--steps", "4", "--batch-size", "4",
                   "--eval-examples", "16", "--grid", "inner_lr=1e-3,3e-3",
                   "--grid", "latency=5ms,50ms", "--seeds", "0,1",
                   "--out", str(out), "--no-progress"])
  assert code == 0
  text = capsys.readouterr().out
  # traced values and seeds: one compiled shape; the latency's points are
  # the inner_lr points' runs re-timed (docs/studies.md)
  assert "8 points (2 seeds, 1 compiled shapes, 0 resumed, 4 re-timed)" in (
      text)
  assert text.count("(re-timed from ../") == 4
  assert "± " in text
  assert {"study.csv", "final.csv", "study.json", "loss_vs_inner_lr.png",
          "points"} <= set(os.listdir(out))
  assert len(os.listdir(out / "points")) == 8


@pytest.mark.parametrize("argv, message", [
    (["--grid", "inner_lr"], "--grid='inner_lr' is invalid: expected NAME=V1"),
    (["--grid", "momentum=0.1"], "--momentum=0.1 is invalid: not used by "
     "inner 'adamw' (at grid point --momentum=0.1)"),
    (["--grid", "inner_lr=1", "--grid", "inner_lr=2"], "is given twice"),
    (["--seeds", "0,x"], "--seeds='0,x' is invalid"),
    (["--checkpoint-every", "2"], "--checkpoint-every=2 is invalid: a sweep"),
])
def test_cli_sweep_errors_are_one_line(argv, message, capsys, tmp_path):
  code = cli.main(["sweep", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--H", "2", "--steps", "4", "--out",
                   str(tmp_path / "x"), *argv])
  err = capsys.readouterr().err
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_points_per_batch_must_be_positive(sim):
  with pytest.raises(ValueError, match=r"^points_per_batch=0 is invalid: "
                     "expected an integer >= 1"):
    lowbw.sweep(sim, grid={"inner_lr": [1e-3]}, points_per_batch=0)


def test_seeds_with_shards_of_other_sizes_are_an_error_naming_them():
  dirichlet = data.arrays(*toy_arrays(128), eval=toy_arrays(40, seed=99),
                          sharding="dirichlet", alpha=0.5)
  sim = lowbw.build(model=MLP, data=dirichlet, strategy=diloco(),
                    workers=W, batch_size=2, steps=H, compile=False)
  with pytest.raises(ValueError, match=r"^seeds=\[0, 2\] is invalid: the "
                     "seeds' data shards have different shapes"):
    lowbw.sweep(sim, seeds=[0, 2], points_per_batch=2)  # 48 vs 71 rows
