"""The simulated clock, stragglers and faults inside ``lowbw.simulate``.

Times are checked against the alpha-beta model computed by hand here; the
training under faults and stragglers against a per-worker Python loop.
"""

import math

import chex
import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import data, models, strategies
from lowbw import network as net_lib

import ideal
from lowbw.network import _clock
from lowbw.simulation._api import engine_config
from lowbw.simulation import _engine

W, B = 4, 8
MLP = models.mlp(hidden=(16,), num_classes=4)
C = 0.01                     # seconds per step ("0.01s" hardware)
BW, LAT = 1e8, 0.1           # 100 Mbit/s, 100 ms


def toy_arrays(n, seed=0, dim=6):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + 2 * (x[:, 1] > 0).astype(np.int32)
  return x, y


X, Y = toy_arrays(W * B)
EVAL = toy_arrays(40, seed=99)


def source():
  # Contiguous shards of B examples and batch B: worker w sees exactly its
  # shard every step, so the reference knows every batch.
  return data.arrays(X, Y, eval=EVAL, sharding="contiguous")


def run(strategy, steps=8, network=None, workers=W, **kw):
  kw.setdefault("progress", False)
  kw.update(clock=False) if network is None else kw.update(network=network)
  return lowbw.simulate(model=MLP, data=source(), strategy=strategy,
                        workers=workers, batch_size=B, steps=steps, **kw)


def base_network(**kw):
  return ideal.network("100Mbps", "100ms", hardware="0.01s", **kw)


def ring_seconds(payload, n, bw=BW, lat=LAT):
  """Ring all-reduce by hand: 2(n-1) hops of payload/n bytes."""
  return 2 * (n - 1) * (lat + 8 * payload / n / bw) if n > 1 else 0.0


def initial_params(seed=0):
  init_key = jax.random.split(jax.random.PRNGKey(seed), 4)[0]
  return MLP.init(init_key, source().example_batch(B))


def batch(w):
  return {"x": X[w * B:(w + 1) * B], "y": Y[w * B:(w + 1) * B]}


# One compiled gradient for the references' every call (op by op, a
# reference's 40 gradients took a second).
_GRAD = jax.jit(jax.grad(lambda p, b: MLP.loss(p, b, None)[0]))


def grad(params, w):
  return _GRAD(params, batch(w))


def num_bytes(params):
  return sum(x.size * 4 for x in jax.tree.leaves(params))


# ------------------------------------------------------------------ clock
def test_ddp_and_diloco_clocks_by_hand():
  net = base_network()
  P = num_bytes(initial_params())
  T = ring_seconds(P, W)
  ddp = run(strategies.ddp(optax.sgd(0.1)), steps=20, network=net)
  diloco = run(strategies.diloco(optax.sgd(0.1), H=5), steps=20, network=net,
               log_every=5)
  assert ddp.summary["sim_time_s"] == pytest.approx(20 * (C + T), rel=1e-5)
  assert diloco.summary["sim_time_s"] == pytest.approx(4 * (5 * C + T),
                                                       rel=1e-5)
  ratio = ddp.summary["sim_time_s"] / diloco.summary["sim_time_s"]
  assert ratio == pytest.approx(5 * (C + T) / (5 * C + T), rel=1e-5)
  # The clock is logged per row and is the same at every DiLoCo round end.
  np.testing.assert_allclose(diloco.history["sim_time_s"],
                             np.arange(1, 5) * (5 * C + T), rtol=1e-5)
  assert diloco.config["network"]["comm_s_per_event"]["pseudo_gradients"] == (
      pytest.approx(T))


