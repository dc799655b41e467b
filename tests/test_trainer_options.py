"""What a researcher coming from EXO Gym reaches for: gradient
clipping per worker, a cosine schedule's floor, DeMo's weight decay, SPARTA's
interval; each against a plain reference."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import cli, data, models, strategies
from lowbw.config import _strategy_fields as strategy_fields

KEY = jax.random.PRNGKey(0)
_BUILD = dict(model=models.mlp(hidden=(8,)), data=data.digits(),
              workers=2, batch_size=4)
_RUN = dict(_BUILD, progress=False)
CLI = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
       "--batch-size", "4", "--steps", "10", "--no-progress"]


def _build(**kw):
  return lowbw.build(strategy=strategies.diloco(H=5), steps=10, compile=False,
                     **_BUILD, **kw)


# ------------------------------------------------------------------ clipping
def test_clipping_is_per_worker_like_a_loop_over_workers():
  """Two workers, gradient norms 5 and 0.5, max_norm 1: the first is scaled
  to norm 1, the second left alone. A clip across the worker axis (the norm
  of both, 5.02) would scale both."""
  lr, max_norm = 0.1, 1.0
  inner = strategies.inner_optimizer("sgd", lr, max_norm=max_norm)
  strategy = strategies.fedavg(inner, H=10)
  params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
  grads_W = {"w": jnp.array([[3.0, 0.0, 0.0], [0.3, 0.0, 0.0]]),
             "b": jnp.array([[0.0, 4.0], [0.0, 0.4]])}
  state, _ = strategy.local(strategy.init(params, 2, KEY), grads_W)

  for w in range(2):  # the reference: one worker at a time
    g = {k: np.asarray(v[w]) for k, v in grads_W.items()}
    norm = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
    scale = min(1.0, max_norm / norm)
    for k in params:
      np.testing.assert_allclose(state.params_W[k][w],
                                 np.asarray(params[k]) - lr * scale * g[k],
                                 rtol=1e-6)
  across = 1.0 / np.sqrt(25.25)  # what one norm over both workers would do
  assert not np.allclose(state.params_W["w"][1], 1 - lr * across * 0.3)


def test_clipping_in_a_run():
  def final(max_norm):
    inner = strategies.inner_optimizer("sgd", 0.5, max_norm=max_norm)
    return lowbw.simulate(strategy=strategies.diloco(inner, H=5), steps=10,
                          **_RUN).params

  loose, tight = final(None), final(1e-3)
  assert any(not np.allclose(a, b) for a, b in
             zip(jax.tree.leaves(loose), jax.tree.leaves(tight)))


def test_the_command_line_takes_every_option_at_once(tmp_path):
  """One run through the flags: clipping, a cosine floor, micro-batches,
  autocast, DeMo's decay and mean, local evaluation (the flags' errors are
  tested below)."""
  assert cli.main(CLI + [
      "--strategy", "demo", "--weight-decay", "0.01", "--combine", "mean",
      "--max-norm", "0.5", "--schedule", "cosine", "--min-lr-ratio", "0.1",
      "--minibatch-size", "2", "--autocast", "bfloat16", "--eval-local",
      "--correlation-every", "5", "--out", str(tmp_path)]) == 0
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["strategy"]["weight_decay"] == 0.01
  assert config["strategy"]["combine"] == "mean"
  assert config["minibatch_size"] == 2 and config["autocast"] == "bfloat16"
  assert config["eval_local"] and config["correlation_every"] == 5
  assert config["metadata"]["train_args"]["max_norm"] == 0.5
  with open(tmp_path / "metrics.csv") as f:
    header = f.readline()
  assert "eval_local_loss" in header and "worker_correlation" in header


# ------------------------------------------------------------------ schedule
def test_cosine_schedule_decays_to_its_floor():
  warmup, steps, floor = 10, 110, 0.1
  shape = strategies.unit_schedule("cosine", warmup, steps, floor)
  for t in (0, 5, 10, 35, 60, 109, 110, 200):
    if t < warmup:
      want = t / warmup
    else:
      frac = min(t - warmup, steps - warmup) / (steps - warmup)
      want = floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * frac))
    np.testing.assert_allclose(float(shape(t)), want, rtol=1e-5, atol=1e-7)


def test_a_runs_learning_rate_ends_at_the_floor():
  peak, steps, floor = 1e-2, 20, 0.5
  inner = strategies.inner_optimizer("adam", peak, schedule="cosine",
                                     steps=steps, min_lr_ratio=floor)
  lr = lowbw.simulate(strategy=strategies.diloco(inner, H=5), steps=steps,
                      log_every=5, **_RUN).history["lr"]
  # The last step uses the schedule at count 19 of 20.
  want = peak * (floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * 19 / 20)))
  np.testing.assert_allclose(lr[-1], want, rtol=1e-5)


def test_muloco_decays_to_a_tenth_by_default():
  assert strategy_fields.defaults(strategies.spec("muloco"))["min_lr_ratio"] == 0.1
  assert strategy_fields.defaults(strategies.spec("diloco"))["min_lr_ratio"] == 0.0


# ------------------------------------------------------------------ DeMo
def test_demo_weight_decay_is_decoupled_like_the_reference():
  """theta <- theta (1 - lr wd) - lr sign(...): with and without decay, one
  step differs by exactly lr * wd * theta."""
  lr, wd = 0.1, 0.05
  params = {"w": jax.random.normal(KEY, (8, 8))}
  grads_W = {"w": jax.random.normal(jax.random.PRNGKey(1), (2, 8, 8))}

  def one_step(weight_decay):
    strategy = strategies.demo(optax.sgd(lr), chunk=4, k=2,
                               weight_decay=weight_decay)
    state, _ = strategy.local(strategy.init(params, 2, KEY), grads_W)
    return np.asarray(state.params_W["w"][0])

  np.testing.assert_allclose(one_step(wd) - one_step(0.0),
                             -lr * wd * np.asarray(params["w"]), atol=1e-6)


# ------------------------------------------------------------------ SPARTA
def test_sparta_every_k_steps_at_p1_is_fedavg_with_h_k():
  inner = optax.adamw(3e-3)
  sparse = lowbw.simulate(
      strategy=strategies.sparta(inner, p=1.0, sparta_interval=5), steps=20,
      **_RUN)
  fedavg = lowbw.simulate(strategy=strategies.fedavg(inner, H=5), steps=20,
                          **_RUN)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6),
               sparse.params, fedavg.params)
  assert sparse.summary["wire_bytes"] == fedavg.summary["wire_bytes"] > 0


def test_sparta_interval_sends_only_on_its_steps():
  """20 steps every 3: 6 averagings (steps 3, 6, ..., 18), priced on the
  clock only then."""
  net = lowbw.network.network(bandwidth="10Mbps", latency="10ms")
  every = lowbw.simulate(strategy=strategies.sparta(p=0.1), steps=20,
                         network=net, **_RUN).summary
  third = lowbw.simulate(strategy=strategies.sparta(p=0.1, sparta_interval=3),
                         steps=20, network=net, **_RUN).summary
  assert third["wire_bytes"] * 20 == every["wire_bytes"] * 6
  np.testing.assert_allclose(third["comm_s"] * 20, every["comm_s"] * 6)
  assert third["sim_time_s"] < every["sim_time_s"]


# ------------------------------------------------------------ outer optimizer
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_outer_optimizer_is_nesterov_sgd_like_a_plain_loop(momentum):
  """Two outer steps against the textbook Nesterov update (v = mu v + g,
  step = -lr (g + mu v)); momentum 0 is plain SGD."""
  lr, grads = 0.8, [np.array([1.0, -2.0]), np.array([0.5, 0.25])]
  tx = strategies.outer_optimizer(lr, momentum)
  state, x = tx.init(jnp.zeros(2)), np.zeros(2)
  ours, v = jnp.zeros(2), np.zeros(2)
  for g in grads:
    update, state = tx.update(jnp.asarray(g), state)
    ours = ours + update
    v = momentum * v + g
    x = x - lr * (g + momentum * v)
  np.testing.assert_allclose(ours, x, rtol=1e-6)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("build, message", [
    (lambda: strategies.inner_optimizer("adamw", 1e-3, max_norm=0),
     "^max_norm=0 is invalid: expected a finite number > 0"),
    (lambda: strategies.inner_optimizer("adamw", 1e-3, schedule="cosine",
                                        steps=10, min_lr_ratio=1.5),
     r"^min_lr_ratio=1.5 is invalid: expected a number in \[0, 1\]"),
    (lambda: strategies.inner_optimizer("adamw", 1e-3, schedule="cosine"),
     "^steps=None is invalid: a cosine schedule needs the run's steps"),
    (lambda: strategies.outer_optimizer(-0.1),
     "^outer_lr=-0.1 is invalid: expected a finite number > 0"),
    (lambda: strategies.outer_optimizer(0.7, 1.0),
     "^outer_momentum=1.0 is invalid"),
    (lambda: strategies.sparta(sparta_interval=0),
     "^sparta_interval=0 is invalid"),
    (lambda: strategies.sparta_diloco(sparta_interval=2.5),
     "^sparta_interval=2.5 is invalid"),
    (lambda: strategies.demo(weight_decay=-1),
     "^weight_decay=-1 is invalid: expected a finite number >= 0"),
    (lambda: _build(minibatch_size=3), "^minibatch_size=3 is invalid: must "
     "divide batch_size=4"),
    (lambda: _build(minibatch_size=0), "^minibatch_size=0 is invalid"),
    (lambda: _build(autocast="fp16"), "^autocast='fp16' is invalid: expected "
     "one of float32, bfloat16"),
    (lambda: _build(correlation_every=7), "^correlation_every=7 is invalid"),
    (lambda: _build(eval_local="yes"), "^eval_local='yes' is invalid: "
     "expected true or false"),
    (lambda: lowbw.simulate(strategy=strategies.diloco(H=5), steps=10,
                            wandb_project="", **_RUN),
     "^wandb_project='' is invalid: expected a non-empty name"),
])
def test_bad_values_name_the_field(build, message):
  """Every new setting: a one-line error naming it, before compiling."""
  with pytest.raises(ValueError, match=message):
    build()


# ------------------------------------------------------- accumulation
def test_accumulated_gradient_is_the_full_batch_gradient():
  """Four micro-batches through the scan == a loop over them summed == the
  gradient of the whole batch (the MLP's loss is a mean over examples)."""
  from lowbw.simulation._backward import Backward
  from lowbw.simulation._grouping import loss_and_grads
  model = models.mlp(hidden=(16,))
  batch = data.digits().example_batch(16)
  params = model.init(KEY, batch)
  loss, _, full = loss_and_grads(model)(params, batch, KEY)
  micro_loss, _, micro = loss_and_grads(model, Backward(micro=4))(
      params, batch, KEY)
  loop = None
  for i in range(4):  # the reference: one micro-batch at a time
    part = {k: v[4 * i:4 * i + 4] for k, v in batch.items()}
    g = jax.grad(lambda p: model.loss(p, part, KEY)[0])(params)
    loop = g if loop is None else jax.tree.map(jnp.add, loop, g)
  loop = jax.tree.map(lambda x: x / 4, loop)
  eps = float(np.finfo(np.float32).eps)
  for a, b, c in zip(jax.tree.leaves(micro), jax.tree.leaves(loop),
                     jax.tree.leaves(full)):
    # Exact in real arithmetic; in float32 the sides sum the same terms in
    # another order (and XLA may fuse a scanned micro-batch differently), so
    # an entry that cancels to near 0 keeps an error at its leaf's scale:
    # a few eps of the largest gradient per summation (4 micro-batches of 4
    # examples; 16 examples at once against them).
    scale = float(np.max(np.abs(c)))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=max(1e-7, 8 * eps * scale))
    np.testing.assert_allclose(a, c, rtol=1e-4,
                               atol=max(1e-6, 32 * eps * scale))
  np.testing.assert_allclose(micro_loss, loss, rtol=1e-6)


