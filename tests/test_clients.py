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
  draw = jax.jit(jax.vmap(lambda r: data.round_clients(
      key, r, M, jnp.arange(K))))
  draws = np.asarray(draw(jnp.arange(40)))
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
  with pytest.raises(ValueError, match=r"clients=50 is invalid: 'source' "
                     "sharding cannot split 'digits' over 50 clients"):
    data.client_shards(data.digits(sharding="source"), 50, 8, seed=0)
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
  whole = data.WorkerSampler(sampler.arrays, sampler.shard_idx_M,
                             sampler.shard_len_M, 5, "classification",
                             None, sampler.max_shard)
  draw = jax.jit(lambda s, t: (s.clients_at(key, t), s.sample(key, t)))
  every = jax.jit(lambda s, t: s.sample(key, t))
  for step in (0, 3, 4, 9):
    client_W, batch_W = draw(sampler, step)
    client_W = np.asarray(client_W)
    np.testing.assert_array_equal(client_W, data.round_clients(
        key, step // 4, 10, jnp.arange(3)))
    got = np.asarray(batch_W["x"])[..., 0].astype(int)
    whole_x = np.asarray(every(whole, step)["x"])
    for w, c in enumerate(client_W):
      assert set(got[w]) <= set(idx[c])
      # Client c's stream: the batch it would draw as worker c of M.
      np.testing.assert_array_equal(got[w], whole_x[c, :, 0].astype(int))


# -------------------------------------------------- the engine, against a loop
def _start(config):
  """The run's initial global parameters, data key and model."""
  sim = lowbw.build(config)
  state = sim.initial(config.seed)[0]
  params = jax.tree.map(lambda x: np.asarray(x[0]), state.strategy.params_W)
  return sim, params, state.data_key


def _client_round(loss, inner):
  """One client's H inner steps from ``params`` on its whole shard, with a
  fresh optimizer state (compiled once, run for every client)."""
  def run(params, x, y):
    batch = {"x": x, "y": y}
    grad = jax.grad(lambda p: loss(p, batch, jax.random.PRNGKey(0))[0])
    opt = inner.init(params)
    for _ in range(H):
      updates, opt = inner.update(grad(params), opt, params)
      params = optax.apply_updates(params, updates)
    return params
  return jax.jit(run)


def _shards(seed):
  """Every client's examples (the iid split of N over M), on device."""
  xs = jnp.asarray(DIGITS.train["x"], jnp.float32)
  ys = jnp.asarray(DIGITS.train["y"], jnp.int32)
  return [(xs[s], ys[s]) for s in _sharding.shard_indices("iid", N, M, seed)]


def _outer_step(outer, params, outer_state, trained):
  pseudo = jax.tree.map(lambda g, *w: g - np.mean(w, axis=0), params,
                        *trained)
  updates, outer_state = outer.update(pseudo, outer_state, params)
  return optax.apply_updates(params, updates), outer_state


def _uniform(data_key, r):
  return np.asarray(data.round_clients(data_key, r, M, jnp.arange(K)))


def _reference(sim, params, data_key, inner, outer, seed, draw=_uniform):
  """Rounds of: draw K of M clients, run each from the global model on its
  own shard, average, outer step on the mean pseudo-gradient."""
  client_round = _client_round(sim.config.model.loss, inner)
  shards = _shards(seed)
  outer_state = outer.init(params)
  for r in range(ROUNDS):
    trained = [client_round(params, *shards[c]) for c in draw(data_key, r)]
    params, outer_state = _outer_step(outer, params, outer_state, trained)
  return params


def _assert_close(got, want):
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4,
                               atol=2e-5)


def test_fedavg_over_sampled_clients_matches_a_loop_over_rounds():
  config = _config("fedavg", inner="sgd", inner_lr=0.3, bandwidth="1Gbps")
  sim, params, data_key = _start(config)
  result = sim.run(seed=config.seed)
  want = _reference(sim, params, data_key, optax.sgd(0.3), optax.sgd(1.0),
                    config.seed)
  _assert_close(result.params, want)
  # A traced learning rate survives the clients' fresh optimizer states.
  tuned = sim.run(seed=config.seed, hparams={"inner_lr": 0.1})
  _assert_close(tuned.params, _reference(
      sim, params, data_key, optax.sgd(0.1), optax.sgd(1.0), config.seed))
  _check_bytes_and_seeds(sim, result)


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
  inner = optax.adamw(0.01, weight_decay=0.1)
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)

  @jax.jit
  def slot_round(params, opt, x, y):
    grad = jax.grad(lambda p: loss(p, {"x": x, "y": y},
                                   jax.random.PRNGKey(0))[0])
    for _ in range(H):
      updates, opt = inner.update(grad(params), opt, params)
      params = optax.apply_updates(params, updates)
    return params, opt

  shards = _shards(seed)
  opts, outer_state = [inner.init(params)] * K, outer.init(params)
  for r in range(ROUNDS):
    clients = np.asarray(data.round_clients(data_key, r, M, jnp.arange(K)))
    trained = []
    for w, c in enumerate(clients):
      p, opts[w] = slot_round(params, opts[w], *shards[c])
      trained.append(p)
    params, outer_state = _outer_step(outer, params, outer_state, trained)
  return params


