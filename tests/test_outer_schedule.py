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


def _diloco_by_hand(params, batches, lr, momentum, restart):
  """DiLoCo with outer Nesterov SGD in numpy, the momentum buffer zeroed
  before outer steps R, 2R, ... (outer-momentum restarts; R = 0: never)."""
  theta = jax.tree.map(np.asarray, params)
  trace = jax.tree.map(np.zeros_like, theta)
  workers = [dict(theta) for _ in range(W)]
  for t in range(1, STEPS + 1):
    batch = jax.tree.map(lambda b: b[t - 1], batches)
    for w in range(W):
      g = jax.grad(loss_fn)(jax.tree.map(jnp.asarray, workers[w]),
                            jax.tree.map(lambda b: b[w], batch))
      workers[w] = {k: workers[w][k] - 0.1 * np.asarray(g[k]) for k in g}
    if t % H:
      continue
    if restart and (t // H - 1) % restart == 0:
      trace = jax.tree.map(np.zeros_like, trace)
    for k in theta:
      delta = sum(theta[k] - x[k] for x in workers) / W
      trace[k] = delta + momentum * trace[k]
      theta[k] = theta[k] - lr * (delta + momentum * trace[k])
    workers = [dict(theta) for _ in range(W)]
  return theta


def _diloco(params, batches, outer):
  strategy = strategies.diloco(optax.sgd(0.1), outer, H=H)
  state = strategy.init(params, W, jax.random.key(0))
  step = jax.jit(strategy.step)
  grads = jax.jit(jax.vmap(jax.grad(loss_fn)))
  for t in range(STEPS):
    state, _ = step(state, grads(state.params_W,
                                 jax.tree.map(lambda b: b[t], batches)))
  return state


@pytest.mark.parametrize("restart", [1, 3, 4])
def test_momentum_restarts_match_a_loop_that_zeroes_the_buffer(restart):
  params, batches = problem(STEPS, W)
  state = _diloco(params, batches, strategies.outer_optimizer(
      0.7, 0.9, momentum_restart=restart))
  want = _diloco_by_hand(params, batches, 0.7, 0.9, restart)
  for k in want:
    np.testing.assert_allclose(state.comm.global_params[k], want[k],
                               atol=2e-5)
  # ... and differ from the run that never restarts (the loop agrees).
  never = _diloco_by_hand(params, batches, 0.7, 0.9, 0)
  assert max(np.abs(never[k] - want[k]).max() for k in want) > 1e-3


def test_restart_every_step_is_plain_sgd_and_never_is_unchanged():
  params, batches = problem(STEPS, W)
  # R = 1: the buffer holds only this step's pseudo-gradient, so the
  # Nesterov step is lr (1 + momentum) delta: plain SGD at that rate.
  every = _diloco(params, batches, strategies.outer_optimizer(
      0.7, 0.9, momentum_restart=1)).comm.global_params
  sgd = _diloco(params, batches, strategies.outer_optimizer(
      0.7 * 1.9, 0.0)).comm.global_params
  for k in sgd:
    np.testing.assert_allclose(every[k], sgd[k], rtol=1e-5, atol=1e-6)
  # R = 0 (never), given or not, is the optimizer without restarts, bit for
  # bit.
  plain = optax.inject_hyperparams(optax.sgd)(0.7, momentum=0.9,
                                              nesterov=True)
  runs = [_diloco(params, batches, outer).comm.global_params for outer in (
      plain, strategies.outer_optimizer(0.7, 0.9, momentum_restart=0))]
  for k in runs[0]:
    np.testing.assert_array_equal(runs[0][k], runs[1][k])


def test_restarts_are_traced_a_sweep_equals_a_build():
  def build(**schedule):
    return lowbw.build(
        model=models.mlp(hidden=(8,), num_classes=10), data=data.digits(),
        strategy=strategies.diloco(
            H=2, outer=strategies.outer_optimizer(0.7, 0.9, **schedule)),
        workers=2, batch_size=4, steps=8, eval_every=8)
  # A build with restarts has the period as a state leaf: a sweep moves
  # it, 0 included (never), without a new build.
  restarting = build(momentum_restart=3)
  runs = {r: restarting.run(seed=0, progress=False, hparams={
      "outer_momentum_restart": r}).summary["final_eval_loss"]
          for r in (2, 0)}
  assert runs[2] == build(momentum_restart=2).run(
      seed=0, progress=False).summary["final_eval_loss"]
  plain = build()
  assert runs[0] == plain.run(seed=0, progress=False).summary[
      "final_eval_loss"] != runs[2]
  with pytest.raises(ValueError, match="outer_momentum_restart"):
    restarting.run(seed=0, progress=False,
                   hparams={"outer_momentum_restart": 1.5})
  # Without restarts the state has no such leaf (it stays as it was).
  with pytest.raises(ValueError, match="outer_momentum_restart=2 is invalid: "
                     "strategy 'diloco': it was built without outer momentum "
                     "restarts.*build it with outer_momentum_restart > 0"):
    plain.run(seed=0, progress=False, hparams={"outer_momentum_restart": 2})


@pytest.mark.parametrize("kwargs, words", [
    (dict(momentum_restart=-1), ">= 0"),
    (dict(momentum_restart=2.5), "whole number"),
    (dict(momentum_restart=2, kind="adam", momentum=None), "has none"),
])
def test_bad_restarts_name_the_setting(kwargs, words):
  with pytest.raises(ValueError, match="outer_momentum_restart") as e:
    strategies.outer_optimizer(0.7, kwargs.pop("momentum", 0.9), **kwargs)
  assert words in str(e.value)


def test_a_restart_without_momentum_is_refused():
  outer = strategies.outer_optimizer(0.7, 0.0, momentum_restart=2)
  with pytest.raises(ValueError, match="outer_momentum_restart=2.0 is "
                     "invalid: restarts the outer momentum"):
    outer.init(jnp.zeros(2))