@pytest.mark.parametrize("strategy, extra", [
    (strategies.diloco(optax.sgd(0.1), H=5), {}),
    (strategies.diloco(optax.sgd(0.1), H=5), {"worker_batch": 1}),
    (strategies.ddp(optax.sgd(0.1)), {}),   # one replica: axis 1 split
], ids=["all-at-once", "in-groups", "one-replica"])
def test_a_run_in_micro_batches_equals_the_full_batch_run(strategy, extra):
  kw = dict(_RUN, batch_size=8, steps=10, **extra)
  full = lowbw.simulate(strategy=strategy, **kw)
  micro = lowbw.simulate(strategy=strategy, minibatch_size=2, **kw)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6),
               full.params, micro.params)
  np.testing.assert_allclose(full.history["train_loss"],
                             micro.history["train_loss"], rtol=1e-5)
  assert micro.config["minibatch_size"] == 2


def test_micro_batches_shrink_the_memory_estimate():
  gpt = models.gpt(layers=1, d_model=32, heads=2, seq_len=32)
  source = data.get("text", seq_len=32)

  def flight(minibatch_size):
    sim = lowbw.build(gpt, source, strategies.diloco(H=5), workers=2,
                      batch_size=16, steps=10, minibatch_size=minibatch_size,
                      compile=False)
    return sim.memory.in_flight_all

  whole, quarter = flight(None), flight(4)
  assert quarter < 0.5 * whole


