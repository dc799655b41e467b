"""Client populations (``clients=M``): M clients own the data and W of them,
drawn afresh each round, train from the global model (FedAvg, McMahan et al.
2017, arXiv 1602.05629).

The engine is checked against a plain Python loop over rounds: draw the
round's clients by the documented rule, run each drawn client's H inner steps
on its own shard from the global model with a fresh optimizer, average, apply
the outer step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import data
from lowbw.data import _sharding

M, K, H, ROUNDS = 20, 4, 3, 3
DIGITS = data.digits()
N = DIGITS.num_examples()
SHARD = N // M  # "iid": every client holds N // M examples


def _config(strategy="fedavg", **over):
  base = dict(strategy=strategy, data="digits", model="mlp", hidden="16",
              workers=K, clients=M, H=H, steps=H * ROUNDS, batch_size=SHARD,
              seed=3, eval_every=H * ROUNDS)
  base.update(over)
  return lowbw.Config(**{k: v for k, v in base.items() if v is not None
                         or k == "clients"})


# -------------------------------------------------------- the draw of clients
def test_each_round_draws_distinct_clients_of_the_population():
  key = jax.random.PRNGKey(5)
  draws = np.stack([np.asarray(data.round_clients(key, r, M, jnp.arange(K)))
                    for r in range(40)])
  assert all(len(set(row)) == K for row in draws)
  assert draws.min() >= 0 and draws.max() < M
  assert len({tuple(row) for row in draws}) > 30  # rounds differ
  again = data.round_clients(key, 7, M, jnp.arange(K))
  np.testing.assert_array_equal(again, draws[7])  # same key, same clients


def test_every_client_is_drawn_about_equally_often():
  rounds = 3000
  draw = jax.jit(jax.vmap(lambda r: data.round_clients(
      jax.random.PRNGKey(1), r, M, jnp.arange(K))))
  counts = np.bincount(np.asarray(draw(jnp.arange(rounds))).ravel(),
                       minlength=M)
  expected = rounds * K / M  # 600; binomial sd ~ 22
  assert np.all(np.abs(counts - expected) < 6 * np.sqrt(expected)), counts


# ------------------------------------------------------------- the shards
def test_clients_split_the_examples_as_workers_would():
  idx, n = data.client_shards(DIGITS, M, SHARD, seed=3)
  shards = _sharding.shard_indices("iid", N, M, 3)
  assert idx.shape == (M, SHARD) and (n == SHARD).all()
  for c in range(M):
    np.testing.assert_array_equal(idx[c], shards[c])


def test_more_clients_than_examples_share_them_by_the_documented_rule():
  clients, b = 100_000, 8
  idx, n = data.client_shards(DIGITS, clients, b, seed=0)
  order = np.random.default_rng(0).permutation(N)
  for c in (0, 1, 224, 225, 99_999):
    np.testing.assert_array_equal(idx[c], order[(c * b + np.arange(b)) % N])
  assert (n == b).all() and idx.nbytes == clients * b * 4
  contiguous = data.digits(sharding="contiguous")
  idx, _ = data.client_shards(contiguous, 1000, b, seed=0)
  np.testing.assert_array_equal(idx[300], (300 * b + np.arange(b)) % N)


def test_a_sharding_that_cannot_give_every_client_a_batch_is_refused():
  with pytest.raises(ValueError, match=r"clients=500 is invalid: 'dirichlet'"
                     r" sharding gives client \d+ \d+ examples, fewer than "
                     r"batch_size=8"):
    data.client_shards(data.digits(sharding="dirichlet"), 500, 8, seed=0)
  with pytest.raises(ValueError, match="batch_size=4000 is invalid"):
    data.client_shards(DIGITS, 10, 4000, seed=0)


def test_a_slot_draws_its_batches_from_its_clients_shard_in_its_stream():
  x = np.arange(200, dtype=np.float32)[:, None]  # each example its index
  source = data.arrays(x, np.zeros(200, np.int64))
  sampler = data.client_sampler(source, clients=10, num_workers=3,
                                batch_size=5, seed=0, period=4)
  # The example behind each index (``arrays`` holds some out for eval).
  idx = np.asarray(source.train["x"])[np.asarray(sampler.shard_idx_M), 0]
  key = jax.random.PRNGKey(2)
  for step in (0, 3, 4, 9):
    client_W = np.asarray(sampler.clients_at(key, step))
    np.testing.assert_array_equal(client_W, data.round_clients(
        key, step // 4, 10, jnp.arange(3)))
    got = np.asarray(sampler.sample(key, step)["x"])[..., 0].astype(int)
    whole = data.WorkerSampler(sampler.arrays, sampler.shard_idx_M,
                               sampler.shard_len_M, 5, "classification",
                               None, sampler.max_shard).sample(key, step)
    for w, c in enumerate(client_W):
      assert set(got[w]) <= set(idx[c])
      # Client c's stream: the batch it would draw as worker c of M.
      np.testing.assert_array_equal(got[w], np.asarray(
          whole["x"])[c, :, 0].astype(int))


# -------------------------------------------------- the engine, against a loop
def _start(config):
  """The run's initial global parameters, data key and model."""
  sim = lowbw.build(config)
  state = sim.initial(config.seed)[0]
  params = jax.tree.map(lambda x: np.asarray(x[0]), state.strategy.params_W)
  return sim, params, state.data_key