def test_gpt_ddp_vs_diloco_h100_factor():
  """A GPT on a 100 Mbit/s, 100 ms link, DDP against DiLoCo(H=100), on the
  default hardware (H100 at MFU 0.4). The clock reads the model only through
  its parameter count, so a one-block GPT tests the same formula as the
  default one at a fraction of the compile time."""
  gpt = models.gpt(layers=1, d_model=32, seq_len=32)
  text = data.text_bytes(seq_len=32)
  net = ideal.network("100Mbps", "100ms")
  kw = dict(model=gpt, data=text, workers=2, batch_size=1, steps=100,
            network=net, progress=False, eval_examples=2)
  ddp = lowbw.simulate(strategy=strategies.ddp(), **kw)
  diloco = lowbw.simulate(strategy=strategies.diloco(H=100), **kw)
  n = ddp.summary["num_params"]
  c = 6 * n * 1 * text.tokens_per_example / (989e12 * 0.4)
  t = ring_seconds(4 * n, 2)
  predicted = 100 * (c + t) / (100 * c + t)
  measured = ddp.summary["sim_time_s"] / diloco.summary["sim_time_s"]
  assert measured == pytest.approx(predicted, rel=1e-5)
  assert measured > 90  # communication-bound: DDP pays the link 100 times


def test_overlap_costs_max_of_compute_and_communication():
  P = num_bytes(initial_params())
  T = ring_seconds(P, W)
  H = 5
  strategy = strategies.diloco(optax.sgd(0.1), H=H)
  slow_link = run(strategy, steps=20, network=base_network(overlap=True))
  # T > H*C: rounds are communication-bound once the pipeline is full; the
  # clock ends when the last pseudo-gradients arrive.
  assert T > H * C
  assert slow_link.summary["sim_time_s"] == pytest.approx(H * C + 4 * T,
                                                          rel=1e-5)
  fast = ideal.network("100Gbps", "0.1ms", hardware="0.01s", overlap=True)
  t_fast = ring_seconds(P, W, 1e11, 1e-4)
  assert t_fast < H * C
  r = run(strategy, steps=20, network=fast)
  assert r.summary["sim_time_s"] == pytest.approx(4 * H * C + t_fast, rel=1e-5)


def test_hierarchical_topology_by_hand():
  P = num_bytes(initial_params())
  net = ideal.network("100Mbps", "100ms", topology="hierarchical",
                        group_size=2, regional_bandwidth="10Gbps",
                        regional_latency="5ms", hardware="0.01s")
  r = run(strategies.diloco(optax.sgd(0.1), H=4), steps=8, network=net)
  inside = ring_seconds(P, 2, 1e10, 5e-3)
  across = ring_seconds(P / 2, 2)
  assert r.summary["sim_time_s"] == pytest.approx(2 * (4 * C + inside + across),
                                                  rel=1e-5)
  wire = 2 * (2 - 1) / 2 * P + 2 * (2 - 1) / 2 * (P / 2)
  assert r.summary["wire_bytes"] == pytest.approx(2 * wire)
  assert r.summary["collectives"] == {"pseudo_gradients":
                                      "hierarchical_allreduce"}


def test_parameter_server_and_all_gather_bytes_follow_the_topology():
  P = num_bytes(initial_params())
  net = ideal.network("100Mbps", "100ms", topology="parameter_server",
                        hardware="0.01s")
  r = run(strategies.ddp(optax.sgd(0.1)), steps=3, network=net)
  assert r.summary["wire_bytes"] == 3 * P
  hop = LAT + 8 * P / BW
  assert r.summary["sim_time_s"] == pytest.approx(3 * (C + 2 * hop), rel=1e-5)


def test_slowest_worker_sets_the_pace():
  P = num_bytes(initial_params())
  net = ideal.network("100Mbps", "100ms", hardware="0.01s",
                        speeds=(1, 1, 0.5, 2))
  r = run(strategies.diloco(optax.sgd(0.1), H=4), steps=8, network=net)
  assert r.summary["sim_time_s"] == pytest.approx(
      2 * (4 * C / 0.5 + ring_seconds(P, W)), rel=1e-5)


