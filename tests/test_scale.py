"""Scale: workers spread over devices (shard_map) and over processes
(jax.distributed) give the one-device trajectory; bf16 workers; learning rates
that live in the state change without recompiling."""

import json
import os
import socket
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import models, strategies
from lowbw.simulation._api import engine_config
from lowbw.simulation import _engine

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scale_cases  # noqa: E402


def _env(**extra):
  """The environment with ``extra``; XLA_FLAGS are the session's fast
  compile flags (conftest) and the given ones."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(filter(None, [
      os.environ.get("LOWBW_TEST_FAST_COMPILE"), extra.pop("XLA_FLAGS",
                                                           None)]))
  env.update(extra)
  return env


def _assert_same(a, b, name):
  assert a["history"].keys() == b["history"].keys()
  for key in a["history"]:
    np.testing.assert_allclose(np.asarray(a["history"][key], float),
                               np.asarray(b["history"][key], float),
                               rtol=1e-5, atol=1e-6, err_msg=f"{name}: {key}")
  for x, y in zip(a["params"], b["params"]):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
  out = tmp_path_factory.mktemp("devices") / "out.json"
  subprocess.run(
      [sys.executable, os.path.join(HERE, "scale_cases.py"), "devices",
       str(out)], check=True, cwd=HERE, timeout=600,
      env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=4"))
  return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(scale_cases.cases()))
def test_four_devices_give_the_one_device_trajectory(four_devices, name):
  one, four = four_devices[name]
  assert (one["devices"], four["devices"]) == (1, 4)
  _assert_same(one, four, name)
  # Not a trivially flat run: the loss moved and workers were counted.
  loss = np.asarray(one["history"]["train_loss"])
  assert loss[0] != loss[-1]


def test_a_checkpoint_from_four_devices_resumes_on_one(four_devices):
  uninterrupted, resumed = four_devices["resume_4_to_1"]
  assert resumed["devices"] == 1
  _assert_same(uninterrupted, resumed, "resumed")




def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, four_devices):
  """The multi-process case run by two local processes (``scale_cases``):
  uninterrupted, and stopped after its checkpoint then resumed."""
  folder = tmp_path_factory.mktemp("processes")
  out = folder / "out.json"
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(HERE, "scale_cases.py"), "process",
       str(port), str(i), str(out)], cwd=HERE, env=_env(),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  logs = [p.communicate(timeout=300)[0] for p in procs]
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  return folder, json.loads(out.read_text())


def test_two_processes_give_the_one_process_trajectory(two_processes,
                                                      four_devices):
  _, two = two_processes
  assert (two["devices"], two["processes"]) == (2, 2)
  # The same case on one device of one process (the four-device run's
  # reference).
  one = four_devices["diloco_q4_ef_faults"][0]
  assert (one["devices"], one["processes"]) == (1, 1)
  _assert_same(one, two, "two processes")


def _csv_rows(folder):
  import csv
  with open(folder / "metrics.csv", newline="") as f:
    return [{k: v for k, v in r.items() if k != "wall_time_s"}
            for r in csv.DictReader(f)]


def test_two_processes_resume_bit_for_bit(two_processes):
  """A two-process run checkpointed at step 3, stopped with step 4's row
  written, and resumed by both processes ends with the uninterrupted run's
  files: the same metrics.csv rows (each once) and the same parameter
  bits; every process's history and parameters are the same too."""
  folder, two = two_processes
  whole, stopped = folder / "whole", folder / "stopped"
  assert sorted(os.listdir(stopped / "checkpoints")) == ["3"]
  # Each process wrote its own workers' part of the checkpoint.
  state = stopped / "checkpoints" / "3" / "state"
  assert {"ocdbt.process_0", "ocdbt.process_1"} <= set(os.listdir(state))
  rows = _csv_rows(stopped)
  assert [r["step"] for r in rows] == [str(s) for s in
                                       range(1, scale_cases.STEPS + 1)]
  assert rows == _csv_rows(whole)
  with np.load(stopped / "params.npz") as a, np.load(whole / "params.npz") as b:
    assert sorted(a.files) == sorted(b.files)
    for k in b.files:
      np.testing.assert_array_equal(a[k], b[k])
  resumed = two["resumed"]
  assert resumed["params"] == two["params"]
  for key, values in two["history"].items():
    np.testing.assert_array_equal(np.asarray(resumed["history"][key], float),
                                  np.asarray(values, float), err_msg=key)


