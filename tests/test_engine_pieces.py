"""The engine's pieces: strategies' own metrics reaching the logs, the
engine-owned participation mask, and the report contract's errors."""

import csv
import gc

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import data, models, strategies
from lowbw import network as net_lib
from lowbw.transforms import (group_mean, participants, participating,
                              replace_with_mean, worker_mean, worker_sum)

W, B = 4, 8
MLP = models.mlp(hidden=(8,), num_classes=4)


def source():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(W * B, 6)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
  return data.arrays(x, y, eval=(x[:16], y[:16]), sharding="contiguous")


def run(strategy, **kw):
  kw.setdefault("progress", False)
  kw.setdefault("steps", 6)
  return lowbw.simulate(model=MLP, data=source(), strategy=strategy,
                        workers=W, batch_size=B, **kw)


def counting_strategy(H=3):
  """DiLoCo whose local step reports its step counter and whose sync reports
  1000 + the counter: a user's strategy with its own metrics, made outside
  lowbw."""
  base = strategies.diloco(optax.sgd(0.1), H=H)

  def local(state, grads_W):
    state, report = base.local(state, grads_W)
    return state, {**report, "counter": state.step.astype(jnp.float32)}

  def sync(state):
    state, report = base.sync(state)
    return state, {**report,
                   "counter": 1000.0 + state.step.astype(jnp.float32)}

  return base._replace(local=local, sync=sync)


def test_a_strategys_own_metrics_reach_history_csv_and_summary(tmp_path):
  r = run(counting_strategy(), log_every=1, out=str(tmp_path))
  steps = r.history["step"]
  # The latest value at each logged step: the sync's at round ends (3, 6).
  expected = np.where(steps % 3 == 0, 1000.0 + steps, steps)
  np.testing.assert_array_equal(r.history["strategy_counter"], expected)
  assert "strategy_pseudo_grad_norm" in r.history  # DiLoCo's own
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert [float(row["strategy_counter"]) for row in rows] == list(expected)


def test_diloco_reports_the_norm_of_its_mean_pseudo_gradient():
  strategy = strategies.diloco(optax.sgd(0.1), H=2)
  params = MLP.init(jax.random.PRNGKey(0), source().example_batch(B))
  state = strategy.init(params, W, jax.random.PRNGKey(1))
  shift = jnp.arange(W, dtype=jnp.float32)
  state = state._replace(params_W=jax.tree.map(
      lambda x: x + 0.01 * shift.reshape((-1,) + (1,) * (x.ndim - 1)),
      state.params_W))
  _, report = strategy.sync(state)
  # By hand: the mean over workers of global - theta_w, one worker at a time.
  deltas = [jax.tree.map(lambda g, x: g - x[w], params, state.params_W)
            for w in range(W)]
  mean = jax.tree.map(lambda *d: sum(d) / W, *deltas)
  norm = np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(mean)))
  np.testing.assert_allclose(float(report["pseudo_grad_norm"]), norm,
                             rtol=1e-5)
  assert report["pseudo_gradients"] == 1


def test_a_report_entry_that_is_neither_channel_nor_metric_is_an_error():
  base = strategies.diloco(optax.sgd(0.1), H=2)

  def sync(state):
    state, report = base.sync(state)
    return state, {**report, "pseudo_gradient": jnp.int32(1)}  # a typo

  with pytest.raises(ValueError, match=r"report='pseudo_gradient' is "
                     r"invalid: .*not one of its channels \(pseudo_gradients"):
    lowbw.build(model=MLP, data=source(), strategy=base._replace(sync=sync),
                workers=W, batch_size=B, steps=4)


# ------------------------------------------------------ participation mask
def test_reductions_honour_the_participation_mask():
  x = jnp.arange(8.0).reshape(4, 2)
  active = jnp.array([True, False, True, False])
  with participating(active):
    assert participants() is active
    np.testing.assert_allclose(worker_mean(x), (x[0] + x[2]) / 2)
    np.testing.assert_allclose(worker_sum(x), x[0] + x[2])
    np.testing.assert_allclose(replace_with_mean(x)[1], (x[0] + x[2]) / 2)
    out = group_mean(x, jnp.arange(4), 2)
    np.testing.assert_allclose(out[:2], np.stack([x[0], x[0]]))
    np.testing.assert_allclose(out[2:], np.stack([x[2], x[2]]))
    # An explicit mask wins over the ambient one.
    np.testing.assert_allclose(worker_mean(x, jnp.ones(4, bool)),
                               x.mean(axis=0))
  assert participants() is None
  np.testing.assert_allclose(worker_mean(x), x.mean(axis=0))


def test_a_notebook_step_under_a_mask_averages_the_participants_only():
  strategy = strategies.ddp(optax.sgd(0.5))
  params = {"w": jnp.zeros(3)}
  state = strategy.init(params, W, jax.random.PRNGKey(0))
  grads_W = {"w": jnp.arange(W * 3, dtype=jnp.float32).reshape(W, 3)}
  active = jnp.array([True, True, False, False])
  step = jax.jit(lambda s, g, a: _masked_step(strategy, s, g, a))
  new, _ = step(state, grads_W, active)
  by_hand = -0.5 * (grads_W["w"][0] + grads_W["w"][1]) / 2
  for w in range(W):  # every worker receives the participants' mean
    np.testing.assert_allclose(new.params_W["w"][w], by_hand)
  # A second mask, same program: nothing of the first trace is kept.
  other, _ = step(state, grads_W, ~active)
  np.testing.assert_allclose(
      other.params_W["w"][0], -0.5 * (grads_W["w"][2] + grads_W["w"][3]) / 2)