def test_a_network_alone_leaves_training_unchanged():
  strategy = strategies.sparta_diloco(optax.adamw(3e-3), H=4, p=0.1)
  a = run(strategy, steps=6)
  b = run(strategy, steps=6, network=base_network())
  chex.assert_trees_all_equal(a.params, b.params)
  np.testing.assert_array_equal(a.history["train_loss"],
                                b.history["train_loss"])
  assert "sim_time_s" not in a.history and "sim_time_s" in b.history


def test_checkpoint_and_resume_continue_the_clock(tmp_path):
  net = base_network(stragglers=net_lib.Stragglers(jitter=0.3),
                     faults=net_lib.Faults(drop_prob=0.2))
  strategy = strategies.diloco(optax.sgd(0.1), H=2)
  whole = run(strategy, steps=12, network=net, log_every=2)
  run(strategy, steps=6, network=net, log_every=2, out=str(tmp_path),
      checkpoint_every=6)
  resumed = run(strategy, steps=12, network=net, log_every=2,
                resume_from=str(tmp_path))
  np.testing.assert_array_equal(whole.history["sim_time_s"],
                                resumed.history["sim_time_s"])
  np.testing.assert_array_equal(whole.history["sync_workers"],
                                resumed.history["sync_workers"])
  chex.assert_trees_all_equal(whole.params, resumed.params)


# ------------------------------------------------------------ faults, stragglers
def diloco_reference(up_at, active_at, rounds, H, lr=0.05, momentum=0.9):
  """DiLoCo by hand: inner SGD with momentum on up workers only, the outer
  step on the mean pseudo-gradient of the active ones, everyone restarts from
  the global parameters (down workers too: they rejoin)."""
  g = initial_params()
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  inner = optax.sgd(lr, momentum=momentum)
  outer_state = outer.init(g)
  params = [g] * W
  states = [inner.init(g) for _ in range(W)]
  for r in range(rounds):
    up, active = up_at(r * H), active_at(r * H)
    for w in range(W):
      if up[w]:
        for _ in range(H):
          u, states[w] = inner.update(grad(params[w], w), states[w], params[w])
          params[w] = optax.apply_updates(params[w], u)
    senders = [w for w in range(W) if active[w]]
    if senders:
      delta = jax.tree.map(
          lambda gl, *ps: sum(gl - p for p in ps) / len(ps), g,
          *[params[w] for w in senders])
      u, outer_state = outer.update(delta, outer_state, g)
      g = optax.apply_updates(g, u)
      params = [g] * W
    else:  # nobody took part: the sync is skipped, down workers rejoin
      params = [p if up[w] else g for w, p in enumerate(params)]
  return g


def diloco_strategy(H):
  return strategies.diloco(optax.sgd(0.05, momentum=0.9),
                           optax.sgd(0.7, momentum=0.9, nesterov=True), H=H)


def test_down_workers_are_left_out_and_rejoin_with_the_global_params():
  faults = net_lib.Faults(windows=((1, 2, 6),), failures=((3, 6),))
  r = run(diloco_strategy(2), steps=10, network=base_network(faults=faults))

  def up(step):
    return [not (w == 1 and 2 <= step < 6) and not (w == 3 and step >= 6)
            for w in range(W)]

  expected = diloco_reference(up, up, rounds=5, H=2)
  chex.assert_trees_all_close(r.params, expected, atol=2e-5, rtol=1e-4)
  assert list(r.history["sync_workers"][-1:]) == [3]
  # A run where the same worker never drops is different (the test can fail).
  plain = run(diloco_strategy(2), steps=10, network=base_network())
  assert not np.allclose(jax.tree.leaves(plain.params)[0],
                         jax.tree.leaves(r.params)[0], atol=1e-4)


