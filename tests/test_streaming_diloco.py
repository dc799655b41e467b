"""Streaming DiLoCo against DiLoCo and against a per-worker Python loop that
applies the fragment schedule and the delayed merge by hand."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
import toy_workers
from lowbw import data, models, strategies
from lowbw.strategies._streaming_diloco import blocks, fragment_of_leaves

W, LR = 3, 0.1
OUTER = optax.sgd(0.7, momentum=0.9, nesterov=True)
PARAMS = {"a": {"w": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2)},
          "b": {"w": jnp.array([0.5, -0.25])},
          "c": jnp.arange(4.0) / 4}
TARGETS = toy_workers.targets(PARAMS, W)
loss = toy_workers.loss


def run_strategy(strategy, steps):
  return toy_workers.run(strategy, PARAMS, TARGETS, steps)[0]


def reference(steps, H, frags, delay, alpha):
  """By hand: ``frags`` lists each fragment's block names."""
  P, period = len(frags), H // len(frags)
  workers = [dict(PARAMS) for _ in range(W)]
  glob = dict(PARAMS)
  outer_states = [OUTER.init({b: glob[b] for b in f}) for f in frags]
  merge_at, merge_frag = -1, 0

  def merge(p):
    for w in range(W):
      for b in frags[p]:
        workers[w][b] = jax.tree.map(lambda x, g: alpha * x + (1 - alpha) * g,
                                     workers[w][b], glob[b])

  for t in range(1, steps + 1):
    for w in range(W):
      g = jax.grad(loss)(workers[w], TARGETS[w])
      workers[w] = jax.tree.map(lambda x, d: x - LR * d, workers[w], g)
    if t == merge_at:
      merge(merge_frag)
    if t % period == 0:
      p = (t // period - 1) % P
      delta = {b: jax.tree.map(lambda g, *xs: sum(g - x for x in xs) / W,
                               glob[b], *[workers[w][b] for w in range(W)])
               for b in frags[p]}
      old = {b: glob[b] for b in frags[p]}
      updates, outer_states[p] = OUTER.update(delta, outer_states[p], old)
      glob.update(optax.apply_updates(old, updates))
      if delay == 0:
        merge(p)
      else:
        merge_at, merge_frag = t + delay, p
  return workers, glob


@pytest.mark.parametrize("pattern, frags, delay, alpha", [
    ("strided", [["a", "c"], ["b"]], 1, 0.5),     # blocks a, b, c: i mod 2
    ("sequential", [["a", "b"], ["c"]], 0, 0.3),  # floor(i*2/3)
    ("strided", [["a"], ["b"], ["c"]], 1, 0.0),
])
def test_fragments_and_delayed_merge_equal_a_loop_by_hand(pattern, frags,
                                                          delay, alpha):
  H, steps = 2 * len(frags), 4 * len(frags) + 1
  strategy = strategies.streaming_diloco(
      optax.sgd(LR), OUTER, H=H, fragments=len(frags), pattern=pattern,
      delay=delay, alpha=alpha, codec=None)
  state = run_strategy(strategy, steps)
  workers, glob = reference(steps, H, frags, delay, alpha)
  chex.assert_trees_all_close(state.comm.global_params, glob, atol=1e-6)
  for w in range(W):
    chex.assert_trees_all_close(
        jax.tree.map(lambda x, w=w: x[w], state.params_W), workers[w],
        atol=1e-6)


@pytest.mark.parametrize("codec, ef", [(None, None), ("quant:4", 0.7)])
def test_one_fragment_without_delay_or_mixing_is_diloco_bit_for_bit(codec,
                                                                    ef):
  kw = dict(model=models.mlp(hidden=(16,), num_classes=10),
            data=data.digits(), workers=4, batch_size=8, steps=12,
            log_every=2, progress=False)
  inner = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)
  a = lowbw.simulate(strategy=strategies.diloco(
      inner, OUTER, H=3, codec=codec, error_feedback=ef), **kw)
  b = lowbw.simulate(strategy=strategies.streaming_diloco(
      inner, OUTER, H=3, fragments=1, delay=0, alpha=0.0, codec=codec,
      error_feedback=ef), **kw)
  chex.assert_trees_all_equal(a.params, b.params)
  for key in ("train_loss", "eval_loss", "payload_bytes", "wire_bytes",
              "strategy_pseudo_grad_norm"):
    np.testing.assert_array_equal(a.history[key], b.history[key], key)


