"""GASLoC against its update written over a Python list of workers; its
limits (NoLoCo without momentum, DiLoCo on the complete graph); its bytes.
Over four devices against one: tests/scale_cases.py."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import cli, network, strategies
from lowbw.transforms import call_participating
from toy_regression import loss_fn, problem

W, STEPS, H = 6, 6, 3          # two rounds
LR, ALPHA, BETA = 0.1, 0.7, 0.5


def round_peers(graph, key, step, workers=W):
  """The graph is part of the spec: the round's peers of every worker, from
  a permutation of the shared key (one_peer: consecutive entries paired, as
  NoLoCo's; two_peer: neighbours in the permutation read as a cycle)."""
  def perm(salt):
    k = jax.random.fold_in(jax.random.fold_in(key, salt), step // H)
    return np.asarray(jax.random.permutation(k, workers)).tolist()
  peers = {}
  if graph == "one_peer":
    p = perm(0x9A1F)
    for g in range(0, workers, 2):
      peers[p[g]], peers[p[g + 1]] = [p[g + 1]], [p[g]]
  elif graph == "two_peer":
    p = perm(0x6C7C)
    for n, i in enumerate(p):
      peers[i] = [p[n - 1], p[(n + 1) % workers]]
  elif graph == "ring":
    peers = {i: [(i - 1) % workers, (i + 1) % workers]
             for i in range(workers)}
  else:
    peers = {i: [j for j in range(workers) if j != i] for i in range(workers)}
  return peers


def reference(graph, rate, accel, params, batches, key, active=None):
  """Per worker i: heavy-ball outer momentum on phi_i - theta_i, proposal
  y_i = phi_i + m_i, then phi_i = y_i + rate sum_peers (y_j - y_i)
  + accel (y_i - y_i'); a worker that sits out (``active``) keeps all."""
  theta = [jax.tree.map(np.asarray, params) for _ in range(W)]
  phi = [dict(t) for t in theta]
  prev = [dict(t) for t in theta]
  m = [jax.tree.map(np.zeros_like, theta[0]) for _ in range(W)]
  up = [True] * W if active is None else list(active)
  for t in range(1, STEPS + 1):
    for w in range(W):
      g = jax.grad(loss_fn)(jax.tree.map(jnp.asarray, theta[w]),
                            {k: v[t - 1, w] for k, v in batches.items()})
      theta[w] = {k: theta[w][k] - LR * np.asarray(g[k]) for k in g}
    if t % H:
      continue
    y = [dict(p) for p in phi]
    for w in range(W):
      if up[w]:
        for k in m[w]:
          m[w][k] = BETA * m[w][k] - ALPHA * (phi[w][k] - theta[w][k])
          y[w][k] = phi[w][k] + m[w][k]
    peers = round_peers(graph, key, t)
    for w in range(W):
      if not up[w]:
        continue
      for k in phi[w]:
        phi[w][k] = y[w][k] + rate * sum(
            (y[j][k] - y[w][k] for j in peers[w] if up[j]),
            np.zeros_like(y[w][k])) + accel * (y[w][k] - prev[w][k])
        prev[w][k] = y[w][k]
    theta = [dict(p) if up[w] else theta[w] for w, p in enumerate(phi)]
  return theta


def run(strategy, params, batches, key, active=None):
  state = strategy.init(params, W, key)
  mask = None if active is None else jnp.asarray(active)
  step = jax.jit(lambda s, g, m: call_participating(m, strategy.step, s, g))
  grads = jax.jit(jax.vmap(jax.grad(loss_fn)))
  for t in range(STEPS):
    batch = jax.tree.map(lambda b: b[t], batches)
    state, _ = step(state, grads(state.params_W, batch), mask)
  return state


@pytest.mark.parametrize("graph, gossip, accel, active", [
    ("one_peer", None, 0.0, None),
    ("two_peer", None, 0.3, None),
    ("ring", 0.25, 0.0, None),
    ("complete", None, 0.2, None),
    ("two_peer", 0.4, 0.3, [True, False, True, True, False, True]),
])
def test_gasloc_matches_the_per_worker_gossip_reference(graph, gossip, accel,
                                                        active):
  params, batches = problem(STEPS, W)
  key = jax.random.key(7)
  strategy = strategies.gasloc(optax.sgd(LR), optax.sgd(ALPHA, momentum=BETA),
                               H=H, graph=graph, gossip=gossip, accel=accel)
  state = run(strategy, params, batches, key, active)
  k = {"one_peer": 1, "complete": W - 1}.get(graph, 2)
  want = reference(graph, 1 / (k + 1) if gossip is None else gossip, accel,
                   params, batches, key, active)
  for w in range(W):
    for name in want[w]:
      np.testing.assert_allclose(state.params_W[name][w], want[w][name],
                                 rtol=1e-5, atol=2e-6)
  if graph != "complete":  # a sparse graph leaves the workers apart
    assert float(jnp.std(state.comm.outer_params_W["w"], axis=0).max()) > 1e-3


@pytest.mark.parametrize("graph", ["one_peer", "two_peer"])
def test_random_graphs_are_symmetric_and_fresh_every_round(graph):
  key = jax.random.key(0)
  rounds = [round_peers(graph, key, r * H, 8) for r in range(1, 6)]
  for peers in rounds:
    for i, mine in peers.items():
      assert i not in mine and len(set(mine)) == len(mine)
      assert all(i in peers[j] for j in mine)
  assert len({str(sorted(p.items())) for p in rounds}) > 1
  got = strategies._gossip.peers(graph, key, 3 * H, H, 8)
  assert [sorted(r) for r in np.asarray(got).tolist()] == [
      sorted(rounds[2][i]) for i in range(8)]


def test_one_peer_without_momentum_is_noloco_with_the_pull_one_over_lr():
  """NoLoCo (momentum 0, pull = 1/lr) steps phi_i to mean(phi) + lr
  (mean(theta) - mean(phi)) over its pair; GASLoC on the same matching
  (the same key and salt) averages phi_j + lr (theta_j - phi_j) over it:
  the same value, written as different float operations, so equal to
  rounding (measured: 2.4e-7 on values up to 2.3), not bit for bit."""
  params, batches = problem(STEPS, W)
  key = jax.random.key(3)
  a = run(strategies.noloco(optax.sgd(LR), optax.sgd(ALPHA), H=H,
                            pull=1 / ALPHA), params, batches, key)
  b = run(strategies.gasloc(optax.sgd(LR), optax.sgd(ALPHA), H=H),
          params, batches, key)
  for x, y in zip(jax.tree.leaves(a.params_W), jax.tree.leaves(b.params_W)):
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
  assert float(jnp.std(b.params_W["w"], axis=0).max()) > 1e-3


def test_complete_graph_is_diloco():
  """Complete graph, gossip 1/W: every worker's new outer model is the mean
  of the proposals phi - nesterov_i; the outer optimizer is linear, so the
  mean of the per-worker Nesterov steps is DiLoCo's step on the mean
  pseudo-gradient. Equal to rounding (sums in another order)."""
  params, batches = problem(STEPS, W)
  key = jax.random.key(1)
  outer = optax.sgd(ALPHA, momentum=0.9, nesterov=True)
  a = run(strategies.diloco(optax.sgd(LR), outer, H=H), params, batches, key)
  b = run(strategies.gasloc(optax.sgd(LR), outer, H=H, graph="complete"),
          params, batches, key)
  for x, y in zip(jax.tree.leaves(a.params_W), jax.tree.leaves(b.params_W)):
    np.testing.assert_allclose(x, y, rtol=0, atol=2e-6)
  moved = max(float(jnp.max(jnp.abs(x - y[None]))) for x, y in zip(
      jax.tree.leaves(b.params_W), jax.tree.leaves(params)))
  assert moved > 1e-2


@pytest.mark.parametrize("graph, k", [("one_peer", 1), ("two_peer", 2),
                                      ("ring", 2), ("complete", 7)])
def test_gasloc_sends_its_proposal_to_each_peer(graph, k):
  """K copies of B per worker and round, leaving its link together: one
  hop of K B."""
  params = {"w": jnp.zeros((64, 32)), "b": jnp.zeros((32,))}
  B = 4 * (64 * 32 + 32)
  s = strategies.gasloc(optax.sgd(0.1), H=1, graph=graph)
  (c,) = s.channels(params, 8).values()
  assert (c.collective, c.payload_bytes, c.wire_bytes) == (
      "pairwise", k * B, k * B)
  flat = network.network("100Mbps", "20ms").topology
  assert flat.cost(c, 8).seconds == pytest.approx(0.02 + 8 * k * B / 1e8)
  state = s.init(params, 8, jax.random.key(0))
  _, report = s.step(state, jax.tree.map(jnp.zeros_like, state.params_W))
  assert int(report["gossip"]) == 1


# digits, one hidden layer of 32: (64, 32), (32,), (32, 10), (10,)
P = sum(math.prod(s) for s in [(64, 32), (32,), (32, 10), (10,)])


def test_gasloc_trains_from_the_cli_and_logs_two_copies_per_round(tmp_path):
  out = tmp_path / "run"
  assert cli.main(["train", "--strategy", "gasloc", "--data", "digits",
                   "--hidden", "32", "--workers", "4", "--batch-size", "8",
                   "--steps", "24", "--eval-every", "12", "--no-progress",
                   "--out", str(out), "--H", "6", "--graph", "two_peer",
                   "--accel", "0.2"]) == 0
  rows = (out / "metrics.csv").read_text().splitlines()
  header = rows[0].split(",")
  last = dict(zip(header, rows[-1].split(",")))
  first = dict(zip(header, rows[1].split(",")))
  assert int(last["payload_bytes"]) == 24 // 6 * 2 * 4 * P
  loss = float(last["eval_loss"])
  assert np.isfinite(loss) and loss < float(first["train_loss"])
  config = json.loads((out / "config.json").read_text())
  assert config["strategy"]["name"] == "gasloc"
  assert config["strategy"]["graph"] == "two_peer"


def test_defaults():
  s = strategies.gasloc()
  assert (s.period, s.config["graph"], s.config["gossip"],
          s.config["accel"]) == (50, "one_peer", None, 0.0)
  outer = s.config["outer"]["hyperparams"]
  assert (outer["learning_rate"], outer["momentum"]) == (0.7, 0.9)


@pytest.mark.parametrize("call, field, words", [
    (lambda: strategies.gasloc(graph="star"), "graph", "one_peer"),
    (lambda: strategies.gasloc(graph="two_peer", gossip=0.6), "gossip",
     "1/K = 0.5"),
    (lambda: strategies.gasloc(gossip=-1.0), "gossip", ""),
    (lambda: strategies.gasloc(accel=-0.1), "accel", ""),
    (lambda: strategies.gasloc(H=0), "H", ""),
    (lambda: strategies.gasloc().init({"w": jnp.zeros(2)}, 3,
                                      jax.random.key(0)), "workers", "even"),
    (lambda: strategies.gasloc(graph="ring").init(
        {"w": jnp.zeros(2)}, 2, jax.random.key(0)), "workers", ">= 3"),
    (lambda: strategies.gasloc(graph="complete", gossip=0.5).init(
        {"w": jnp.zeros(2)}, 4, jax.random.key(0)), "gossip", "K = 3"),
])
def test_bad_gasloc_settings_name_the_field(call, field, words):
  with pytest.raises(ValueError, match=field) as e:
    call()
  assert words in str(e.value)