def test_random_dropouts_match_the_reference_with_the_same_masks():
  net = base_network(faults=net_lib.Faults(drop_prob=0.4))
  r = run(diloco_strategy(2), steps=12, network=net)
  params = _clock.net_params(_clock.check_network(net, W), W,
                             _clock.price(net, {}, W, 1, 0.0), 0)
  up = lambda step: [bool(v) for v in _clock.up_mask(params, step)]  # noqa: E731
  masks = np.array([up(s) for s in range(0, 12, 2)])
  assert 0 < masks.mean() < 1  # some workers did drop out
  expected = diloco_reference(up, up, rounds=6, H=2)
  chex.assert_trees_all_close(r.params, expected, atol=2e-5, rtol=1e-4)
  np.testing.assert_array_equal(r.history["sync_workers"],
                                masks.sum(axis=1)[-len(r.history["step"]):]
                                if len(r.history["step"]) == 6 else
                                r.history["sync_workers"])


  # Each worker sends and receives one ring all-reduce's share per sync it
  # took part in (it was up), and nothing for the others.
  wire = r.history["wire_bytes"][-1] / 6
  np.testing.assert_allclose(r.summary["sent_bytes_per_worker"],
                             wire * masks.sum(axis=0), rtol=1e-9)
  # It receives as much, and a download of the global state each time it
  # comes back after a down round.
  back = (masks[1:] & ~masks[:-1]).sum(axis=0)
  state = r.config["channels"]["catch_up"]["down_bytes"]
  np.testing.assert_allclose(r.summary["received_bytes_per_worker"],
                             wire * masks.sum(axis=0) + state * back,
                             rtol=1e-9)
  assert sum(r.summary["sent_bytes_per_worker"]) == pytest.approx(
      r.summary["sent_bytes"])


@pytest.mark.parametrize("stragglers", [
    net_lib.Stragglers(mitigation="threshold", fraction=0.5),
    net_lib.Stragglers(mitigation="backup", backups=2),
])
def test_straggler_mitigation_drops_the_slow_workers_updates(stragglers):
  speeds = (1.0, 0.5, 1.0, 0.5)
  net = ideal.network("100Mbps", "100ms", hardware="0.01s", speeds=speeds,
                        stragglers=stragglers)
  r = run(diloco_strategy(2), steps=8, network=net)
  fast = [s == 1.0 for s in speeds]
  expected = diloco_reference(lambda s: [True] * W, lambda s: fast, rounds=4,
                              H=2)
  chex.assert_trees_all_close(r.params, expected, atol=2e-5, rtol=1e-4)
  T = ring_seconds(num_bytes(initial_params()), W)
  # The round waits for the fast workers only.
  assert r.summary["sim_time_s"] == pytest.approx(4 * (2 * C + T), rel=1e-5)
  workers = r.history["sync_workers"]
  assert set(workers[~np.isnan(workers)]) == {2}  # NaN: before any sync


def test_ddp_down_worker_gradient_is_excluded():
  faults = net_lib.Faults(windows=((2, 1, 3),))
  sgd = optax.sgd(0.1)
  r = run(strategies.ddp(sgd), steps=4, network=base_network(faults=faults))
  p = initial_params()
  for step in range(4):
    senders = [w for w in range(W) if not (w == 2 and 1 <= step < 3)]
    g = jax.tree.map(lambda *gs: sum(gs) / len(gs),
                     *[grad(p, w) for w in senders])
    p = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
  chex.assert_trees_all_close(r.params, p, atol=2e-5, rtol=1e-4)
  np.testing.assert_array_equal(r.history["sync_workers"], [4, 3, 3, 4])


def test_lost_messages_never_lose_the_global_model():
  net = base_network(faults=net_lib.Faults(message_loss=1.0))
  r = run(diloco_strategy(2), steps=6, network=net)
  chex.assert_trees_all_equal(r.params, initial_params())
  workers = r.history["sync_workers"]
  assert set(workers[~np.isnan(workers)]) == {0}


