"""Outer learning-rate and momentum schedules (Pier's warm-up and decay)
against a DiLoCo loop that applies Nesterov SGD by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import data, models, strategies
from toy_regression import loss_fn, problem

W, STEPS, H = 3, 18, 2
SCHEDULE = dict(lr_warmup=2, lr_decay_start=4, lr_decay_steps=3,
                lr_final_ratio=0.2, momentum_warmup=3,
                momentum_decay_start=5, momentum_decay_steps=2,
                momentum_final=0.3)


def by_hand(t, peak, warmup, start, steps, final):
  """The documented shape, in plain Python."""
  value = peak
  if steps and t > start:
    value = peak + (final - peak) * min(1.0, (t - start) / steps)
  if warmup:
    value *= min(1.0, (t + 1) / warmup)
  return value


def test_shapes_match_the_formula():
  for t in range(12):
    lr = strategies._schedule.scheduled(t, 0.7, 2.0, 4.0, 3.0, 0.14)
    m = strategies._schedule.scheduled(t, 0.9, 3.0, 5.0, 2.0, 0.3)
    assert float(lr) == pytest.approx(by_hand(t, 0.7, 2, 4, 3, 0.14))
    assert float(m) == pytest.approx(by_hand(t, 0.9, 3, 5, 2, 0.3))


def test_scheduled_diloco_matches_nesterov_by_hand():
  params, batches = problem(STEPS, W)
  inner = optax.sgd(0.1)
  outer = strategies.outer_optimizer(0.7, 0.9, **SCHEDULE)
  strategy = strategies.diloco(inner, outer, H=H)
  state = strategy.init(params, W, jax.random.key(0))
  step = jax.jit(strategy.step)
  grads = jax.jit(jax.vmap(jax.grad(loss_fn)))
  theta = jax.tree.map(np.asarray, params)
  trace = jax.tree.map(np.zeros_like, theta)
  workers = [dict(theta) for _ in range(W)]
  for t in range(1, STEPS + 1):
    batch = jax.tree.map(lambda b: b[t - 1], batches)
    state, _ = step(state, grads(state.params_W, batch))
    for w in range(W):
      g = jax.grad(loss_fn)(jax.tree.map(jnp.asarray, workers[w]),
                            jax.tree.map(lambda b: b[w], batch))
      workers[w] = {k: workers[w][k] - 0.1 * np.asarray(g[k]) for k in g}
    if t % H:
      continue
    outer_t = t // H - 1
    lr = by_hand(outer_t, 0.7, 2, 4, 3, 0.7 * 0.2)
    m = by_hand(outer_t, 0.9, 3, 5, 2, 0.3)
    for k in theta:
      delta = sum(theta[k] - x[k] for x in workers) / W
      trace[k] = delta + m * trace[k]
      theta[k] = theta[k] - lr * (delta + m * trace[k])  # Nesterov
    workers = [dict(theta) for _ in range(W)]
  for k in theta:
    np.testing.assert_allclose(state.comm.global_params[k], theta[k],
                               atol=2e-5)


def test_no_schedule_is_the_plain_optimizer_bit_for_bit():
  params, batches = problem(STEPS, W)
  plain = optax.inject_hyperparams(optax.sgd)(0.7, momentum=0.9,
                                              nesterov=True)
  runs = []
  for outer in (plain, strategies.outer_optimizer(0.7, 0.9)):
    strategy = strategies.diloco(optax.sgd(0.1), outer, H=H)
    state = strategy.init(params, W, jax.random.key(0))
    for t in range(STEPS):
      g = jax.vmap(jax.grad(loss_fn))(state.params_W,
                                      jax.tree.map(lambda b: b[t], batches))
      state, _ = strategy.step(state, g)
    runs.append(state.comm.global_params)
  for k in runs[0]:
    np.testing.assert_array_equal(runs[0][k], runs[1][k])


def test_schedule_is_traced_a_sweep_equals_a_build():
  def build(**schedule):
    return lowbw.build(
        model=models.mlp(hidden=(8,), num_classes=10), data=data.digits(),
        strategy=strategies.diloco(
            H=2, outer=strategies.outer_optimizer(0.7, 0.9, **schedule)),
        workers=2, batch_size=4, steps=8, eval_every=8)
  built = build(momentum_warmup=3, lr_final_ratio=0.5, lr_decay_steps=2)
  swept = build().run(seed=0, progress=False, hparams={
      "outer_momentum_warmup": 3, "outer_lr_final_ratio": 0.5,
      "outer_lr_decay_steps": 2})
  a = built.run(seed=0, progress=False).summary["final_eval_loss"]
  assert swept.summary["final_eval_loss"] == a
  plain = build().run(seed=0, progress=False).summary["final_eval_loss"]
  assert plain != a
  with pytest.raises(ValueError, match="outer_momentum_final"):
    build().run(seed=0, progress=False, hparams={"outer_momentum_final": 1.5})


@pytest.mark.parametrize("kwargs, field", [
    (dict(momentum_warmup=-1), "outer_momentum_warmup"),
    (dict(momentum_final=1.0), "outer_momentum_final"),
    (dict(lr_final_ratio=2.0), "outer_lr_final_ratio"),
    (dict(lr_warmpu=3), "outer_lr_warmpu"),
])
def test_bad_schedules_name_the_setting(kwargs, field):
  with pytest.raises(ValueError, match=field):
    strategies.outer_optimizer(0.7, 0.9, **kwargs)