def test_fragments_partition_every_leaf_exactly_once():
  gpt = models.gpt(layers=4, d_model=32, heads=2, seq_len=16, vocab=64)
  params = jax.eval_shape(gpt.init, jax.random.PRNGKey(0),
                          data.text_bytes(seq_len=16).example_batch(2))
  names = blocks(params)
  assert names[:4] == ["block_0", "block_1", "block_2", "block_3"]
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for pattern in ("strided", "sequential"):
    for P in range(1, len(names) + 1):
      ids = fragment_of_leaves(params, P, pattern)
      assert len(ids) == len(leaves)
      assert sorted(set(ids)) == list(range(P))  # none empty, none extra
      for (path, _), f in zip(leaves, ids):  # a block is never split
        i = names.index(path[0].key)
        assert f == (i % P if pattern == "strided"
                     else i * P // len(names))
  # A flax-style {"params": {...}} level is looked through.
  assert blocks({"params": {"x": 1, "y": 2}}) == ["x", "y"]


def test_bytes_are_each_fragments_pseudo_gradient():
  model = models.mlp(hidden=(16,), num_classes=10)  # digits: 64 inputs
  r = lowbw.simulate(model=model, data=data.digits(),
                     strategy=strategies.streaming_diloco(H=4, fragments=2,
                                                        codec=None),
                     workers=4, batch_size=8, steps=16, progress=False)
  dense, head = 4 * (64 * 16 + 16), 4 * (16 * 10 + 10)  # blocks, fp32
  # Syncs at steps 2, 4, ..., 16: Dense_0, head, Dense_0, ... (4 each).
  assert r.summary["payload_bytes"] == 4 * dense + 4 * head
  assert r.summary["wire_bytes"] == pytest.approx(1.5 * (4 * dense + 4 * head))


@pytest.mark.parametrize("kw, field", [
    ({"H": 5, "fragments": 2}, "H"),
    ({"H": 4, "fragments": 2, "delay": 2}, "delay"),
    ({"H": 4, "fragments": 2, "delay": -1}, "delay"),
    ({"pattern": "random"}, "pattern"),
    ({"alpha": 1.5}, "alpha"),
    ({"fragments": 0}, "fragments"),
])
def test_bad_settings_are_one_line_errors(kw, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    strategies.streaming_diloco(**kw)


def test_more_fragments_than_blocks_is_an_error_at_build():
  with pytest.raises(ValueError, match=r"^fragments=3 is invalid: the model "
                     r"has 2 blocks \(Dense_0, head\)"):
    lowbw.build(model=models.mlp(hidden=(16,), num_classes=10),
                data=data.digits(), workers=2, batch_size=4, steps=6,
                strategy=strategies.streaming_diloco(H=6, fragments=3))


def test_peak_step_bytes_is_the_largest_sync():
  """The most wire bytes one step sends, per worker: DiLoCo's whole
  pseudo-gradient at once; Streaming DiLoCo's largest fragment; DDP's
  gradients every step."""
  model = models.mlp(hidden=(16,), num_classes=10)
  kw = dict(model=model, data=data.digits(), workers=4, batch_size=8,
            steps=16, log_every=2, progress=False)
  dense, head = 4 * (64 * 16 + 16), 4 * (16 * 10 + 10)
  ring = 2 * (4 - 1) / 4
  runs = {"diloco": (strategies.diloco(H=4), ring * (dense + head)),
          "streaming": (strategies.streaming_diloco(H=4, fragments=2,
                                                  codec=None),
                        ring * dense),
          "ddp": (strategies.ddp(), ring * (dense + head))}
  for name, (strategy, peak) in runs.items():
    r = lowbw.simulate(strategy=strategy, **kw)
    assert r.summary["peak_step_bytes"] == pytest.approx(peak), name
    # A running maximum: 0 before the first sync, then the peak.
    first = r.history["peak_step_bytes"][0]
    assert first == (pytest.approx(peak) if name != "diloco" else 0.0), name
    assert r.history["peak_step_bytes"][-1] == pytest.approx(peak), name


def test_clock_overlaps_a_fragments_sync_with_tau_steps():
  """On a slow link the workers wait, tau steps after each fragment's sync,
  only for what those steps did not hide: a step-by-step timeline by hand."""
  model = models.mlp(hidden=(16,), num_classes=10)
  dense, head = 4 * (64 * 16 + 16), 4 * (16 * 10 + 10)
  bw, lat, c, w = 1e6, 0.01, 0.01, 4     # 1 Mbit/s, 10 ms, 10 ms a step
  ring = lambda b: 2 * (w - 1) * (lat + 8 * b / w / bw)  # noqa: E731
  net = lowbw.network.network("1Mbps", "10ms", hardware="0.01s",
                              profile="ideal")  # the formulas by hand

  def by_hand(tau, frags, period, steps):
    t, arrives = 0.0, 0.0
    for s in range(1, steps + 1):
      t += c
      if s > period and (s - tau) % period == 0 and tau:
        t = max(t, arrives)          # the delayed merge needs the result
      if s % period == 0:            # a fragment's sync: a barrier
        start = max(t, arrives)
        arrives = start + ring(frags[(s // period - 1) % len(frags)])
        t = start if tau else arrives
    return max(t, arrives)

  times = {}
  for tau in (0, 1):
    r = lowbw.simulate(
        model=model, data=data.digits(), workers=w, batch_size=8,
        steps=16, network=net, progress=False,
        strategy=strategies.streaming_diloco(H=4, fragments=2, delay=tau,
                                             codec=None))
    times[tau] = r.summary["sim_time_s"]
    assert times[tau] == pytest.approx(by_hand(tau, (dense, head), 2, 16),
                                       rel=1e-6), tau
  assert times[1] < times[0]


def test_a_users_partition_sets_the_fragments():
  """A prefix tree of ids: block a and c in fragment 1, b in 0; equals the
  loop by hand with those fragments."""
  partition = {"a": 1, "b": 0, "c": 1}
  strategy = strategies.streaming_diloco(
      optax.sgd(LR), OUTER, H=4, fragments=2, delay=1, alpha=0.5,
      partition=partition, codec=None)
  state = run_strategy(strategy, 9)
  workers, glob = reference(9, 4, [["b"], ["a", "c"]], 1, 0.5)
  chex.assert_trees_all_close(state.comm.global_params, glob, atol=1e-6)
  assert strategy.config["pattern"] == "user"


@pytest.mark.parametrize("partition, message", [
    ({"a": 0, "b": 0, "c": 0}, "fragment 1 has no parameters"),
    ({"a": 0, "b": 2, "c": 1}, r"integers in \[0, fragments=2\); got 2"),
    ({"a": 0, "b": 1}, "expected the parameters' tree or a prefix"),
])
def test_a_bad_partition_is_a_one_line_error(partition, message):
  strategy = strategies.streaming_diloco(H=4, fragments=2,
                                         partition=partition)
  with pytest.raises(ValueError, match="^partition=.*" + message):
    strategy.init(PARAMS, W, jax.random.PRNGKey(0))