def test_masked_reductions():
  from lowbw.transforms import group_mean, worker_mean
  x = jnp.arange(8.0).reshape(4, 2)
  active = jnp.array([True, False, True, False])
  np.testing.assert_allclose(worker_mean(x, active), (x[0] + x[2]) / 2)
  np.testing.assert_allclose(worker_mean(x, jnp.zeros(4, bool)), 0 * x[0])
  perm = jnp.array([0, 1, 2, 3])
  out = group_mean(x, perm, 2, jnp.array([True, False, False, False]))
  np.testing.assert_allclose(out[:2], np.stack([x[0], x[0]]))
  np.testing.assert_allclose(out[2:], x[2:])  # nobody active: unchanged


def test_changing_probabilities_and_links_does_not_recompile():
  src = source()
  strategy = diloco_strategy(2)
  params = initial_params()
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  state = strategy.init(params, W, k1)
  sim = _engine.SimState(state, k2, k3, jnp.ones(W, bool))
  sampler = src.build(W, B, 0)
  channels = strategy.channels(params, W)
  faulty = ideal.network("1Gbps", "50ms", hardware="0.01s",
                           faults=net_lib.Faults(drop_prob=0.1))
  config = engine_config(lowbw.Config(
      model=MLP, data=src, strategy=strategy, workers=W, batch_size=B,
      steps=4, network=faulty, rounds_per_chunk=2, devices=1))
  assert config.masks
  chunk = jax.jit(_engine.build(
      config, _engine.Parts(tuple(strategy.channels(params, W)))).chunk)

  def params_of(**kw):
    faults = net_lib.Faults(drop_prob=kw.pop("drop", 0.1))
    net = ideal.network(kw.pop("bw", "1Gbps"), "50ms", hardware="0.01s",
                          stragglers=net_lib.Stragglers(**kw), faults=faults)
    net = _clock.check_network(net, W)
    return _clock.net_params(net, W, _clock.price(net, channels, W, 1, 0.0),
                             0)

  sim, _ = chunk(sim, sampler, 2, params_of())
  compiles = []
  listener = lambda event, *_, **__: compiles.append(event) if (  # noqa: E731
      "backend_compile" in event) else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for kw in ({"drop": 0.5}, {"jitter": 0.7}, {"bw": "10Mbps"},
               {"mitigation": "threshold", "fraction": 0.5},
               {"mitigation": "backup", "backups": 2}):
      sim, out = chunk(sim, sampler, 2, params_of(**kw))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not compiles
  assert np.all(np.isfinite(np.asarray(out.clock.compute_s)))


@pytest.mark.parametrize("network, field", [
    ("1Gbps", "network"),
    (ideal.network(topology="hierarchical", group_size=3), "group_size"),
    (ideal.network(speeds=(1, 2)), "speeds"),
    (ideal.network(faults=net_lib.Faults(drop_prob=1.5)), "drop_prob"),
    (ideal.network(faults=net_lib.Faults(windows=((9, 0, 1),))), "windows"),
    (ideal.network(stragglers=net_lib.Stragglers(mitigation="x")),
     "mitigation"),
    (ideal.network(stragglers=net_lib.Stragglers(mitigation="backup",
                                                   backups=4)), "backups"),
])
def test_bad_networks_fail_at_build_naming_the_field(network, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    run(strategies.ddp(), steps=2, network=network)


def test_clock_values_are_finite_and_grow():
  net = base_network(stragglers=net_lib.Stragglers(jitter=0.5),
                     faults=net_lib.Faults(drop_prob=0.3, message_loss=0.2))
  # SPARTA's masks are exercised by the tests above; these are the others.
  for strategy in (strategies.fedavg(optax.sgd(0.1), H=2, island_size=2),
                   strategies.demo(), strategies.sparta_diloco(H=2, p=0.2)):
    r = run(strategy, steps=5, network=net, log_every=1)
    t = r.history["sim_time_s"]
    assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= 0), strategy.name
    assert math.isfinite(r.history["eval_loss"][-1])