def _client_round(loss, params, batch, inner, steps):
  """One client's ``steps`` inner steps from ``params`` on its whole shard,
  with a fresh optimizer state."""
  grad = jax.jit(jax.grad(lambda p: loss(p, batch, jax.random.PRNGKey(0))[0]))
  opt = inner.init(params)
  for _ in range(steps):
    updates, opt = inner.update(grad(params), opt, params)
    params = optax.apply_updates(params, updates)
  return params


def _reference(sim, params, data_key, inner, outer, seed):
  """Rounds of: draw K of M clients, run each from the global model on its
  own shard, average, outer step on the mean pseudo-gradient."""
  loss = sim.config.model.loss
  shards = _sharding.shard_indices("iid", N, M, seed)
  xs, ys = np.asarray(DIGITS.train["x"], np.float32), DIGITS.train["y"]
  outer_state = outer.init(params)
  for r in range(ROUNDS):
    clients = np.asarray(data.round_clients(data_key, r, M, jnp.arange(K)))
    trained = []
    for c in clients:
      batch = {"x": jnp.asarray(xs[shards[c]]),
               "y": jnp.asarray(ys[shards[c]], jnp.int32)}
      trained.append(_client_round(loss, params, batch, inner, H))
    pseudo = jax.tree.map(lambda g, *w: g - np.mean(w, axis=0), params,
                          *trained)
    updates, outer_state = outer.update(pseudo, outer_state, params)
    params = optax.apply_updates(params, updates)
  return params


def _assert_close(got, want):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4,
                               atol=2e-5)


def test_fedavg_over_sampled_clients_matches_a_loop_over_rounds():
  config = _config("fedavg", inner="sgd", inner_lr=0.3)
  sim, params, data_key = _start(config)
  result = sim.run(seed=config.seed)
  want = _reference(sim, params, data_key, optax.sgd(0.3), optax.sgd(1.0),
                    config.seed)
  _assert_close(result.params, want)


def test_diloco_over_sampled_clients_matches_a_loop_with_fresh_adamw():
  config = _config("diloco", inner_lr=0.01)
  sim, params, data_key = _start(config)
  result = sim.run(seed=config.seed)
  inner = optax.adamw(0.01, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1)
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  want = _reference(sim, params, data_key, inner, outer, config.seed)
  _assert_close(result.params, want)
  # Round after round the same four slots hosted other clients: had the
  # slots kept their AdamW moments, the model would differ.
  kept = _kept_moments_reference(sim, params, data_key, config.seed)
  assert max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(result.params),
                             jax.tree.leaves(kept))) > 1e-4


