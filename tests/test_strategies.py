"""Each strategy against a plain per-worker Python loop, written here.

The vectorized strategies see W-stacked trees; the references below keep one
parameter tree and one optimizer state per worker in Python lists and combine
them with explicit loops, as a multi-process implementation would.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import strategies
from lowbw.network import ring_allreduce
from lowbw.transforms import sparse_count, sparse_indices

W, STEPS, DIM = 4, 12, 5


def loss_fn(params, batch):
  pred = jnp.tanh(batch["x"] @ params["w"]) + params["b"][None]
  return jnp.mean(jnp.square(pred - batch["y"]))


# One worker's gradient, compiled once for the references' Python loops
# (op by op, the calls of this module's references took seconds).
grad_fn = jax.jit(jax.grad(loss_fn))


def make_problem(seed=0):
  rng = np.random.default_rng(seed)
  params = {"w": jnp.asarray(rng.normal(size=(DIM, 3)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
  batches = {"x": jnp.asarray(rng.normal(size=(STEPS, W, 6, DIM)), jnp.float32),
             "y": jnp.asarray(rng.normal(size=(STEPS, W, 6, 3)), jnp.float32)}
  return params, batches


def batch_at(batches, t, w=None):
  if w is None:
    return jax.tree.map(lambda x: x[t], batches)
  return jax.tree.map(lambda x: x[t, w], batches)


def run_vectorized(strategy, params, batches, key=jax.random.PRNGKey(7),
                   num_workers_=W):
  state = strategy.init(params, num_workers_, key)
  step = jax.jit(strategy.step)
  grad_W = jax.jit(jax.vmap(jax.grad(loss_fn)))
  for t in range(STEPS):
    state, _ = step(state, grad_W(state.params_W, batch_at(batches, t)))
  return state


def outer_step(outer, global_params, outer_state, params_w):
  """DiLoCo's sync on Python lists: mean pseudo-gradient, outer step, restart."""
  delta = mean_of([optax.tree.sub(global_params, p) for p in params_w])
  upd, outer_state = outer.update(delta, outer_state, global_params)
  global_params = optax.apply_updates(global_params, upd)
  return global_params, outer_state, [global_params] * W


def local_steps(inner, params_w, inner_w, batches, t):
  """One inner step of every worker, in a Python loop."""
  for w in range(W):
    g = grad_fn(params_w[w], batch_at(batches, t, w))
    upd, inner_w[w] = inner.update(g, inner_w[w], params_w[w])
    params_w[w] = optax.apply_updates(params_w[w], upd)


def mean_of(trees):
  return jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)


def assert_workers_close(params_W, params_w, atol=1e-5):
  for w in range(W):
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[w], params_W),
                                params_w[w], atol=atol, rtol=1e-5)


INNER = optax.sgd(0.05, momentum=0.9)


def test_ddp_matches_reference():
  params, batches = make_problem()
  state = run_vectorized(strategies.ddp(INNER), params, batches)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  for t in range(STEPS):
    g = mean_of([grad_fn(params_w[w], batch_at(batches, t, w))
                 for w in range(W)])
    for w in range(W):
      upd, inner_w[w] = INNER.update(g, inner_w[w], params_w[w])
      params_w[w] = optax.apply_updates(params_w[w], upd)
  assert_workers_close(state.params_W, params_w)


@pytest.mark.parametrize("H", [1, 3, 5])
def test_fedavg_matches_reference(H):
  params, batches = make_problem()
  state = run_vectorized(strategies.fedavg(INNER, H=H), params, batches)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  for t in range(STEPS):
    local_steps(INNER, params_w, inner_w, batches, t)
    if (t + 1) % H == 0:
      params_w = [mean_of(params_w)] * W
  assert_workers_close(state.params_W, params_w)


