"""Hierarchical DiLoCo against a per-worker Python loop written here, against
DiLoCo in its degenerate cases, and its per-tier bytes against hand counts."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
import toy_workers
from lowbw import data, models, strategies

W, LR = 4, 0.1
REGIONAL = optax.sgd(0.7, momentum=0.9, nesterov=True)
GLOBAL = optax.sgd(0.5, momentum=0.8, nesterov=True)
PARAMS = {"a": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2),
          "b": jnp.array([0.5, -0.25])}
TARGETS = toy_workers.targets(PARAMS, W)
loss = toy_workers.loss


def run_strategy(strategy, steps):
  return toy_workers.run(strategy, PARAMS, TARGETS, steps)


def mean(trees):
  return jax.tree.map(lambda *xs: sum(xs) / len(xs), *trees)


def sub(a, b):
  return jax.tree.map(lambda x, y: x - y, a, b)


def reference(steps, H, s, R):
  """By hand: groups of s consecutive workers, regional every H steps, global
  every R regional syncs."""
  groups = W // s
  workers = [dict(PARAMS) for _ in range(W)]
  group_models = [dict(PARAMS) for _ in range(groups)]
  regional_states = [REGIONAL.init(PARAMS) for _ in range(groups)]
  glob, global_state = dict(PARAMS), GLOBAL.init(PARAMS)
  for t in range(1, steps + 1):
    for w in range(W):
      g = jax.grad(loss)(workers[w], TARGETS[w])
      workers[w] = jax.tree.map(lambda x, d: x - LR * d, workers[w], g)
    if t % H:
      continue
    for g in range(groups):
      members = range(g * s, (g + 1) * s)
      delta = mean([sub(group_models[g], workers[w]) for w in members])
      updates, regional_states[g] = REGIONAL.update(
          delta, regional_states[g], group_models[g])
      group_models[g] = optax.apply_updates(group_models[g], updates)
      for w in members:
        workers[w] = group_models[g]
    if t % (H * R) == 0:
      delta = mean([sub(glob, m) for m in group_models])
      updates, global_state = GLOBAL.update(delta, global_state, glob)
      glob = optax.apply_updates(glob, updates)
      group_models = [glob] * groups
      workers = [glob] * W
  return workers, glob


@pytest.mark.parametrize("s, R", [(2, 2), (2, 1), (1, 3), (4, 2)])
def test_equals_a_two_tier_loop_by_hand(s, R):
  H, steps = 2, 2 * 2 * 3 + 1   # three global rounds at R=2, then a step
  strategy = strategies.hierarchical_diloco(
      optax.sgd(LR), REGIONAL, GLOBAL, H=H, group_size=s, global_every=R)
  state, reports = run_strategy(strategy, steps)
  workers, glob = reference(steps, H, s, R)
  chex.assert_trees_all_close(state.comm.global_params, glob, atol=1e-6)
  for w in range(W):
    chex.assert_trees_all_close(
        jax.tree.map(lambda x, w=w: x[w], state.params_W), workers[w],
        atol=1e-6)
  regional = [int(r["regional"]) for r in reports]
  global_ = [int(r["global"]) for r in reports]
  assert regional == [int(t % H == 0) for t in range(1, steps + 1)]
  assert global_ == [int(t % (H * R) == 0) for t in range(1, steps + 1)]


KW = dict(model=models.mlp(hidden=(16,), num_classes=10), data=data.digits(),
          workers=4, batch_size=8, steps=12, log_every=3, progress=False)
INNER = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)


@pytest.mark.parametrize("codec, ef", [(None, None), ("quant:4", 0.7)])
def test_one_group_is_diloco(codec, ef):
  """One group, the default global averaging: DiLoCo with the regional
  optimizer (the global step's a - (a - b) rounds, hence the tolerance;
  with a 4-bit codec that rounding may move a rare value across a bucket
  boundary, one quantization step apart)."""
  a = lowbw.simulate(strategy=strategies.diloco(
      INNER, REGIONAL, H=3, codec=codec, error_feedback=ef), **KW)
  b = lowbw.simulate(strategy=strategies.hierarchical_diloco(
      INNER, REGIONAL, H=3, groups=1, global_every=2, codec=codec,
      error_feedback=ef), **KW)
  if codec is None:
    chex.assert_trees_all_close(a.params, b.params, atol=1e-5)
  else:
    x, y = (np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])
            for t in (a.params, b.params))
    off = np.abs(x - y) > 1e-5
    assert off.mean() < 0.005 and np.abs(x - y).max() < 1e-3
  np.testing.assert_allclose(a.history["eval_loss"], b.history["eval_loss"],
                             rtol=1e-5)
  # The only group sends nothing globally: the bytes are DiLoCo's.
  assert b.summary["payload_bytes"] == a.summary["payload_bytes"]
  assert b.summary["wire_bytes_regional"] == a.summary["wire_bytes"]
  assert b.summary["wire_bytes_global"] == 0


def test_groups_of_one_every_round_is_diloco_with_the_global_optimizer():
  a = lowbw.simulate(strategy=strategies.diloco(INNER, GLOBAL, H=3,
                                                codec="quant:4",
                                                error_feedback=0.7), **KW)
  b = lowbw.simulate(strategy=strategies.hierarchical_diloco(
      INNER, optax.sgd(1.0), GLOBAL, H=3, group_size=1, global_every=1,
      codec="quant:4", error_feedback=0.7), **KW)
  chex.assert_trees_all_close(a.params, b.params, atol=1e-5)
  assert b.summary["wire_bytes_global"] == a.summary["wire_bytes"]
  assert b.summary["wire_bytes_regional"] == 0


def test_bytes_per_tier_and_peak_by_hand():
  """W = 4 in two regions of 2, H = 2, R = 2, 16 steps: 8 regional syncs,
  4 global ones; a region's global message goes out in halves."""
  r = lowbw.simulate(strategy=strategies.hierarchical_diloco(
      H=2, group_size=2, global_every=2), **dict(KW, steps=16))
  m = 4 * (64 * 16 + 16 + 16 * 10 + 10)  # the float32 pseudo-gradient
  regional = 2 * (2 - 1) / 2 * m           # ring over 2 workers
  global_ = 2 * (2 - 1) / 2 * m / 2        # ring over 2 regions, 2 shards
  assert r.summary["wire_bytes_regional"] == pytest.approx(8 * regional)
  assert r.summary["wire_bytes_global"] == pytest.approx(4 * global_)
  assert r.summary["wire_bytes"] == pytest.approx(8 * regional + 4 * global_)
  assert r.summary["payload_bytes"] == 12 * m
  assert r.summary["peak_step_bytes"] == pytest.approx(regional + global_)
  cols = r.history["wire_bytes_regional"] + r.history["wire_bytes_global"]
  np.testing.assert_allclose(cols, r.history["wire_bytes"])