# ------------------------------------------------------------ autocast
def test_autocast_computes_in_bf16_and_keeps_float32_state():
  from lowbw.simulation._backward import Backward
  from lowbw.simulation._grouping import loss_and_grads
  model = models.mlp(hidden=(16,))
  batch = data.digits().example_batch(8)
  params = model.init(KEY, batch)
  grads = loss_and_grads(model, Backward(autocast=jnp.bfloat16))
  text = str(jax.make_jaxpr(grads)(params, batch, KEY))
  assert "bf16[8,16]" in text   # the hidden activations
  loss, _, g = grads(params, batch, KEY)
  assert loss.dtype == jnp.float32
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(g))
  full = lowbw.simulate(strategy=strategies.diloco(optax.sgd(0.1), H=5),
                        steps=10, **_RUN)
  low = lowbw.simulate(strategy=strategies.diloco(optax.sgd(0.1), H=5),
                       steps=10, autocast="bfloat16", **_RUN)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(low.state)
             if jnp.issubdtype(x.dtype, jnp.floating))
  np.testing.assert_allclose(low.history["train_loss"],
                             full.history["train_loss"], rtol=2e-2)
  assert not np.array_equal(low.history["train_loss"],
                            full.history["train_loss"])


# ------------------------------------------- correlation, local evaluation
def _pearson_loop(params_W):
  """The reference: numpy's corrcoef over a loop of flattened workers."""
  w = jax.tree.leaves(params_W)[0].shape[0]
  vecs = [np.concatenate([np.asarray(x[i], np.float64).ravel()
                          for x in jax.tree.leaves(params_W)])
          for i in range(w)]
  c = np.corrcoef(np.stack(vecs))
  return np.mean(c[~np.eye(w, dtype=bool)])