def island_average(trees_w, key, step, H, s):
  """FedAvg's island sync on a Python list: the island draw is part of the
  spec, a permutation from the shared key, fresh every round."""
  perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, step // H),
                                           W))
  out = list(trees_w)
  for g in range(W // s):
    island = perm[g * s:(g + 1) * s].tolist()
    avg = mean_of([trees_w[w] for w in island])
    for w in island:
      out[w] = avg
  return out


def test_fedavg_islands_match_reference():
  params, batches = make_problem()
  H, s, key = 2, 2, jax.random.PRNGKey(3)
  state = run_vectorized(strategies.fedavg(INNER, H=H, island_size=s), params,
                         batches, key)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  for t in range(STEPS):
    local_steps(INNER, params_w, inner_w, batches, t)
    if (t + 1) % H == 0:
      params_w = island_average(params_w, key, t + 1, H, s)
  assert_workers_close(state.params_W, params_w)
  # Islands really differ: workers are not all equal after a sync.
  spread = float(jnp.max(jnp.abs(state.params_W["w"] - state.params_W["w"][:1])))
  assert spread > 1e-4


@pytest.mark.parametrize("H", [1, 4])
def test_diloco_matches_reference(H):
  params, batches = make_problem()
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  inner = optax.adam(0.01)
  state = run_vectorized(strategies.diloco(inner, outer, H=H), params, batches)
  params_w, inner_w = [params] * W, [inner.init(params)] * W
  global_params, outer_state = params, outer.init(params)
  for t in range(STEPS):
    local_steps(inner, params_w, inner_w, batches, t)
    if (t + 1) % H == 0:
      global_params, outer_state, params_w = outer_step(
          outer, global_params, outer_state, params_w)
  assert_workers_close(state.params_W, params_w)
  chex.assert_trees_all_close(state.comm.global_params, global_params, atol=1e-5)


@pytest.mark.parametrize("H", [1, 3])
def test_diloco_with_a_delayed_outer_step_matches_algorithm_2(H):
  """outer_delay=1 (Kale et al. 2025, arXiv 2502.12996, Algorithm 2),
  written from the paper: every worker starts round t from the global
  theta(t-1) and sends global - its own params; the outer step at the end
  of round t applies round t-1's mean (nothing at the first sync); every
  worker restarts from the result."""
  params, batches = make_problem()
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  inner = optax.adam(0.01)
  state = run_vectorized(strategies.diloco(inner, outer, H=H, outer_delay=1),
                         params, batches)
  params_w, inner_w = [params] * W, [inner.init(params)] * W
  global_params, outer_state, in_flight = params, outer.init(params), None
  for t in range(STEPS):
    local_steps(inner, params_w, inner_w, batches, t)
    if (t + 1) % H == 0:
      mean = mean_of([jax.tree.map(lambda g, p: g - p, global_params, pw)
                      for pw in params_w])
      if in_flight is not None:
        updates, outer_state = outer.update(in_flight, outer_state,
                                            global_params)
        global_params = optax.apply_updates(global_params, updates)
      in_flight = mean
      params_w = [global_params] * W
  assert_workers_close(state.params_W, params_w)
  chex.assert_trees_all_close(state.comm.global_params, global_params,
                              atol=1e-5)
  chex.assert_trees_all_close(state.comm.in_flight, in_flight, atol=1e-5)


@pytest.mark.parametrize("H", [1, 3])
def test_diloco_with_eager_updates_matches_algorithm_3(H):
  """eager=True (arXiv 2502.12996, Algorithm 3), written from the paper:
  each worker keeps its own outer params and Nesterov state; at the end of
  round t it steps on (1/W) * (its own fresh pseudo-gradient + every other
  worker's from round t-1) and restarts from its own outer params."""
  params, batches = make_problem()
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  inner = optax.adam(0.01)
  state = run_vectorized(strategies.diloco(inner, outer, H=H, outer_delay=1,
                                           eager=True), params, batches)
  params_w, inner_w = [params] * W, [inner.init(params)] * W
  outer_w, ostate_w = [params] * W, [outer.init(params)] * W
  previous = [jax.tree.map(jnp.zeros_like, params)] * W
  for t in range(STEPS):
    local_steps(inner, params_w, inner_w, batches, t)
    if (t + 1) % H == 0:
      fresh = [jax.tree.map(lambda o, p: o - p, outer_w[w], params_w[w])
               for w in range(W)]
      for w in range(W):
        others = [previous[v] for v in range(W) if v != w]
        mixed = jax.tree.map(lambda *xs: sum(xs) / W, fresh[w], *others)
        updates, ostate_w[w] = outer.update(mixed, ostate_w[w], outer_w[w])
        outer_w[w] = optax.apply_updates(outer_w[w], updates)
      previous, params_w = fresh, list(outer_w)
  assert_workers_close(state.params_W, params_w)
  assert_workers_close(state.comm.outer_params_W, outer_w)


def test_eager_updates_with_one_worker_are_diloco():
  params, batches = make_problem()
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  inner = optax.adam(0.01)
  one = jax.tree.map(lambda x: x[:, :1], batches)  # one worker's data
  eager = strategies.diloco(inner, outer, H=3, outer_delay=1, eager=True)
  plain = strategies.diloco(inner, outer, H=3)
  a = run_vectorized(eager, params, one, num_workers_=1)
  b = run_vectorized(plain, params, one, num_workers_=1)
  chex.assert_trees_all_close(a.params_W, b.params_W, atol=1e-6)
  with pytest.raises(ValueError, match="^eager=True is invalid: needs "
                     "outer_delay=1"):
    strategies.diloco(H=2, eager=True)
  with pytest.raises(ValueError, match="^eager='yes' is invalid: expected "
                     "True or False"):
    strategies.diloco(H=2, outer_delay=1, eager="yes")


def test_a_delayed_outer_step_is_refused_outside_0_and_1():
  for bad in (2, -1, True, 0.5):
    with pytest.raises(ValueError, match="^outer_delay=.* is invalid: "
                       "expected 0 or 1"):
      strategies.diloco(H=2, outer_delay=bad)


# The library's index draw, compiled once per tensor size (op by op, the
# SPARTA references' draws took seconds).
_sparse_indices = jax.jit(sparse_indices, static_argnums=(2, 3, 4))


def sparse_reference(key, step, params_w, p, selector):
  """SPARTA averaging with explicit loops over tensors, indices and workers."""
  out = [jax.tree.map(np.array, pw) for pw in params_w]
  leaves0, treedef = jax.tree.flatten(out[0])
  worker_leaves = [jax.tree.leaves(o) for o in out]
  sparse_key = jax.random.fold_in(key, 0x5BA7)
  for i, leaf in enumerate(leaves0):
    k = sparse_count(leaf.size, p)
    idx = np.asarray(_sparse_indices(jax.random.fold_in(sparse_key, i),
                                     jnp.int32(step), leaf.size, k, selector))
    for j in idx:
      avg = sum(wl[i].reshape(-1)[j] for wl in worker_leaves) / W
      for wl in worker_leaves:
        wl[i].reshape(-1)[j] = avg
  return [jax.tree.unflatten(treedef, wl) for wl in worker_leaves]


@pytest.mark.parametrize("selector", ["random", "shuffled", "partitioned"])
def test_sparta_matches_reference(selector):
  params, batches = make_problem()
  key, p = jax.random.PRNGKey(11), 0.2
  state = run_vectorized(strategies.sparta(INNER, p=p, selector=selector),
                         params, batches, key)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  for t in range(STEPS):
    local_steps(INNER, params_w, inner_w, batches, t)
    params_w = sparse_reference(key, t + 1, params_w, p, selector)
  assert_workers_close(state.params_W, params_w)


def test_sparta_diloco_matches_reference():
  params, batches = make_problem()
  key, p, H = jax.random.PRNGKey(5), 0.3, 4
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  state = run_vectorized(strategies.sparta_diloco(INNER, outer, H=H, p=p),
                         params, batches, key)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  global_params, outer_state = params, outer.init(params)
  for t in range(STEPS):
    local_steps(INNER, params_w, inner_w, batches, t)
    params_w = sparse_reference(key, t + 1, params_w, p, "random")
    if (t + 1) % H == 0:
      global_params, outer_state, params_w = outer_step(
          outer, global_params, outer_state, params_w)
  assert_workers_close(state.params_W, params_w)


@pytest.mark.parametrize("selector", ["shuffled", "partitioned"])
def test_sparse_partitions_cover_every_entry(selector):
  size, k = 50, 7
  parts = math.ceil(size / k)
  key = jax.random.PRNGKey(0)
  seen = np.concatenate([np.asarray(sparse_indices(key, jnp.int32(s), size, k,
                                                   selector))
                         for s in range(parts)])
  assert set(seen.tolist()) == set(range(size))
  for s in range(3):
    idx = np.asarray(sparse_indices(key, jnp.int32(s), size, k, "random"))
    assert len(set(idx.tolist())) == k and idx.max() < size


@pytest.mark.parametrize("name", sorted(strategies.REGISTRY))
def test_every_strategy_runs_under_jit_and_scan(name):
  params, batches = make_problem()
  # syncs run in the scan
  kwargs = {} if name in ("ddp", "sparta", "demo") else {"H": 3}
  if name == "streaming_diloco":  # H a multiple of P; a merge delay
    kwargs = {"H": 4, "fragments": 2, "delay": 1}
  if name == "hierarchical_diloco":  # regional every 3 steps, global every 6
    kwargs = {"H": 3, "global_every": 2}
  if name in ("desloc", "mtdao"):  # parameters every 2, moments 3 and 6
    kwargs = {"Kx": 2, "Ku": 3, "Kv": 6}
  if name == "spes":  # an expert axis of W experts; a merge at step 3
    kwargs = {"H": 3, "merge_warmup_steps": 6, "merge_every": 3,
              "merge_top_k": 1}
    params = dict(params, experts={"w": jnp.stack(
        [params["w"] * (1 + e) for e in range(W)])})
  strategy = strategies.get(name, **kwargs)
  state = strategy.init(params, W, jax.random.PRNGKey(0))
  chex.assert_tree_shape_prefix(state.params_W, (W,))

  def body(state, batch_W):
    grads_W = jax.vmap(jax.grad(loss_fn))(state.params_W, batch_W)
    return strategy.step(state, grads_W)

  scan = jax.jit(lambda s, b: jax.lax.scan(body, s, b))
  final, reports = scan(state, batches)
  chex.assert_tree_all_finite(final.params_W)
  chex.assert_tree_shape_prefix(final.params_W, (W,))
  chex.assert_trees_all_equal_shapes(final.params_W, state.params_W)
  assert int(final.step) == STEPS
  channels = strategy.channels(params, W)
  assert set(channels) <= set(reports)
  for name in set(reports) - set(channels):  # the strategy's own metrics
    assert reports[name].dtype == jnp.float32
    assert reports[name].shape == (STEPS,)
  reports = {k: v for k, v in reports.items() if k in channels}
  # No recompilation on a second call with new values.
  scan(final, batches)
  assert scan._cache_size() == 1
  # Events: per-step channels fire every step, sync channels every H steps
  # (an asynchronous strategy's H: driven step by step, every worker
  # arrives after each H steps).
  period = strategy.asynchronous or strategy.period
  for channel, counts in reports.items():
    expected = (STEPS // period if channel in
                ("parameters", "pseudo_gradients", "regional", "shared",
                 "experts", "pairs", "gossip") else STEPS)
    if name in ("desloc", "mtdao"):
      expected = STEPS // {"params": 2, "first_moment": 3,
                           "second_moment": 6}[channel]
    if channel == "global":
      expected = STEPS // (strategy.period * kwargs["global_every"])
    if channel.startswith("fragment_"):  # syncs k = 1.. take (k-1) mod P
      p, P = int(channel.split("_")[1]), kwargs["fragments"]
      expected = sum((k - 1) % P == p
                     for k in range(1, STEPS // strategy.period + 1))
    assert int(jnp.sum(counts)) == expected, channel


@pytest.mark.parametrize("name", ["fedavg", "diloco", "sparta_diloco"])
def test_step_equals_local_rounds_then_sync(name):
  """``step`` (lax.cond schedule) == the engine's round structure."""
  params, batches = make_problem()
  strategy = strategies.get(name, inner=INNER, H=3)
  grad_W = jax.jit(jax.vmap(jax.grad(loss_fn)))
  step, local, sync = map(jax.jit, (strategy.step, strategy.local, strategy.sync))
  a = strategy.init(params, W, jax.random.PRNGKey(1))
  b = a
  for t in range(STEPS):
    a, _ = step(a, grad_W(a.params_W, batch_at(batches, t)))
    b, _ = local(b, grad_W(b.params_W, batch_at(batches, t)))
    if (t + 1) % strategy.period == 0:
      b, _ = sync(b)
  # Same arithmetic; compiled as one cond branch, XLA may fuse it differently.
  chex.assert_trees_all_close(a.params_W, b.params_W, atol=1e-6, rtol=1e-6)


def test_sparta_skips_empty_tensors():
  params_W = {"w": jnp.ones((W, 3, 2)), "empty": jnp.zeros((W, 0))}
  out = jax.jit(lambda p: __import__("lowbw").transforms.sparse_average(
      jax.random.PRNGKey(0), jnp.int32(1), p, 0.5, "random"))(params_W)
  assert out["empty"].shape == (W, 0)
  (ch,) = strategies.sparta(p=0.5).channels(
      {"w": jnp.ones((3, 2)), "empty": jnp.zeros((0,))}, W).values()
  assert ch.payload_bytes == 3 * 4


def test_channels_bytes():
  params = {"w": jnp.zeros((10, 20)), "b": jnp.zeros((20,), jnp.bfloat16)}
  P_bytes = 200 * 4 + 20 * 2
  for name in ("ddp", "diloco", "fedavg"):
    (channel,) = strategies.get(name).channels(params, 8).values()
    assert channel.payload_bytes == P_bytes
    assert channel.wire_bytes == pytest.approx(2 * 7 / 8 * P_bytes)
  (ch,) = strategies.fedavg(island_size=2).channels(params, 8).values()
  assert ch.wire_bytes == pytest.approx(2 * 1 / 2 * P_bytes) and ch.group_size == 2
  (ch,) = strategies.sparta(p=0.1).channels(params, 4).values()
  assert ch.payload_bytes == 20 * 4 + 2 * 2  # k = 20 of 200, 2 of 20
  assert ring_allreduce(100, 1).wire_bytes == 0.0


@pytest.mark.parametrize("call, field", [
    (lambda: strategies.diloco(H=0), "H"),
    (lambda: strategies.fedavg(H=-3), "H"),
    (lambda: strategies.sparta(p=0.0), "p"),
    (lambda: strategies.sparta(p=1.5), "p"),
    (lambda: strategies.sparta_diloco(p=2), "p"),
    (lambda: strategies.sparta(selector="bogus"), "selector"),
    (lambda: strategies.fedavg(island_size=0), "island_size"),
    (lambda: strategies.diloco(inner="adam"), "inner"),
    (lambda: strategies.get("nope"), "strategy"),
    (lambda: strategies.fedavg(island_size=3).init(
        {"a": jnp.zeros(2)}, 8, jax.random.PRNGKey(0)), "island_size"),
])
def test_bad_arguments_name_the_field(call, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    call()