def test_tiers_are_priced_on_the_hierarchical_topologys_links():
  """Regional syncs on the regional links, global ones over the WAN: the
  simulated time by hand (0.01 s a step, ring all-reduces)."""
  net = lowbw.network.network("100Mbps", "100ms", topology="hierarchical",
                              group_size=2, regional_bandwidth="10Gbps",
                              regional_latency="5ms", hardware="0.01s",
                              profile="ideal")  # the formulas by hand
  r = lowbw.simulate(strategy=strategies.hierarchical_diloco(
      H=2, group_size=2, global_every=2), network=net, **dict(KW, steps=8))
  m = 4 * (64 * 16 + 16 + 16 * 10 + 10)
  regional = 2 * (2 - 1) * (5e-3 + 8 * m / 2 / 1e10)
  global_ = 2 * (2 - 1) * (0.1 + 8 * (m / 2) / 2 / 1e8)
  assert r.summary["sim_time_s"] == pytest.approx(
      8 * 0.01 + 4 * regional + 2 * global_, rel=1e-6)


@pytest.mark.parametrize("kw, field", [
    ({"group_size": 2, "groups": 2}, "groups"),
    ({"group_size": 0}, "group_size"),
    ({"global_every": 0}, "global_every"),
    ({"H": 0}, "H"),
])
def test_bad_settings_are_one_line_errors(kw, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    strategies.hierarchical_diloco(**kw)


@pytest.mark.parametrize("kw, message", [
    ({"group_size": 3}, r"^group_size=3 is invalid: must divide "
                        r"workers=4"),
    ({"groups": 3}, r"^groups=3 is invalid: must divide workers=4"),
])
def test_groups_must_divide_the_workers_at_build(kw, message):
  with pytest.raises(ValueError, match=message):
    lowbw.build(strategy=strategies.hierarchical_diloco(H=2, **kw),
                **{k: v for k, v in KW.items() if k != "progress"})


def test_the_global_outer_optimizer_is_checked_at_build():
  with pytest.raises(ValueError, match="^global_outer=.*expected an "
                     "optax.GradientTransformation"):
    strategies.hierarchical_diloco(global_outer="sgd")
  with pytest.raises(ValueError, match="^groups=0 is invalid"):
    strategies.hierarchical_diloco(groups=0)


def test_a_bad_global_outer_flag_names_itself(capsys):
  from lowbw import cli
  assert cli.main(["train", "--strategy", "hierarchical_diloco",
                   "--global-outer-lr", "-1"]) == 2
  assert "--global-outer-lr=-1.0 is invalid" in capsys.readouterr().err
