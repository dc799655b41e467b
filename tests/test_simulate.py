"""End-to-end properties of ``lowbw.simulate``: equivalences between strategies,
determinism, checkpoint/resume, no recompilation, exact bytes, clear errors."""

import csv
import math
import os

import chex
import jax
import jax.monitoring
import numpy as np
import optax
import pytest

import lowbw
from lowbw import data, models, strategies

W, B = 4, 8
MLP = models.mlp(hidden=(16,), num_classes=4)


def toy_arrays(n, seed=0, dim=6, classes=4):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
  return x, y % classes


EVAL = toy_arrays(40, seed=99)


def run(strategy, workers=W, batch_size=B, steps=20, source=None, **kw):
  source = source or data.arrays(*toy_arrays(128), eval=EVAL)
  kw.setdefault("progress", False)
  return lowbw.simulate(model=MLP, data=source, strategy=strategy,
                        workers=workers, batch_size=batch_size,
                        steps=steps, **kw)


def assert_params_close(a, b, atol=2e-5):
  chex.assert_trees_all_close(a, b, atol=atol, rtol=1e-4)


def assert_moved(result, source=None, seed=0):
  """The run's parameters are not its initial ones: an equality between two
  strategies must not hold because both dropped every update."""
  sim = lowbw.build(MLP, source or data.arrays(*toy_arrays(128), eval=EVAL),
                    strategies.fedavg(optax.sgd(0.1), H=1), workers=W,
                    batch_size=B, steps=20, compile=False)
  start = sim.initial(seed)[0].strategy.params_W
  moved = [np.max(np.abs(np.asarray(p) - np.asarray(s[0])))
           for p, s in zip(jax.tree.leaves(result.params),
                           jax.tree.leaves(start))]
  assert max(moved) > 1e-3, moved


def test_ddp_equals_one_model_with_the_whole_batch():
  # Every worker's shard is exactly its batch, so each step worker w sees its
  # whole shard and the one big model sees the union: the same examples.
  source = data.arrays(*toy_arrays(W * B), eval=EVAL, sharding="contiguous")
  sgd = optax.sgd(0.1, momentum=0.9)
  many = run(strategies.ddp(sgd), source=source)
  one = run(strategies.ddp(sgd), workers=1, batch_size=W * B, source=source)
  assert_params_close(many.params, one.params)
  np.testing.assert_allclose(many.history["train_loss"],
                             one.history["train_loss"], rtol=1e-5)


def test_ddp_one_replica_equals_per_worker_gradients():
  # DDP without a codec keeps one replica and differentiates the mean loss
  # over all W*b examples; the per-worker path (W copies, W gradients, their
  # mean) is the reference. Same samples, same keys: same trajectory.
  adamw = optax.adamw(3e-3, weight_decay=0.1)
  one = strategies.ddp(adamw)
  assert one.replicated
  per_worker = one._replace(replicated=False)
  sim_one = lowbw.build(MLP, data.arrays(*toy_arrays(128), eval=EVAL), one,
                        workers=W, batch_size=B, steps=20,
                        compile=False)
  leaves = jax.tree.leaves(sim_one.abstract_state.strategy.params_W)
  assert all(x.shape[0] == 1 for x in leaves)   # one replica, not W
  a, b = run(one, eval_every=10), run(per_worker, eval_every=10)
  assert_params_close(a.params, b.params)
  np.testing.assert_allclose(a.history["train_loss"], b.history["train_loss"],
                             rtol=1e-5)
  assert a.summary["wire_bytes"] == b.summary["wire_bytes"] > 0
  # A codec needs the workers' own gradients: no replica then.
  assert not strategies.ddp(adamw, codec="quant:8").replicated


def test_ddp_one_replica_names_the_worker_whose_loss_is_not_finite():
  # The one-replica path scores the W*b examples as one batch; a NaN in
  # worker 2's shard (contiguous shards of 32) still names worker 2, as the
  # per-worker path does. Features near float32's largest value overflow
  # the first layer of that worker's model only.
  x, y = toy_arrays(128)
  x = np.array(x)
  x[64:96] = 3e38
  source = data.arrays(x, y, eval=EVAL, sharding="contiguous")
  for strategy in (strategies.ddp(optax.sgd(0.1)),
                   strategies.ddp(optax.sgd(0.1))._replace(replicated=False)):
    with pytest.raises(FloatingPointError, match="at step 1 on worker 2;"):
      run(strategy, source=source)


def test_fedavg_h1_equals_ddp_with_sgd():
  sgd = optax.sgd(0.1, momentum=0.9)
  fedavg = run(strategies.fedavg(sgd, H=1))
  assert_params_close(fedavg.params, run(strategies.ddp(sgd)).params)
  assert_moved(fedavg)