def test_a_two_process_checkpoint_resumes_in_one_process(two_processes,
                                                         four_devices):
  folder, _ = two_processes
  strategy, net = scale_cases.cases()["diloco_q4_ef_faults"]
  resumed = scale_cases.trajectory(strategy, net, 1,
                                   resume_from=str(folder / "stopped"))
  assert (resumed["devices"], resumed["processes"]) == (1, 1)
  _assert_same(four_devices["diloco_q4_ef_faults"][0], resumed, "resumed")


def test_only_process_0_checks_and_locks_the_folder(tmp_path):
  """A process other than 0 writes no logs: it neither locks the folder nor
  takes process 0's first files there for another run's."""
  from lowbw.simulation import _logdir
  out = tmp_path / "run"
  out.mkdir()
  (out / "metrics.csv").write_text("step\n1\n")  # as process 0 wrote it
  sim = lowbw.build(MLP, "digits", strategies.ddp(optax.sgd(0.1)), workers=2,
                    batch_size=4, steps=2, eval_examples=32, devices=1)
  with pytest.raises(ValueError, match="holds another run"):
    sim.run(out=str(out), progress=False)
  sim.main_process = False
  sim.run(out=str(out), progress=False)
  assert sorted(os.listdir(out)) == ["metrics.csv"]
  assert not (out / _logdir.LOCK).exists()


def test_processes_choose_the_same_chunks(monkeypatch):
  """A chunk's rounds are a traced count: processes that chose different
  counts from their own wall times would run different collectives. Over
  several processes the count does not depend on time."""
  from lowbw.simulation import _loop
  monkeypatch.setattr(_loop, "CHUNK_SECONDS", 0.0)
  one = _loop._Pace(8)
  one.done(1)
  assert one.rounds() == 1  # one process: as many as the time allows
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  many = _loop._Pace(8)
  assert many.rounds() == 1  # the first chunk measures nothing
  many.done(1)
  assert many.rounds() == 8


# ------------------------------------------------------------ bf16 workers
MLP = models.mlp(hidden=(16,))


def _run(**kw):
  kw = {"model": MLP, "data": "digits", "workers": 4, "batch_size": 4,
        "steps": 12, "seed": 0, "progress": False, "eval_examples": 64, **kw}
  return lowbw.simulate(**kw)


def test_bf16_workers_store_bf16_and_round_each_step():
  strategy = strategies.diloco(optax.adamw(1e-3), H=3)
  r = _run(strategy=strategy, worker_dtype="bfloat16")
  st = r.state.strategy
  tensors = [x for x in jax.tree.leaves((st.params_W, st.inner_W))
             if x.ndim >= 2]
  assert tensors and all(x.dtype == jnp.bfloat16 for x in tensors)
  counts = [x for x in jax.tree.leaves(st.inner_W) if x.ndim < 2]
  assert all(x.dtype != jnp.bfloat16 for x in counts)
  # The global model and what evaluation sees stay float32.
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(r.params))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(st.comm[0]))
  # Rounding moves the run (a different final loss) but only slightly: the
  # bf16 reference by hand is the DDP test below.
  f32 = _run(strategy=strategy)
  assert r.summary["final_eval_loss"] != f32.summary["final_eval_loss"]
  np.testing.assert_allclose(r.history["train_loss"], f32.history["train_loss"],
                             rtol=0.05)
  assert r.config["worker_dtype"] == "bfloat16"


def test_bf16_ddp_against_a_per_worker_reference():
  """DDP(SGD), 2 workers, 3 steps, by hand: every worker's f32 gradient of
  its bf16-stored weights, averaged, applied in f32, rounded back to bf16."""
  W, B, lr, seed = 2, 4, 0.5, 0
  r = _run(strategy=strategies.ddp(optax.sgd(lr)), worker_dtype="bfloat16",
           steps=3, workers=W, seed=seed)
  src = lowbw.data.get("digits")
  init_key, data_key, _, loss_key = jax.random.split(
      jax.random.PRNGKey(seed), 4)
  sampler = src.build(W, B, seed)
  params = MLP.init(init_key, src.example_batch(B))

  def bf16(tree):
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.ndim >= 1
                        else x, tree)

  grad = jax.jit(jax.grad(lambda p, b, k: MLP.loss(p, b, k)[0]))
  workers = [bf16(params) for _ in range(W)]
  for step in range(3):
    batch = sampler.sample(data_key, step)
    keys = jax.random.split(jax.random.fold_in(loss_key, step), W)
    grads = []
    for w in range(W):
      f32 = jax.tree.map(lambda x: x.astype(jnp.float32), workers[w])
      one = jax.tree.map(lambda x: x[w], batch)
      grads.append(grad(f32, one, keys[w]))
    mean = jax.tree.map(lambda *g: sum(g) / W, *grads)
    workers = [bf16(jax.tree.map(lambda p, g: p.astype(jnp.float32) - lr * g,
                                 workers[w], mean)) for w in range(W)]
  # DDP without a codec keeps one replica of the identical workers.
  replica = r.state.strategy.params_W
  assert all(x.shape[0] == 1 for x in jax.tree.leaves(replica))
  for w in range(W):
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[0], replica),
                                workers[w], atol=1e-2, rtol=1e-2)
  # bf16-exact on all but the rare element whose f32 value sits on a
  # rounding boundary (the order of float sums differs).
  got = np.concatenate([np.repeat(np.asarray(x, np.float32), W, axis=0).ravel()
                        for x in jax.tree.leaves(replica)])
  want = np.concatenate([np.stack([np.asarray(wk_leaf, np.float32) for wk_leaf
                                   in leaves]).ravel()
                         for leaves in zip(*[jax.tree.leaves(wk)
                                             for wk in workers])])
  assert np.mean(got == want) > 0.99


