"""Partial parameter updates against a per-worker Python reference (owner-
masked inner steps, a per-coordinate mean over owners, DiLoCo's Nesterov
step), its limit (every worker owning everything) against DiLoCo, its frozen
tensors, its bytes per slice, faults, the CLI and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import strategies
from lowbw.strategies import _partial_updates
from lowbw.transforms import call_participating

import toy_workers

W = 3


def _params():
  k = jax.random.split(jax.random.key(3), 5)
  return {"a": jax.random.normal(k[0], (4,)),
          "b": jax.random.normal(k[1], (2, 3)),
          "c": {"w": jax.random.normal(k[2], (3, 2)),
                "v": jax.random.normal(k[3], (5,))},
          "d": jax.random.normal(k[4], (2,))}


def _inner():
  return optax.adamw(0.05, weight_decay=0.1)


def _outer():
  return optax.sgd(0.7, momentum=0.9, nesterov=True)


def reference(params, targets, owners, H, rounds):
  """The rule as a loop over workers, rounds and tensors, in numpy where
  the syncer averages (float64) and with optax's own steps per worker."""
  leaves, treedef = jax.tree.flatten(params)
  n = len(leaves)
  own = [[(w - i) % W < min(owners, W) for i in range(n)] for w in range(W)]
  inner, outer = _inner(), _outer()
  glob = params
  opt = [inner.init(params) for _ in range(W)]
  outer_state = outer.init(params)
  for _ in range(rounds):
    deltas = []
    for w in range(W):
      p = glob
      for _ in range(H):
        g = jax.grad(toy_workers.loss)(p, targets[w])
        g = jax.tree.unflatten(treedef, [x if own[w][i] else x * 0 for i, x
                                         in enumerate(jax.tree.leaves(g))])
        upd, opt[w] = inner.update(g, opt[w], p)
        upd = jax.tree.unflatten(treedef, [
            x if own[w][i] else x * 0
            for i, x in enumerate(jax.tree.leaves(upd))])
        p = optax.apply_updates(p, upd)
      deltas.append([np.asarray(a, np.float64) - np.asarray(b, np.float64)
                     for a, b in zip(jax.tree.leaves(glob),
                                     jax.tree.leaves(p))])
    mean = []
    for i in range(n):
      mine = [deltas[w][i] for w in range(W) if own[w][i]]
      mean.append(jnp.asarray(sum(mine) / len(mine), jnp.float32))
    upd, outer_state = outer.update(jax.tree.unflatten(treedef, mean),
                                    outer_state, glob)
    glob = optax.apply_updates(glob, upd)
  return glob


def _close(a, b, **kw):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


@pytest.mark.parametrize("owners", [1, 2])
def test_two_rounds_match_the_per_worker_reference(owners):
  params = _params()
  H, rounds = 3, 2
  strategy = strategies.partial_updates(_inner(), _outer(), H=H, owners=owners)
  targets = toy_workers.targets(params, W)
  state, _ = toy_workers.run(strategy, params, targets, H * rounds)
  want = reference(params, targets, owners, H, rounds)
  _close(state.comm.global_params, want, rtol=2e-5, atol=2e-6)


def test_frozen_tensors_are_bit_unchanged_within_a_round():
  params = _params()
  strategy = strategies.partial_updates(_inner(), H=10, owners=1)
  state, _ = toy_workers.run(strategy, params, toy_workers.targets(params, W),
                             4)
  table = _partial_updates.owners_of(len(jax.tree.leaves(params)), W, 1)
  for i, (x0, x_W) in enumerate(zip(jax.tree.leaves(params),
                                    jax.tree.leaves(state.params_W))):
    for w in range(W):
      same = np.array_equal(np.asarray(x_W[w]), np.asarray(x0))
      assert same != table[w, i], (i, w)


@pytest.mark.parametrize("codec,ef", [(None, None), ("quant:4", 0.5)])
def test_every_worker_owning_everything_is_diloco(codec, ef):
  """The same update in real arithmetic; summed in another order (the
  owners' masked sum over their count against DiLoCo's mean), so equal to
  float32 rounding, not bit for bit."""
  params = _params()
  targets = toy_workers.targets(params, W)
  part = strategies.partial_updates(_inner(), _outer(), H=3, owners=W, codec=codec,
                            error_feedback=ef)
  dil = strategies.diloco(_inner(), _outer(), H=3, codec=codec,
                          error_feedback=ef)
  a, _ = toy_workers.run(part, params, targets, 9)
  b, _ = toy_workers.run(dil, params, targets, 9)
  _close(a.comm.global_params, b.comm.global_params, rtol=1e-5, atol=1e-6)
  _close(a.params_W, b.params_W, rtol=1e-5, atol=1e-6)
  assert part.channels(params, W) == dil.channels(params, W)


