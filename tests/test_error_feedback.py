"""Error feedback (feedback_step, the optax transform) and a strategy's
compression pipeline (compression, transmit, comm_channel) against numpy and
per-worker Python-loop references written here."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw.transforms import (comm_channel, compression, error_feedback,
                              feedback_step, payload_nbytes, per_worker,
                              quantize, random_k, roundtrip, top_k, transmit)
from lowbw.transforms._compression import init_residual, message_bytes

W = 3


def _tree(seed, lead=(), leaves=2):
  """Two leaves by default; one where compiling a second costs time (random
  codecs) and trees are already covered."""
  rng = np.random.default_rng(seed)
  tree = {"w": jnp.asarray(rng.normal(size=lead + (4, 6)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=lead + (5,)), jnp.float32)}
  return tree if leaves == 2 else {"w": tree["w"]}


def _np(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _top_k_np(x, fraction):
  flat = x.reshape(-1)
  k = min(flat.size, max(1, round(fraction * flat.size)))
  keep = np.argsort(-np.abs(flat))[:k]
  out = np.zeros_like(flat)
  out[keep] = flat[keep]
  return out.reshape(x.shape)


def _ef_top_k_np(deltas, fraction, beta):
  """MuLoCo's error feedback with top-k, in numpy: (sent per step, residual)."""
  residual = jax.tree.map(np.zeros_like, deltas[0])
  sent = []
  for delta in deltas:
    acc = jax.tree.map(lambda e, d: beta * e + d, residual, delta)
    msg = jax.tree.map(lambda a: _top_k_np(a, fraction), acc)
    residual = jax.tree.map(np.subtract, acc, msg)
    sent.append(msg)
  return sent, residual


# --- feedback_step ------------------------------------------------------------


@pytest.mark.parametrize("codec", [
    top_k(0.1), random_k(0.2), top_k(0.3) | quantize(2, chunk=7)],
    ids=lambda c: c.name)
def test_beta_one_conserves_mass(codec):
  steps = 5
  deltas = [_tree(seed=t) for t in range(steps)]
  key = jax.random.key(0)
  step = jax.jit(lambda e, d, k: feedback_step(codec, 1.0, e, d, k))
  residual = jax.tree.map(jnp.zeros_like, deltas[0])
  total_sent = jax.tree.map(np.zeros_like, _np(deltas[0]))
  for t, delta in enumerate(deltas):
    sent, residual = step(residual, delta, jax.random.fold_in(key, t))
    total_sent = jax.tree.map(np.add, total_sent, _np(sent))
  total_in = jax.tree.map(lambda *d: np.sum(d, axis=0), *map(_np, deltas))
  kept = jax.tree.map(np.add, total_sent, _np(residual))
  chex.assert_trees_all_close(kept, total_in, atol=1e-5)
  # the codec is lossy, so something is still waiting in the residual
  assert max(np.abs(r).max() for r in jax.tree.leaves(_np(residual))) > 1e-3


def test_beta_zero_is_plain_compression():
  codec = quantize(2, stochastic=True)  # keys and worker pass through too
  residual, delta = _tree(1, leaves=1), _tree(2, leaves=1)  # residual ignored
  key = jax.random.key(5)

  def run(residual, delta):
    return (feedback_step(codec, 0.0, residual, delta, key, 1),
            roundtrip(codec, delta, key, 1))

  (sent, new_residual), plain = jax.jit(run)(residual, delta)
  chex.assert_trees_all_equal(sent, plain)
  chex.assert_trees_all_close(new_residual,
                              jax.tree.map(jnp.subtract, delta, plain))


def test_feedback_step_matches_numpy_top_k():
  deltas = [_tree(seed=10 + t) for t in range(4)]
  want_sent, want_residual = _ef_top_k_np(list(map(_np, deltas)), 0.2, 0.7)
  step = jax.jit(lambda e, d: feedback_step(top_k(0.2), 0.7, e, d))
  residual = jax.tree.map(jnp.zeros_like, deltas[0])
  for delta, want in zip(deltas, want_sent):
    sent, residual = step(residual, delta)
    chex.assert_trees_all_close(_np(sent), want, atol=1e-6)
  chex.assert_trees_all_close(_np(residual), want_residual, atol=1e-6)


# --- the optax transform ------------------------------------------------------