def _masked_step(strategy, state, grads_W, active):
  with participating(active):
    return strategy.step(state, grads_W)


@pytest.fixture
def frozen_heap():
  """JAX's leak check runs ``gc.collect`` and ``gc.get_referrers`` at the end
  of every trace still alive: both walk every object the garbage collector
  tracks, so late in a test process (a heap grown by earlier modules) one
  strategy's check took 6-12 s instead of 0.5-2 s. Frozen objects (made
  before the test) are skipped by both; a leaked tracer is made during the
  trace, so it is still found (test_a_leak_is_found_under_a_frozen_heap).
  They stay frozen after the test, as conftest freezes the heap after
  collection: unfreezing would hand the collector back every object the
  session froze."""
  gc.collect()
  gc.freeze()
  yield


_LEAKED = []


def test_a_leak_is_found_under_a_frozen_heap(frozen_heap):
  def leaky(x):
    _LEAKED.append(x)  # a list made before the freeze keeps the tracer
    return 2 * x
  with pytest.raises(Exception, match="Leaked trace"):
    with jax.checking_leaks():
      jax.make_jaxpr(leaky)(jnp.ones(3))
  _LEAKED.clear()


@pytest.mark.parametrize("name", sorted(strategies.REGISTRY))
def test_masked_programs_leak_no_tracer(name, frozen_heap):
  """Strategies read the mask of the trace they run in; JAX must not cache a
  trace's mask into another (a leak fails the trace here). That each
  strategy trains under a fault or fleet mask is the golden fixtures' third
  case (tests/golden/trajectories.py), run bit for bit."""
  kwargs = ({} if name in ("ddp", "sparta", "demo") else
            {"Kx": 2} if name in ("desloc", "mtdao") else {"H": 2})
  model, data_ = MLP, source()
  if name == "spes":  # a mixture of W experts; merging in the first round
    kwargs.update(merge_warmup_steps=4, merge_every=2, merge_top_k=1)
    model = models.moe_gpt(layers=1, d_model=8, heads=2, seq_len=8,
                           num_experts=W, top_k=1, expert_hidden=8)
    data_ = data.text_bytes(seq_len=8)
  net = net_lib.network("1Gbps", "10ms", hardware="0.01s",
                        faults=net_lib.Faults(drop_prob=0.3))
  strategy = strategies.get(name, **kwargs)
  if strategy.asynchronous:  # its masks: an uneven fleet's arrivals, and
    # a worker down for a window
    net = net_lib.network("1Gbps", "10ms", hardware="0.01s",
                          speeds=[1.0] * (W - 1) + [0.5],
                          faults=net_lib.Faults(windows=((0, 1, 3),)))
  sim = lowbw.build(model=model, data=data_, strategy=strategy, workers=W,
                    batch_size=B, steps=4, network=net, compile=False)
  state, sampler, net_params = sim.initial(0)[:3]
  with jax.checking_leaks():
    jaxpr = jax.make_jaxpr(sim.programs.chunk)(state, sampler, 1, net_params)
  assert not [c for c in jaxpr.consts if isinstance(c, jax.core.Tracer)]


def test_the_engine_chooses_each_features_piece_from_the_config():
  """A feature is a piece chosen once from the ``RunConfig``: a plain run
  has the scanned steps, the plain draw, no lane, no probe and the global
  evaluation only; each setting swaps or adds its own piece, and a run
  with all of them together still runs and logs their columns."""
  from lowbw.simulation import _engine
  from lowbw.simulation._api import engine_config

  def pieces(**kw):
    c = engine_config(lowbw.Config(
        model=MLP, data=source(), strategy=strategies.diloco(optax.sgd(0.1),
                                                             H=2),
        workers=W, batch_size=B, steps=4, devices=1, **kw))
    return _engine.pieces(c, _engine.Parts(()))

  plain = pieces()
  assert plain.steps is _engine.scanned_steps
  assert plain.draw is _engine.draw
  assert plain.lanes == () and plain.probe is _engine.no_correlation
  assert plain.evaluations == (_engine.evaluate_global,)
  assert pieces(worker_batch=2).steps.func is _engine.grouped_steps
  assert pieces(worker_batch=2).steps.args[0].size == 2
  assert pieces(correlation_every=2).probe.func is _engine.correlation
  shadow = pieces(shadow="ddp")
  assert [lane.func for lane in shadow.lanes] == [_engine.shadow_steps]
  assert shadow.evaluations == (_engine.evaluate_global,
                                _engine.evaluate_shadow)
  both = pieces(shadow="ddp", eval_local=True)
  assert both.evaluations == (_engine.evaluate_global, _engine.evaluate_shadow,
                              _engine.evaluate_workers)
  faults = net_lib.Faults(failures=((1, 2),), leave_shards="redistribute")
  net = net_lib.network("1Gbps", "10ms", hardware="0.01s", faults=faults)
  assert pieces(network=net).draw is _engine.draw_redistributed

  r = run(strategies.diloco(optax.sgd(0.1), H=2), steps=4, shadow="ddp",
          eval_local=True, correlation_every=2, worker_batch=2)
  for column in ("shadow_eval_loss", "eval_local_loss",
                 "worker_correlation"):
    assert np.isfinite(r.history[column][-1]), column