def test_all_gather_channels_are_timed_as_gathers():
  r = run(strategies.demo(), steps=2, network=base_network())
  payload = r.config["channels"]["momentum_components"]["payload_bytes"]
  hop = LAT + 8 * payload / BW
  assert r.summary["sim_time_s"] == pytest.approx(2 * (C + (W - 1) * hop),
                                                  rel=1e-5)
  assert r.summary["wire_bytes"] == 2 * (W - 1) * payload


@pytest.mark.parametrize("make, faults", [
    (lambda: strategies.ddp(optax.sgd(0.1)),
     net_lib.Faults(windows=tuple((w, 1, 2) for w in range(W)))),
    (lambda: strategies.sparta(optax.sgd(0.1), p=0.2),
     net_lib.Faults(windows=tuple((w, 1, 2) for w in range(W)))),
    (lambda: strategies.fedavg(optax.sgd(0.1), H=2),
     net_lib.Faults(message_loss=1.0, windows=((1, 0, 4),))),
])
def test_a_communication_with_nobody_keeps_the_model(make, faults):
  """Strategies whose global model is the mean of the active workers must not
  fall back to a mean over nobody (zeros) when a communication is empty."""
  r = run(make(), steps=4, network=base_network(faults=faults))
  norm = sum(float(jnp.sum(jnp.abs(x))) for x in jax.tree.leaves(r.params))
  assert norm > 0.1 * sum(float(jnp.sum(jnp.abs(x)))
                          for x in jax.tree.leaves(initial_params()))
  assert np.isfinite(r.history["eval_loss"][-1])


def test_jitter_alone_leaves_training_bit_identical():
  strategy = strategies.diloco(optax.sgd(0.1), H=2)
  a = run(strategy, steps=6, network=base_network())
  b = run(strategy, steps=6, network=base_network(
      stragglers=net_lib.Stragglers(jitter=0.5)))
  chex.assert_trees_all_equal(a.params, b.params)
  assert b.summary["sim_time_s"] != a.summary["sim_time_s"]


def test_a_window_without_a_round_start_is_rejected():
  faults = net_lib.Faults(windows=((1, 3, 5),))
  with pytest.raises(ValueError, match=r"^windows=\(1, 3, 5\).*H=6"):
    run(diloco_strategy(6), steps=12, network=base_network(faults=faults))


def test_ddp_step_with_every_worker_down_is_skipped():
  faults = net_lib.Faults(windows=tuple((w, 1, 2) for w in range(W)))
  r = run(strategies.ddp(optax.sgd(0.1)), steps=4,
          network=base_network(faults=faults))
  p = initial_params()
  for step in (0, 2, 3):  # step 1: nobody up, nothing happens
    g = jax.tree.map(lambda *gs: sum(gs) / W, *[grad(p, w) for w in range(W)])
    p = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
  chex.assert_trees_all_close(r.params, p, atol=2e-5, rtol=1e-4)


# ------------------------------------------------------ per-worker links
def test_one_slow_link_sets_the_rings_pace_and_leaves_training_alone(
    tmp_path, capsys):
  """A fleet whose one worker has a 10x slower link: every ring step
  waits for it, so the clock equals the fleet whose links are all that
  slow; the training is the same bits as on equal links; the command line
  takes the list and refuses one of the wrong length."""
  base = dict(data="digits", hidden="8", workers=4, batch_size=4, steps=8,
              H=2, eval_examples=32, latency="10ms", hardware="0.01s")
  one_slow = lowbw.simulate(lowbw.Config(
      **base, bandwidth="1Gbps,100Mbps,1Gbps,1Gbps"))
  all_slow = lowbw.simulate(lowbw.Config(**base, bandwidth="100Mbps"))
  all_fast = lowbw.simulate(lowbw.Config(**base, bandwidth="1Gbps"))
  assert one_slow.summary["sim_time_s"] == pytest.approx(
      all_slow.summary["sim_time_s"], rel=1e-9)
  assert one_slow.summary["sim_time_s"] > all_fast.summary["sim_time_s"]
  np.testing.assert_array_equal(one_slow.history["train_loss"],
                                all_fast.history["train_loss"])
  assert one_slow.summary["wire_bytes"] == all_fast.summary["wire_bytes"]
  from lowbw import cli
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "3",
          "--steps", "4", "--H", "2", "--bandwidth", "1Gbps,100Mbps",
          "--out", str(tmp_path / "r")]
  assert cli.main(argv) == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      "lowbw: error: --bandwidth='1Gbps,100Mbps' is invalid: expected 3 "
      "values, one per worker, or one for every worker (2 given)")