def test_error_feedback_in_an_optax_chain():
  params = _tree(seed=0)
  grads = [_tree(seed=20 + t) for t in range(3)]
  want_sent, want_residual = _ef_top_k_np(list(map(_np, grads)), 0.25, 0.5)
  tx = optax.chain(error_feedback(top_k(0.25), beta=0.5), optax.sgd(0.1))
  state = tx.init(params)
  update = jax.jit(tx.update)
  for g, want in zip(grads, want_sent):
    updates, state = update(g, state, params)
    chex.assert_trees_all_close(_np(updates),
                                jax.tree.map(lambda s: -0.1 * s, want),
                                atol=1e-6)
  chex.assert_trees_all_close(_np(state[0].residual), want_residual, atol=1e-6)
  assert int(state[0].count) == 3


def test_error_feedback_per_worker_keeps_per_worker_residuals():
  params_W = _tree(seed=0, lead=(W,))
  grads_W = [_tree(seed=30 + t, lead=(W,)) for t in range(3)]
  tx = per_worker(optax.chain(error_feedback(top_k(0.25), beta=0.9),
                              optax.sgd(1.0)))
  state_W = tx.init(params_W)
  update = jax.jit(tx.update)
  out_W = []
  for g_W in grads_W:
    updates_W, state_W = update(g_W, state_W, params_W)
    out_W.append(updates_W)
  ef_W = state_W[0]
  chex.assert_tree_shape_prefix(ef_W.residual, (W,))
  np.testing.assert_array_equal(ef_W.count, [3] * W)
  for w in range(W):  # each worker alone, in numpy
    mine = [jax.tree.map(lambda x: np.asarray(x[w], np.float64), g)
            for g in grads_W]
    want_sent, want_residual = _ef_top_k_np(mine, 0.25, 0.9)
    chex.assert_trees_all_close(
        jax.tree.map(lambda x: np.asarray(x[w]), ef_W.residual), want_residual,
        atol=1e-5)
    for t in range(3):
      chex.assert_trees_all_close(
          jax.tree.map(lambda x: np.asarray(x[w]), out_W[t]),
          jax.tree.map(np.negative, want_sent[t]), atol=1e-5)
  # workers saw different gradients, so their residuals differ
  assert not np.allclose(ef_W.residual["w"][0], ef_W.residual["w"][1])


def test_error_feedback_per_worker_noise_and_keys():
  codec = quantize(1, stochastic=True)
  key = jax.random.key(3)
  grads = _tree(seed=40, leaves=1)
  grads_W = jax.tree.map(lambda x: jnp.broadcast_to(x, (W,) + x.shape), grads)
  tx = per_worker(error_feedback(codec, beta=0.8, key=key))
  state_W = tx.init(grads_W)
  update = jax.jit(tx.update)
  one = jax.jit(lambda e, d, k, w: feedback_step(codec, 0.8, e, d, k, w))
  residuals = [jax.tree.map(jnp.zeros_like, grads) for _ in range(W)]
  for t in range(2):
    sent_W, state_W = update(grads_W, state_W)
    for w in range(W):  # update t uses fold_in(key, t); worker w its own noise
      sent, residuals[w] = one(residuals[w], grads, jax.random.fold_in(key, t),
                               w)
      chex.assert_trees_all_equal(jax.tree.map(lambda x: x[w], sent_W), sent)
      chex.assert_trees_all_equal(
          jax.tree.map(lambda x: x[w], state_W.residual), residuals[w])
  # identical inputs, private rounding noise: the residuals differ
  assert not np.array_equal(state_W.residual["w"][0],
                            state_W.residual["w"][1])


def test_error_feedback_default_key_for_random_codecs():
  tx = error_feedback(random_k(0.5), beta=1.0)
  grads = _tree(seed=50, leaves=1)
  state = tx.init(grads)

  def run(grads, state):
    sent, _ = tx.update(grads, state)
    # documented default: jax.random.key(0), folded with the update count
    key = jax.random.fold_in(jax.random.key(0), 0)
    return sent, roundtrip(random_k(0.5), grads, key)

  sent, want = jax.jit(run)(grads, state)
  chex.assert_trees_all_equal(sent, want)


@pytest.mark.parametrize("beta", [1.5, -0.1, True, "0.9", None,
                                  float("nan")])
def test_error_feedback_rejects_bad_beta(beta):
  with pytest.raises(ValueError, match="beta"):
    error_feedback(top_k(0.1), beta=beta)


def test_error_feedback_rejects_non_codecs():
  with pytest.raises(ValueError, match="codec"):
    error_feedback("topk:0.1")


# --- compression: validation, transmit, channel -------------------------------