def test_assignment_is_round_robin_with_owners_per_tensor():
  table = _partial_updates.owners_of(5, 3, 2)
  assert table.astype(int).tolist() == [[1, 0, 1, 1, 0],
                                        [1, 1, 0, 1, 1],
                                        [0, 1, 1, 0, 1]]
  assert table.sum(0).tolist() == [2] * 5
  assert _partial_updates.owners_of(4, 2, 7).all()  # owners >= W: everything


@pytest.mark.parametrize("owners", [1, 2])
def test_bytes_are_each_slice_exactly(owners):
  params = _params()
  leaves = jax.tree.leaves(params)
  table = _partial_updates.owners_of(len(leaves), W, owners)
  want = [sum(4 * x.size for i, x in enumerate(leaves) if table[w, i])
          for w in range(W)]
  assert _partial_updates.slice_bytes(params, W, owners) == want
  ch = strategies.partial_updates(H=2, owners=owners).channels(params, W)
  c = ch["pseudo_gradients"]
  assert c.payload_bytes == max(want)
  assert c.collective == "all_gather" and c.wire_bytes == (W - 1) * max(want)
  # a codec's payload per tensor: 4-bit values plus its per-tensor scales
  q = _partial_updates.slice_bytes(params, W, owners, "quant:4")
  codec = lowbw.transforms.parse_codec("quant:4")
  per = [lowbw.transforms.payload_nbytes(codec, [x]) for x in leaves]
  assert q == [sum(p for i, p in enumerate(per) if table[w, i])
               for w in range(W)]


def test_a_dropped_owner_leaves_the_others_mean():
  """Worker 0 misses the sync: each tensor's mean is over its other owners;
  a tensor only worker 0 owns gets a zero pseudo-gradient."""
  params = _params()
  H = 2
  outer = optax.sgd(1.0)
  strategy = strategies.partial_updates(_inner(), outer, H=H, owners=2)
  targets = toy_workers.targets(params, W)
  state = strategy.init(params, W, jax.random.PRNGKey(0))
  t_W = jax.tree.map(lambda *t: jnp.stack(t), *targets)
  for _ in range(H - 1):
    state, _ = strategy.local(state, jax.vmap(jax.grad(toy_workers.loss))(
        state.params_W, t_W))
  state, _ = strategy.local(state, jax.vmap(jax.grad(toy_workers.loss))(
      state.params_W, t_W))
  before = state
  active = jnp.array([False, True, True])
  after, _ = call_participating(active, strategy.sync, state)
  leaves = jax.tree.leaves(params)
  table = _partial_updates.owners_of(len(leaves), W, 2)
  for i, (g, x_W) in enumerate(zip(jax.tree.leaves(after.comm.global_params),
                                   jax.tree.leaves(before.params_W))):
    live = [w for w in (1, 2) if table[w, i]]
    # the mean of the live owners' parameters (outer SGD lr 1: FedAvg)
    want = np.mean([np.asarray(x_W[w]) for w in live], axis=0)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-6, atol=1e-6)


def test_config_runs_and_counts_the_largest_slice():
  cfg = lowbw.Config(strategy="partial_updates", data="digits", hidden="8",
                     workers=2, steps=8, H=4, batch_size=8, eval_examples=32,
                     progress=False, owners=1, devices=1)
  run = lowbw.simulate(cfg)
  assert np.isfinite(run.history["train_loss"]).all()
  assert "owners" in str(run.config)
  sizes = _partial_updates.slice_bytes(run.params, 2, 1)
  assert sum(sizes) == 4 * sum(x.size for x in jax.tree.leaves(run.params))
  # two syncs, each the largest slice, (W - 1) = 1 times on the wire
  assert run.summary["payload_bytes"] == 2 * max(sizes)
  assert run.summary["wire_bytes"] == 2 * max(sizes)


@pytest.mark.parametrize("kw,field", [
    (dict(owners=0), "owners"), (dict(owners=1.5), "owners"),
    (dict(H=0), "H"), (dict(error_feedback=0.5), "error_feedback")])
def test_bad_settings_name_their_field(kw, field):
  with pytest.raises(ValueError, match=field):
    strategies.partial_updates(**kw)