# ------------------------------------------------------------ no recompiling
def test_new_learning_rates_in_the_state_do_not_recompile():
  """The inner and outer learning rates live in the state
  (inject_hyperparams), so a state with other rates runs the same compiled
  chunk and gives what a strategy built with those rates gives."""
  src = lowbw.data.get("digits")
  W = 4

  def strategy(inner_lr, outer_lr):
    return strategies.diloco(
        optax.inject_hyperparams(optax.adamw)(learning_rate=inner_lr),
        optax.inject_hyperparams(optax.sgd)(learning_rate=outer_lr,
                                            momentum=0.9, nesterov=True), H=2)

  params = MLP.init(jax.random.PRNGKey(0), src.example_batch(4))
  sampler = src.build(W, 4, 0)

  def start(s):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    fresh = jax.tree.map(jnp.copy, params)  # the chunk donates its state
    return _engine.SimState(s.init(fresh, W, k1), k2, k3)

  def compiled_chunk(s):
    config = engine_config(lowbw.Config(
        model=MLP, data=src, strategy=s, workers=W, batch_size=4, steps=4,
        rounds_per_chunk=2, devices=1))
    parts = _engine.Parts(tuple(s.channels(params, W)))
    return jax.jit(_engine.build(config, parts).chunk)

  base = strategy(1e-3, 0.7)
  chunk = compiled_chunk(base)
  chunk(start(base), sampler, 2)
  sim = start(base)
  st = sim.strategy
  inner_W = optax.tree_utils.tree_set(
      st.inner_W, learning_rate=jnp.full((W,), 3e-3, jnp.float32))
  outer = optax.tree_utils.tree_set(st.comm[1],
                                    learning_rate=jnp.float32(0.5))
  new = sim._replace(strategy=st._replace(
      inner_W=inner_W, comm=st.comm._replace(**{st.comm._fields[1]: outer})))
  jax.block_until_ready(new)
  compiles = []
  listener = lambda event, *_, **__: compiles.append(event) if (  # noqa: E731
      "backend_compile" in event) else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    changed, _ = chunk(new, sampler, 2)
    jax.block_until_ready(changed)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not compiles
  other = strategy(3e-3, 0.5)
  expected, _ = compiled_chunk(other)(start(other), sampler, 2)
  chex.assert_trees_all_close(changed.strategy.comm[0],
                              expected.strategy.comm[0], rtol=1e-6)
  unchanged, _ = chunk(start(base), sampler, 2)
  assert not np.allclose(jax.tree.leaves(unchanged.strategy.comm[0])[0],
                         jax.tree.leaves(expected.strategy.comm[0])[0])


