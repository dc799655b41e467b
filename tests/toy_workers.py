"""A toy problem for strategy equivalence tests: W workers pulled towards
their own targets on a convex, nonlinear loss, stepped through
``Strategy.step`` under one jit (the per-worker reference loops live in the
tests)."""

import jax
import jax.numpy as jnp


def targets(params, num_workers: int) -> list:
  """Worker w's target: every entry (w + 1) * 0.3 - 0.2."""
  return [jax.tree.map(lambda x, w=w: x * 0 + (w + 1) * 0.3 - 0.2, params)
          for w in range(num_workers)]


def loss(params, target):
  # Convex and nonlinear (quartic): workers drift apart, nothing diverges.
  return sum(jnp.sum(jnp.square(p - t) + 0.2 * jnp.square(jnp.square(p)))
             for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(target)))


def run(strategy, params, targets_, steps: int):
  """``steps`` calls of one jitted ``strategy.step``: (final state, reports).
  Asserts one compiled program served every step."""
  state = strategy.init(params, len(targets_), jax.random.PRNGKey(0))
  targets_W = jax.tree.map(lambda *t: jnp.stack(t), *targets_)
  step = jax.jit(lambda s: strategy.step(
      s, jax.vmap(jax.grad(loss))(s.params_W, targets_W)))
  reports = []
  for _ in range(steps):
    state, report = step(state)
    reports.append(report)
  assert step._cache_size() == 1  # every offset, one program
  return state, reports