def test_a_delayed_outer_step_hides_the_sync_behind_the_next_round(
    tmp_path, capsys):
  """outer_delay=1 applies each round's mean one round late, so its sync's
  communication overlaps the next round's H steps: the clock is the one
  plain DiLoCo would have with overlap=True (which moves only the clock),
  faster than without; the training is the delayed one (it differs), and
  the bytes are the same. The command line takes --outer-delay."""
  base = dict(data="digits", hidden="8", workers=4, batch_size=4, steps=16,
              H=4, eval_examples=32, latency="10ms", bandwidth="10Mbps",
              hardware="0.01s", network_profile="ideal")
  delayed = lowbw.simulate(lowbw.Config(**base, outer_delay=1))
  overlapped = lowbw.simulate(lowbw.Config(**base, overlap=True))
  plain = lowbw.simulate(lowbw.Config(**base))
  np.testing.assert_allclose(delayed.history["sim_time_s"],
                             overlapped.history["sim_time_s"], rtol=1e-7)
  assert delayed.summary["sim_time_s"] < 0.8 * plain.summary["sim_time_s"]
  np.testing.assert_array_equal(overlapped.history["train_loss"],
                                plain.history["train_loss"])
  assert not np.array_equal(delayed.history["train_loss"],
                            plain.history["train_loss"])
  assert delayed.summary["wire_bytes"] == plain.summary["wire_bytes"]
  from lowbw import cli
  assert cli.main(["train", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--steps", "8", "--H", "2", "--outer-delay", "1",
                   "--no-plot", "--no-progress", "--out",
                   str(tmp_path / "r")]) == 0
  config = lowbw.Config.load(str(tmp_path / "r" / "config.yaml"))
  assert config.outer_delay == 1


def test_eager_updates_run_with_a_codec_faults_and_bf16_workers(tmp_path):
  """The eager variant is the delayed one's clock and bytes, and trains end
  to end with a codec and error feedback, under faults and with bfloat16
  workers (finite losses below the untrained model's)."""
  base = dict(data="digits", hidden="8", workers=4, batch_size=4, steps=12,
              H=3, eval_examples=32, latency="10ms", bandwidth="10Mbps",
              hardware="0.01s", outer_delay=1)
  eager = lowbw.simulate(lowbw.Config(**base, eager=True))
  delayed = lowbw.simulate(lowbw.Config(**base))
  np.testing.assert_allclose(eager.history["sim_time_s"],
                             delayed.history["sim_time_s"], rtol=1e-7)
  assert eager.summary["wire_bytes"] == delayed.summary["wire_bytes"]
  assert not np.array_equal(eager.history["train_loss"],
                            delayed.history["train_loss"])
  # All three at once: a codec with error feedback, faults, bf16 workers.
  r = lowbw.simulate(lowbw.Config(**base, eager=True, codec="quant:4", ef=0.7,
                                  drop_prob=0.3, worker_dtype="bfloat16"))
  assert np.isfinite(r.summary["final_eval_loss"])
  assert r.summary["final_eval_loss"] < np.log(10)  # uniform over digits