def test_worker_correlation_is_numpys_corrcoef():
  from lowbw.transforms import worker_correlation
  keys = jax.random.split(KEY, 3)
  base = {"a": jax.random.normal(keys[0], (5, 7)),
          "b": jax.random.normal(keys[1], (3,))}
  noise = jax.tree.map(lambda x: jax.random.normal(keys[2], (4,) + x.shape),
                       base)
  params_W = jax.tree.map(lambda b, n: b[None] + 0.7 * n * jnp.arange(
      1, 5).reshape((4,) + (1,) * b.ndim), base, noise)
  np.testing.assert_allclose(worker_correlation(params_W),
                             _pearson_loop(params_W), rtol=1e-5)
  same = jax.tree.map(lambda b: jnp.stack([b] * 3), base)
  np.testing.assert_allclose(worker_correlation(same), 1.0, rtol=1e-6)


def test_correlation_and_local_evaluation_in_a_run():
  # SPARTA keeps the workers apart between evaluations (DiLoCo's workers
  # are the global model again after each sync, where evaluations fall).
  result = lowbw.simulate(
      strategy=strategies.sparta(optax.adam(1e-2), p=0.1), steps=20,
      eval_every=10, correlation_every=10, eval_local=True, log_every=5,
      **_RUN)
  h = result.history
  at = {int(s): i for i, s in enumerate(h["step"])}
  # Logged at steps 10 and 20, carried to the rows between.
  assert np.isnan(h["worker_correlation"][at[5]])
  assert 0 < h["worker_correlation"][at[10]] < 1
  assert h["worker_correlation"][at[15]] == h["worker_correlation"][at[10]]
  for s in (10, 20):
    assert np.isfinite(h["eval_local_loss"][at[s]])
    assert h["eval_local_loss_std"][at[s]] > 0
    assert 0 <= h["eval_local_accuracy"][at[s]] <= 1
  # One worker at a time, by hand: the mean of their own eval losses.
  last = jax.tree.map(lambda x: x, result.state.strategy.params_W)
  model, batches = _RUN["model"], data.digits().eval_batches(None)
  key = jax.random.fold_in(result.state.loss_key, 0xE7A1)
  own = []
  for w in range(2):
    p = jax.tree.map(lambda x: x[w], last)
    own.append(np.mean([float(model.loss(p, {k: v[i] for k, v in
                                             batches.items()}, key)[0])
                        for i in range(len(batches["y"]))]))
  np.testing.assert_allclose(h["eval_local_loss"][-1], np.mean(own),
                             rtol=1e-5)
  np.testing.assert_allclose(h["eval_local_loss_std"][-1], np.std(own),
                             rtol=1e-4, atol=1e-7)