def test_compression_validation():
  with pytest.raises(ValueError, match="error_feedback"):
    compression(None, 0.9)
  with pytest.raises(ValueError, match="error_feedback"):
    compression(top_k(0.1), 1.5)
  with pytest.raises(ValueError, match="error_feedback"):
    compression(top_k(0.1), True)
  with pytest.raises(ValueError, match="^codec='topk' is invalid"):
    compression("topk", None)
  with pytest.raises(ValueError, match="^codec=0.5 is invalid"):
    compression(0.5, None)
  assert compression("topk:0.1", None).codec.name == "topk:0.1"
  assert compression(None, None).config == {"codec": None,
                                            "error_feedback": None}
  assert compression(top_k(0.1), 0).config == {"codec": "topk:0.1",
                                               "error_feedback": 0.0}


def test_init_residual():
  tree_W = _tree(seed=0, lead=(W,))
  assert init_residual(compression(None, None), tree_W) == ()
  counts = init_residual(compression(top_k(0.1), None), tree_W)
  chex.assert_trees_all_equal(counts.count, jnp.zeros((W,), jnp.int32))
  state = init_residual(compression(top_k(0.1), 0.5), tree_W)
  chex.assert_trees_all_equal(state.residual,
                              jax.tree.map(jnp.zeros_like, tree_W))
  chex.assert_trees_all_equal(state.beta, jnp.full((W,), 0.5))


TRANSMIT = [(top_k(0.25), None), (top_k(0.25), 0.9), (random_k(0.3), 0.5),
            (quantize(2, stochastic=True), 1.0),
            (top_k(0.5) | quantize(4), 0.9)]


@pytest.mark.parametrize("codec,beta", TRANSMIT,
                         ids=[f"{c.name}-{b}" for c, b in TRANSMIT])
def test_transmit_matches_a_loop_over_workers(codec, beta):
  comp = compression(codec, beta)
  leaves = 1 if codec.needs_key else 2
  x_W = _tree(seed=1, lead=(W,), leaves=leaves)
  state_W = init_residual(comp, x_W)
  if beta is not None:
    residual_W = jax.tree.map(lambda x: 0.5 * x,
                              _tree(seed=2, lead=(W,), leaves=leaves))
    state_W = state_W._replace(residual=residual_W)
  key = jax.random.key(11)
  sent_W, new_state_W = jax.jit(
      lambda x, e: transmit(comp, x, e, key))(x_W, state_W)
  chex.assert_trees_all_equal_shapes_and_dtypes(sent_W, x_W)
  if beta is None:
    one = jax.jit(lambda x, w: roundtrip(codec, x, key, w))
  else:
    new_residual_W = new_state_W.residual
    one_ef = jax.jit(lambda e, x, w: feedback_step(codec, beta, e, x, key, w))
  for w in range(W):
    x = jax.tree.map(lambda a: a[w], x_W)
    if beta is None:
      want_sent = one(x, w)
    else:
      want_sent, want_residual = one_ef(
          jax.tree.map(lambda a: a[w], residual_W), x, w)
      chex.assert_trees_all_close(
          jax.tree.map(lambda a: a[w], new_residual_W), want_residual,
          atol=1e-6)
    chex.assert_trees_all_close(jax.tree.map(lambda a: a[w], sent_W),
                                want_sent, atol=1e-6)


def test_transmit_without_codec_sends_the_tensors():
  x_W = _tree(seed=1, lead=(W,))
  sent_W, residual_W = transmit(compression(None, None), x_W, (),
                                jax.random.key(0))
  chex.assert_trees_all_equal(sent_W, x_W)
  assert residual_W == ()


def test_comm_channel():
  tree = _tree(seed=0)  # 24 + 5 float32 entries
  raw = (24 + 5) * 4
  plain = comm_channel(compression(None, None), tree, 4)
  assert plain.collective == "ring_allreduce"
  assert plain.payload_bytes == raw == message_bytes(compression(None, None),
                                                     tree)
  assert plain.wire_bytes == pytest.approx(2 * 3 / 4 * raw)
  topk = comm_channel(compression(top_k(0.25), 0.9), tree, 4)
  assert topk.collective == "all_gather"
  assert topk.payload_bytes == 6 * (4 + 1) + 1 * (4 + 1)
  assert topk.wire_bytes == pytest.approx(3 * topk.payload_bytes)
  rk = comm_channel(compression(random_k(0.5), None), tree, 4)
  assert rk.collective == "ring_allreduce"
  assert rk.payload_bytes == payload_nbytes(random_k(0.5), tree) == (12 + 2) * 4