def test_diloco_with_plain_outer_sgd_equals_fedavg():
  inner = optax.adam(3e-3)
  diloco = run(strategies.diloco(inner, optax.sgd(1.0), H=5))
  fedavg = run(strategies.fedavg(inner, H=5))
  assert_params_close(diloco.params, fedavg.params)
  assert_moved(diloco)


def test_sparta_p1_equals_fedavg_h1():
  inner = optax.adamw(3e-3)
  sparta = run(strategies.sparta(inner, p=1.0))
  assert_params_close(sparta.params, run(strategies.fedavg(inner, H=1)).params)
  assert_moved(sparta)


def test_identical_data_keeps_workers_identical_and_equal_to_one_run():
  x, y = toy_arrays(B)
  # Contiguous shards of W copies: every worker holds the same B examples and,
  # with batch B, sees all of them every step.
  same = data.arrays(np.tile(x, (W, 1)), np.tile(y, W), eval=EVAL,
                     sharding="contiguous")
  strategy = strategies.diloco(optax.adam(3e-3), H=5)
  many = run(strategy, source=same)
  one = run(strategy, workers=1, source=data.arrays(x, y, eval=EVAL))
  assert np.nanmax(many.history["worker_divergence"]) < 1e-6
  assert_params_close(many.params, one.params)


def _comparable(history):
  return {k: v for k, v in history.items() if k != "wall_time_s"}


def test_same_seed_same_bits_and_other_seed_differs():
  strategy = strategies.sparta_diloco(optax.adamw(3e-3), H=5, p=0.1)
  # Two builds (simulate is build then run); the other seed runs in the
  # first one's program.
  sim = lowbw.build(model=MLP, data=data.arrays(*toy_arrays(128), eval=EVAL),
                    strategy=strategy, workers=W, batch_size=B, steps=20,
                    progress=False)
  a, b = sim.run(seed=3), run(strategy, seed=3)
  chex.assert_trees_all_equal(_comparable(a.history), _comparable(b.history))
  chex.assert_trees_all_equal(a.params, b.params)
  c = sim.run(seed=4)
  assert not np.array_equal(a.history["train_loss"], c.history["train_loss"])


def interrupted_and_whole(tmp_path, strategy, first, steps, **kw):
  """(one run of ``steps``, a run of ``first`` steps resumed to ``steps``),
  with equal histories (but wall time) and parameters asserted."""
  whole = run(strategy, steps=steps, out=str(tmp_path / "whole"), **kw)
  part = str(tmp_path / "part")
  run(strategy, steps=first, out=part, **kw)
  resumed = run(strategy, steps=steps, out=part, resume_from=part, **kw)
  chex.assert_trees_all_equal(_comparable(whole.history),
                              _comparable(resumed.history))
  chex.assert_trees_all_equal(whole.params, resumed.params)
  return whole, resumed