# ------------------------------------------------------------ errors
@pytest.mark.parametrize("kw, field", [
    ({"devices": 0}, "devices"),
    ({"devices": 64}, "devices"),
    ({"worker_dtype": "float8"}, "worker_dtype"),
])
def test_errors_name_the_field(kw, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    _run(strategy=strategies.ddp(optax.sgd(0.1)), **kw)


def test_initialize_rejects_bad_values():
  with pytest.raises(ValueError, match="^coordinator="):
    lowbw.initialize("localhost", 2, 0)
  with pytest.raises(ValueError, match="^process_id="):
    lowbw.initialize("127.0.0.1:1234", 2, 2)
  with pytest.raises(ValueError, match="^num_processes="):
    lowbw.initialize("127.0.0.1:1234", 0, 0)


# ------------------------------------------------------------ worker groups
def test_worker_batch_gives_the_same_run():
  """Computing the workers' steps two at a time changes nothing, with bf16
  workers (cast per group) and fault masks (down workers frozen)."""
  from lowbw import network
  net = network.network("1Gbps", "1ms", faults=network.Faults(drop_prob=0.3))
  strategy = strategies.diloco(optax.adamw(1e-3), H=3)
  for kw in ({"worker_dtype": "bfloat16", "network": net},):
    whole = _run(strategy=strategy, **kw)
    groups = _run(strategy=strategy, worker_batch=2, **kw)
    for key in whole.history:
      if key != "wall_time_s":
        np.testing.assert_allclose(groups.history[key], whole.history[key],
                                   rtol=1e-6, atol=1e-7, err_msg=key)
    chex.assert_trees_all_close(groups.state.strategy.params_W,
                                whole.state.strategy.params_W,
                                rtol=1e-6, atol=1e-7)
    assert groups.config["worker_batch"] == 2


def test_worker_batch_with_a_tail_gives_the_same_run():
  """Groups run whole rounds; steps left over after the last sync (the tail
  program) run in groups too."""
  strategy = strategies.diloco(optax.adamw(1e-3), H=3)
  whole = _run(strategy=strategy, steps=7, worker_batch="all")
  groups = _run(strategy=strategy, steps=7, worker_batch=2)
  for key in ("train_loss", "eval_loss", "worker_divergence"):
    np.testing.assert_allclose(groups.history[key], whole.history[key],
                               rtol=1e-6, atol=1e-7, err_msg=key)
  chex.assert_trees_all_close(groups.params, whole.params, rtol=1e-6,
                              atol=1e-7)


def test_worker_batch_refuses_a_strategy_whose_inner_step_reports(
    monkeypatch):
  """Groups would drop what a strategy reports from its inner step, so an
  explicit group size is refused and "auto" keeps every worker at once."""
  base = strategies.diloco(optax.adamw(1e-3), H=3)

  def local(state, grads_W):
    return base.local(state, grads_W)[0], {"inner_metric": jnp.float32(1.0)}

  talkative = base._replace(local=local)
  with pytest.raises(ValueError, match="^worker_batch=2 is invalid: .*reports "
                     "metrics from its inner step"):
    lowbw.build(MLP, "digits", talkative, workers=4, batch_size=4,
                steps=6, worker_batch=2, compile=False)
  # With an activation cap of one byte, "auto" groups a silent strategy's
  # workers one at a time, and keeps this one's all at once.
  from lowbw.simulation import _memory
  monkeypatch.setattr(_memory, "CPU_ACTIVATION_CAP", 1)
  kw = dict(workers=4, batch_size=4, steps=6, compile=False)
  assert lowbw.build(MLP, "digits", base, **kw).config.worker_batch == 1
  assert lowbw.build(MLP, "digits", talkative, **kw).config.worker_batch is None


@pytest.mark.parametrize("kw", [
    {"worker_batch": 3},  # does not divide W = 4
    {"worker_batch": 0},
    {"worker_batch": 2, "strategy": strategies.ddp(optax.sgd(0.1))},
])
def test_worker_batch_errors(kw):
  kw = {"strategy": strategies.diloco(optax.adamw(1e-3), H=3), **kw}
  with pytest.raises(ValueError, match="^worker_batch="):
    _run(**kw)


# ------------------------------------------------------------ command line
def test_train_flags_reach_the_run(tmp_path, capsys):
  from lowbw import cli
  from test_cli import TINY
  out = tmp_path / "run"
  assert cli.main([*TINY, "--worker-batch", "1", "--worker-dtype",
                   "bfloat16", "--out", str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  assert (config["worker_batch"], config["worker_dtype"],
          config["devices"]) == (1, "bfloat16", 1)


@pytest.mark.parametrize("argv, flag", [
    (["--devices", "64"], "--devices"),
    (["--worker-batch", "3"], "--worker-batch"),
    (["--worker-dtype", "fp8"], "--worker-dtype"),
    (["--coordinator", "nohost"], "--coordinator"),
])
def test_train_scale_flags_errors(argv, flag, tmp_path, capsys):
  from lowbw import cli
  from test_cli import TINY
  code = cli.main([*TINY, *argv, "--out", str(tmp_path / "r")])
  err = capsys.readouterr().err
  assert code == 2
  assert err.startswith(f"lowbw: error: {flag}=") and err.count("\n") == 1, err


def test_the_ddp_lane_is_evaluated_on_four_devices(four_devices):
  """The lane's loss is a number on both device counts (the comparison
  above would also pass on two columns of NaN)."""
  for run in four_devices["diloco_shadow"]:
    lane = np.asarray(run["history"]["shadow_eval_loss"], float)
    assert np.isfinite(lane[-1])