def _check_bytes_and_seeds(sim, first):
  """Bytes and the clock count the K sampled clients only; the same seed
  repeats bit for bit, another draws other clients."""
  again = sim.run(seed=3)
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


# ------------------------------------------------------------ availability
def _trace(tmp_path, table=None):
  """Clients 0-11 available in even rounds, 8-19 in odd ones."""
  if table is None:
    table = np.zeros((M, 2), int)
    table[:12, 0] = table[8:, 1] = 1
  path = tmp_path / "availability.csv"
  np.savetxt(path, table, fmt="%d", delimiter=",")
  return str(path), np.asarray(table, bool)


def _first_available(table, data_key, r):
  """The documented rule, plainly: the round's bijection of all M clients,
  in order, keeping the first K available in column r mod P."""
  order = np.asarray(data.round_clients(data_key, r, M, jnp.arange(M)))
  return [c for c in order if table[c, r % table.shape[1]]][:K]


def test_an_availability_trace_draws_the_first_available_clients(tmp_path):
  _, table = _trace(tmp_path)
  key = jax.random.PRNGKey(4)
  draw = jax.jit(lambda r: data.available_clients(key, r, M, table, K))
  for r in range(12):
    got = np.asarray(draw(r))
    assert list(got) == _first_available(table, key, r)
    assert table[got, r % 2].all() and len(set(got)) == K
  # Every client available: the uniform draw.
  every = np.ones((M, 3), bool)
  np.testing.assert_array_equal(
      data.available_clients(key, 5, M, every, K),
      data.round_clients(key, 5, M, jnp.arange(K)))


def test_fedavg_over_available_clients_matches_a_loop(tmp_path):
  path, table = _trace(tmp_path)
  config = _config("fedavg", inner="sgd", inner_lr=0.3, availability=path)
  sim, params, data_key = _start(config)
  result = sim.run(seed=config.seed)
  want = _reference(sim, params, data_key, optax.sgd(0.3), optax.sgd(1.0),
                    config.seed, draw=lambda key, r: _first_available(
                        table, key, r))
  _assert_close(result.params, want)


@pytest.mark.parametrize("table, message", [
    (np.ones((M - 1, 2)), "has 19 rows; expected one per client, clients=20"),
    (np.full((M, 2), 2), "holds values other than 0 and 1"),
    (np.eye(M, 2), "column 0 makes 1 clients available, fewer than "
     "workers=4"),
])
def test_a_bad_availability_trace_is_refused_naming_it(tmp_path, table,
                                                       message):
  path, _ = _trace(tmp_path, table)
  with pytest.raises(ValueError, match="availability=.* is invalid: " +
                     message):
    _config("fedavg", availability=path)


def test_availability_needs_clients_and_a_file(tmp_path):
  path, _ = _trace(tmp_path)
  with pytest.raises(ValueError, match="availability=.* is invalid: needs "
                     "clients=M"):
    _config("fedavg", availability=path, clients=None)
  with pytest.raises(ValueError, match="availability=.* is invalid: no such "
                     "file"):
    _config("fedavg", availability=str(tmp_path / "none.csv"))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("over, message", [
    (dict(clients=3), "clients=3 is invalid: must be at least workers=4"),
    (dict(clients=0), "clients=0 is invalid"),
    (dict(strategy="streaming_diloco", H=4, steps=8, eval_every=8),
     "clients=20 is invalid: samples "
     "clients for strategies fedavg, diloco, fedadam .*'streaming_diloco' "
     "is not one of them"),
    (dict(strategy="ddp", H=None, eval_every=None),
     "strategy 'ddp' is not one of them"),
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