def test_checkpoint_and_resume_equals_uninterrupted(tmp_path):
  strategy = strategies.sparta_diloco(optax.adamw(3e-3), H=5, p=0.1)
  kw = dict(eval_every=10, checkpoint_every=10, log_every=3)
  full, resumed = interrupted_and_whole(tmp_path, strategy, 20, 30, **kw)
  part_dir = str(tmp_path / "part")
  chex.assert_trees_all_equal(full.state, resumed.state)
  with open(os.path.join(part_dir, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [int(r["step"]) for r in rows] == full.history["step"].tolist()


def test_resume_rejects_a_different_configuration(tmp_path):
  strategy = strategies.diloco(optax.adam(1e-3), H=5)
  run(strategy, steps=10, checkpoint_every=5, out=str(tmp_path))
  with pytest.raises(ValueError, match="^resume_from="):
    run(strategy, workers=2, steps=20, resume_from=str(tmp_path))
  with pytest.raises(ValueError, match="^resume_from="):
    run(strategy, steps=20, resume_from=str(tmp_path / "metrics.csv"))


def test_no_recompilation_after_the_first_chunk():
  compiles, rows = [], []

  def listener(event, *_, **__):
    if "backend_compile" in event:
      compiles.append(len(rows))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    result = run(strategies.diloco(optax.adam(1e-3), H=2), steps=60,
                 rounds_per_chunk=2, eval_every=10, callback=rows.append)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert len(rows) >= 10
  assert compiles and max(compiles) == 0, compiles  # all before the first row
  assert result.history["step"][-1] == 60


def test_bytes_are_exact():
  params = MLP.init(jax.random.PRNGKey(0), {"x": np.zeros((1, 6), np.float32),
                                            "y": np.zeros((1,), np.int32)})
  P = sum(x.size for x in jax.tree.leaves(params))
  ring = 2 * (W - 1) / W
  # 23 steps at H = 5: syncs after steps 5, 10, 15, 20; the tail has none.
  h = run(strategies.diloco(optax.adam(1e-3), H=5), steps=23).history
  assert h["step"][-1] == 23
  assert h["payload_bytes"][-1] == 4 * 4 * P
  assert h["wire_bytes"][-1] == pytest.approx(4 * ring * 4 * P)
  at = dict(zip(h["step"].tolist(), h["payload_bytes"].tolist()))
  assert at[4] == 0 and at[5] == 4 * P and at[9] == 4 * P and at[10] == 8 * P
  h = run(strategies.ddp(optax.sgd(0.1)), steps=7).history
  assert h["payload_bytes"][-1] == 7 * 4 * P
  h = run(strategies.fedavg(optax.sgd(0.1), H=2, island_size=2), steps=8).history
  assert h["wire_bytes"][-1] == pytest.approx(4 * (2 * 1 / 2) * 4 * P)
  k = sum(max(1, round(0.1 * x.size)) for x in jax.tree.leaves(params))
  h = run(strategies.sparta(optax.sgd(0.1), p=0.1), steps=6).history
  assert h["payload_bytes"][-1] == 6 * 4 * k


def test_wire_bytes_do_not_depend_on_chunking():
  # W = 3: 2(W-1)/W is not a binary fraction, so summing per-event floats in
  # different chunk sizes would round differently.
  strategy = strategies.diloco(optax.adam(1e-3), H=2)
  a = run(strategy, workers=3, steps=42, rounds_per_chunk=1)
  b = run(strategy, workers=3, steps=42, rounds_per_chunk=7)
  np.testing.assert_array_equal(a.history["wire_bytes"], b.history["wire_bytes"])
  np.testing.assert_array_equal(a.history["train_loss"], b.history["train_loss"])


def test_last_row_averages_the_steps_since_the_previous_row():
  strategy = strategies.diloco(optax.adam(1e-3), H=5)
  every = run(strategy, steps=20, log_every=1).history
  sparse = run(strategy, steps=20, eval_every=10, log_every=3).history
  assert sparse["step"].tolist() == [3, 6, 9, 10, 12, 15, 18, 20]
  np.testing.assert_allclose(sparse["train_loss"][-1],
                             np.mean(every["train_loss"][18:20]), rtol=1e-6)
  np.testing.assert_allclose(sparse["train_loss"][0],
                             np.mean(every["train_loss"][0:3]), rtol=1e-6)
  assert np.isfinite(sparse["eval_loss"][-1])


def test_resume_rejects_changed_hyperparameters_and_keeps_row_spacing(tmp_path):
  kw = dict(checkpoint_every=200, out=str(tmp_path))
  run(strategies.diloco(optax.inject_hyperparams(optax.adam)(1e-3), H=5),
      steps=400, **kw)
  changed = strategies.diloco(optax.inject_hyperparams(optax.adam)(0.5), H=5)
  with pytest.raises(ValueError, match=r"^resume_from=.*made with "
                     r"strategy\.inner\..*learning_rate=0.001 but"):
    run(changed, steps=800, resume_from=str(tmp_path), **kw)
  same = strategies.diloco(optax.inject_hyperparams(optax.adam)(1e-3), H=5)
  with pytest.raises(ValueError, match="^resume_from=.*seed="):
    run(same, steps=800, seed=1, resume_from=str(tmp_path), **kw)
  # The default spacing is 2 for 400 steps and 4 for 800: the resumed run's
  # rows, the first run's included, are every 4 steps.
  h = run(same, steps=800, resume_from=str(tmp_path), **kw).history
  assert set(np.diff(h["step"]).tolist()) == {4}


def test_extending_a_run_with_default_logging_equals_one_uninterrupted_run(
    tmp_path):
  """Issue 16, finding 5: without log_every the spacing follows steps (2 for
  400, 4 for 800); the resumed run re-spaces the first run's rows, exact
  sums merged, and an evaluation at step 10 (a row of the first spacing,
  not of the second) keeps its row without training means."""
  strategy = strategies.diloco(optax.adam(3e-3), H=5)
  kw = dict(eval_every=10, checkpoint_every=400)
  _, resumed = interrupted_and_whole(tmp_path, strategy, 400, 800, **kw)
  part = str(tmp_path / "part")
  assert resumed.config["log_every"] == 4
  h = resumed.history
  at10 = int(np.flatnonzero(h["step"] == 10)[0])
  assert np.isnan(h["train_loss"][at10]) and np.isfinite(h["eval_loss"][at10])
  with open(os.path.join(part, "metrics.csv")) as f:
    assert [int(r["step"]) for r in csv.DictReader(f)] == h["step"].tolist()


def test_lr_is_logged_with_a_schedule():
  schedule = optax.linear_schedule(0.0, 1e-2, 10)
  inner = optax.inject_hyperparams(optax.adam)(learning_rate=schedule)
  lr = run(strategies.diloco(inner, H=2), steps=10, log_every=2).history["lr"]
  # The rate used by the last step of each round: steps 2, 4, ... use the
  # schedule at counts 1, 3, ...
  np.testing.assert_allclose(lr, [1e-3, 3e-3, 5e-3, 7e-3, 9e-3], rtol=1e-5)


def test_a_new_run_refuses_a_folder_with_another_runs_checkpoints(tmp_path):
  strategy = strategies.diloco(optax.adam(1e-3), H=5)
  run(strategy, steps=10, checkpoint_every=5, out=str(tmp_path))
  with pytest.raises(ValueError, match="^out=.* holds another run "
                     r"\(checkpoints, config.json"):
    run(strategy, steps=10, checkpoint_every=5, out=str(tmp_path))


def test_history_columns_and_log_files(tmp_path):
  result = run(strategies.diloco(optax.adam(1e-3), H=5), steps=20,
               eval_every=10, log_every=5, out=str(tmp_path))
  h = result.history
  assert h["step"].tolist() == [5, 10, 15, 20]
  assert h["examples"].tolist() == [s * W * B for s in (5, 10, 15, 20)]
  assert np.isnan(h["eval_loss"][0]) and np.isfinite(h["eval_loss"][1])
  assert np.all(np.isfinite(h["train_loss"]))
  assert np.all(h["eval_accuracy"][[1, 3]] >= 0)
  for name in ("metrics.csv", "config.json", "summary.json", "tensorboard"):
    assert os.path.exists(tmp_path / name), name
  assert result.summary["final_eval_loss"] == pytest.approx(h["eval_loss"][-1])


def test_language_model_end_to_end(tmp_path):
  (tmp_path / "a.txt").write_text("hello world, " * 300)
  (tmp_path / "b.txt").write_text("the quick brown fox. " * 200)
  gpt = models.gpt(layers=1, d_model=32, heads=2, seq_len=16)
  result = lowbw.simulate(
      model=gpt, data=data.text_bytes(seq_len=16, root=str(tmp_path)),
      strategy=strategies.diloco(optax.adamw(3e-3), H=4), workers=2,
      batch_size=4, steps=8, progress=False)
  h = result.history
  assert h["tokens"][-1] == 8 * 2 * 4 * 16
  assert h["eval_perplexity"][-1] == pytest.approx(math.exp(h["eval_loss"][-1]),
                                                   rel=1e-5)
  # Issue 17: language models log train_perplexity, exp of the row's mean.
  np.testing.assert_allclose(h["train_perplexity"], np.exp(h["train_loss"]),
                             rtol=1e-6)


def test_non_finite_loss_stops_with_step_and_worker_and_keeps_logs(tmp_path):
  with pytest.raises(lowbw.NonFiniteLossError) as info:
    run(strategies.fedavg(optax.sgd(1e30), H=5), steps=40, log_every=1,
        out=str(tmp_path))
  err = info.value
  assert 1 <= err.step <= 40 and 0 <= err.worker < W
  assert f"step {err.step} on worker {err.worker}" in str(err)
  with open(tmp_path / "metrics.csv") as f:
    steps = [int(r["step"]) for r in csv.DictReader(f)]
  assert steps == list(range(1, err.step))
  assert err.history["step"].tolist() == steps


@pytest.mark.parametrize("kwargs, field", [
    (dict(workers=0), "workers"),
    (dict(batch_size=1000), "batch_size"),
    (dict(steps=0), "steps"),
    (dict(strategy="nope"), "strategy"),
    (dict(model="nope"), "model"),
    (dict(strategy=strategies.fedavg(H=2, island_size=3)), "island_size"),
    (dict(strategy=strategies.diloco(H=5), eval_every=7), "eval_every"),
    (dict(checkpoint_every=5), "checkpoint_every"),
    (dict(log_every=0), "log_every"),
    (dict(seed=1.5), "seed"),
    (dict(network="1Gbps"), "network"),
    (dict(model=models.gpt(layers=1, d_model=8, heads=2, seq_len=8)), "model"),
    (dict(resume_from="/no/such/dir"), "resume_from"),
    (dict(model=models.mlp(hidden=(4,), num_classes=2)), "num_classes"),
    (dict(eval_examples=0), "eval_examples"),
    (dict(rounds_per_chunk=0), "rounds_per_chunk"),
    (dict(data="nope"), "data"),
])
def test_bad_arguments_fail_at_build_naming_the_field(kwargs, field):
  args = dict(model=MLP, data=data.arrays(*toy_arrays(128), eval=EVAL),
              strategy=strategies.ddp(), workers=W, batch_size=B, steps=10,
              progress=False)
  args.update(kwargs)
  with pytest.raises(ValueError, match=f"^{field}="):
    lowbw.simulate(**args)


def test_missing_data_path_names_the_field():
  with pytest.raises(ValueError, match="path="):
    data.arrays("/no/such/file.npz")
