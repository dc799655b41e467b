"""NoLoCo against its update written over a Python list of workers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import network, strategies
from toy_regression import loss_fn, problem

W, STEPS, H = 4, 12, 3
ALPHA, BETA = 0.7, 0.5


def round_pairs(key, step):
  """The matching is part of the spec: a permutation from the shared key,
  fresh every round, consecutive entries paired."""
  perm = np.asarray(jax.random.permutation(
      jax.random.fold_in(jax.random.fold_in(key, 0x9A1F), step // H), W))
  return [perm[g:g + 2].tolist() for g in range(0, W, 2)]


@pytest.mark.parametrize("pull", [1.0, 0.5])
def test_noloco_matches_pairwise_heavy_ball_reference(pull):
  """Per pair G: dbar = mean(theta - phi), phibar = mean(phi); each member
  m <- beta m + alpha dbar + gamma (phibar - phi_i), gamma = pull alpha;
  phi_i <- phi_i + m; theta_i <- phi_i."""
  params, batches = problem(STEPS, W)
  inner, key = optax.sgd(0.1), jax.random.key(5)
  strategy = strategies.noloco(
      inner, optax.sgd(ALPHA, momentum=BETA), H=H, pull=pull)
  state = strategy.init(params, W, key)
  step = jax.jit(strategy.step)
  grads = jax.jit(jax.vmap(jax.grad(loss_fn)))
  theta = [jax.tree.map(np.asarray, params) for _ in range(W)]
  phi = [dict(t) for t in theta]
  m = [jax.tree.map(np.zeros_like, theta[0]) for _ in range(W)]
  for t in range(1, STEPS + 1):
    batch = jax.tree.map(lambda b: b[t - 1], batches)
    state, _ = step(state, grads(state.params_W, batch))
    for w in range(W):
      g = jax.grad(loss_fn)(jax.tree.map(jnp.asarray, theta[w]),
                            jax.tree.map(lambda b: b[w], batch))
      theta[w] = {k: theta[w][k] - 0.1 * np.asarray(g[k]) for k in g}
    if t % H:
      continue
    new_phi = list(phi)
    for pair in round_pairs(key, t):
      for k in phi[0]:
        dbar = sum(theta[j][k] - phi[j][k] for j in pair) / 2
        phibar = sum(phi[j][k] for j in pair) / 2
        for i in pair:
          m[i][k] = (BETA * m[i][k] + ALPHA * dbar +
                     pull * ALPHA * (phibar - phi[i][k]))
      for i in pair:
        new_phi[i] = {k: phi[i][k] + m[i][k] for k in phi[i]}
    phi = new_phi
    theta = [dict(p) for p in phi]
  for w in range(W):
    for k in theta[w]:
      np.testing.assert_allclose(state.params_W[k][w], theta[w][k], atol=2e-5)
  # the pairs differ: the workers are not all one model
  assert float(jnp.std(state.comm.outer_params_W["w"], axis=0).max()) > 1e-3


def test_pairs_are_a_fresh_matching_every_round():
  key = jax.random.key(0)
  rounds = [round_pairs(key, r * H) for r in range(1, 6)]
  for pairs in rounds:
    assert sorted(i for pair in pairs for i in pair) == list(range(W))
  assert len({str(p) for p in rounds}) > 1


def test_noloco_sends_one_hop_to_one_peer():
  params = {"w": jnp.zeros((64, 32)), "b": jnp.zeros((32,))}
  B = 4 * (64 * 32 + 32)
  (c,) = strategies.noloco().channels(params, 8).values()
  assert (c.collective, c.payload_bytes, c.wire_bytes) == ("pairwise", B, B)
  (two,) = strategies.noloco(pull=0.5).channels(params, 8).values()
  assert two.payload_bytes == 2 * B
  flat = network.network("100Mbps", "20ms").topology
  assert flat.cost(c, 8).seconds == pytest.approx(0.02 + 8 * B / 1e8)
  # a ring all-reduce of the same bytes over 8 workers: 14 hops of latency
  ring = network.channel("ring_allreduce", B, 8)
  assert flat.cost(ring, 8).seconds > 10 * flat.cost(c, 8).seconds


def test_noloco_defaults_are_the_authors():
  s = strategies.noloco()
  assert (s.period, s.config["pull"]) == (50, 1.0)
  outer = s.config["outer"]["hyperparams"]
  assert (outer["learning_rate"], outer["momentum"]) == (0.7, 0.5)


@pytest.mark.parametrize("call, field", [
    (lambda: strategies.noloco().init({"w": jnp.zeros(2)}, 3,
                                      jax.random.key(0)), "workers"),
    (lambda: strategies.noloco(pull=-1.0), "pull"),
    (lambda: strategies.noloco(H=0), "H"),
])
def test_bad_noloco_settings_name_the_field(call, field):
  with pytest.raises(ValueError, match=field):
    call()