def _kept_moments_reference(sim, params, data_key, seed):
  """DiLoCo whose slots keep their AdamW state across rounds (wrong for
  clients): what the fresh-state test must tell apart."""
  loss = sim.config.model.loss
  shards = _sharding.shard_indices("iid", N, M, seed)
  xs, ys = np.asarray(DIGITS.train["x"], np.float32), DIGITS.train["y"]
  inner = optax.adamw(0.01, weight_decay=0.1)
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  opts, outer_state = [inner.init(params) for _ in range(K)], outer.init(params)
  for r in range(ROUNDS):
    clients = np.asarray(data.round_clients(data_key, r, M, jnp.arange(K)))
    trained = []
    for w, c in enumerate(clients):
      batch = {"x": jnp.asarray(xs[shards[c]]),
               "y": jnp.asarray(ys[shards[c]], jnp.int32)}
      p = params
      grad = jax.grad(lambda q: loss(q, batch, jax.random.PRNGKey(0))[0])
      for _ in range(H):
        updates, opts[w] = inner.update(grad(p), opts[w], p)
        p = optax.apply_updates(p, updates)
      trained.append(p)
    pseudo = jax.tree.map(lambda g, *w: g - np.mean(w, axis=0), params,
                          *trained)
    updates, outer_state = outer.update(pseudo, outer_state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_bytes_count_the_sampled_clients_only_and_seeds_repeat():
  config = _config("fedavg", inner="sgd", inner_lr=0.3, bandwidth="1Gbps")
  sim = lowbw.build(config)
  first, again = sim.run(seed=3), sim.run(seed=3)
  for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  payload = sum(x.size * 4 for x in jax.tree.leaves(first.params))
  h = first.history
  assert h["payload_bytes"][-1] == ROUNDS * payload
  np.testing.assert_allclose(h["wire_bytes"][-1],
                             ROUNDS * 2 * (K - 1) / K * payload)
  # A plain run of K workers costs the same bytes and simulated time.
  plain = lowbw.simulate(_config("fedavg", inner="sgd", inner_lr=0.3,
                                 bandwidth="1Gbps", clients=None))
  assert plain.history["wire_bytes"][-1] == h["wire_bytes"][-1]
  np.testing.assert_allclose(plain.history["sim_time_s"][-1],
                             h["sim_time_s"][-1], rtol=1e-9)
  other = sim.run(seed=4)
  assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
             zip(jax.tree.leaves(first.params), jax.tree.leaves(other.params)))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("over, message", [
    (dict(clients=3), "clients=3 is invalid: must be at least workers=4"),
    (dict(clients=0), "clients=0 is invalid"),
    (dict(strategy="streaming_diloco", H=4, steps=8, eval_every=8),
     "clients=20 is invalid: samples "
     "clients for strategies fedavg, diloco, fedadam .*'streaming_diloco' "
     "is not one of them"),
    (dict(strategy="ddp", H=None, eval_every=None), "strategy 'ddp' is not one of them"),
    (dict(codec="int8", ef=0.5),
     "ef=0.5 is invalid: is state each worker keeps"),
    (dict(strategy="diloco", codec="lowrank:2"),
     "codec='lowrank:2' is invalid: is warm-started"),
    (dict(drop_prob=0.1), "faults='given' is invalid: with clients=20"),
    (dict(worker_batch=2), "worker_batch=2 is invalid: with clients=20"),
])
def test_bad_client_settings_are_refused_naming_the_field(over, message):
  with pytest.raises(ValueError, match=message):
    _config(**over)


def test_data_that_cannot_be_split_over_the_clients_is_refused_at_build():
  config = _config("fedavg", sharding="dirichlet", batch_size=8, clients=500)
  with pytest.raises(ValueError, match="clients=500 is invalid: 'dirichlet'"):
    lowbw.build(config)