def test_classifiers_log_no_train_perplexity():
  # Language models do: tests/test_simulate.py::test_language_model_end_to_end.
  classifier = lowbw.build(strategy=strategies.diloco(H=5), steps=10,
                           compile=False, **_BUILD)
  assert "train_perplexity" not in classifier.columns()


# ---------------------------------------------------------- Weights & Biases
class _FakeWandb:
  """Records what lowbw hands the wandb API (init, log, finish)."""

  def __init__(self):
    self.inits, self.logged, self.finished = [], [], 0

  def init(self, **kwargs):
    self.inits.append(kwargs)
    return self

  def log(self, values, step):
    self.logged.append((step, values))

  def finish(self):
    self.finished += 1


def test_wandb_logs_the_csvs_metrics_and_the_config(tmp_path, monkeypatch):
  import csv
  import sys
  fake = _FakeWandb()
  monkeypatch.setitem(sys.modules, "wandb", fake)
  assert cli.main(CLI + ["--H", "5", "--out", str(tmp_path / "run"),
                         "--wandb-project", "lowbw-test"]) == 0
  (init,) = fake.inits
  assert init["project"] == "lowbw-test" and init["name"] == "run"
  assert init["config"]["strategy"]["name"] == "diloco"
  assert fake.finished == 1
  with open(tmp_path / "run" / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert [s for s, _ in fake.logged] == [int(r["step"]) for r in rows]
  for (_, values), row in zip(fake.logged, rows):
    for name, value in values.items():
      assert float(row[name]) == pytest.approx(value, rel=1e-12)
    assert {k for k, v in row.items() if v and k != "step"} == set(values)


def test_wandb_without_the_package_is_a_clear_error(monkeypatch, capsys):
  import sys
  monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
  assert cli.main(CLI + ["--H", "5", "--wandb-project", "p"]) == 2
  err = capsys.readouterr().err
  assert "--wandb-project='p' is invalid: needs the wandb package" in err
  assert "pip install 'lowbw[wandb]'" in err
