"""Staleness-aware outer transforms (CGAD, arXiv 2605.09126) against plain
Python: the gate's formula, and Adam fed the gated pseudo-gradients one
outer step at a time, whole-model and per fragment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw.strategies import _stale

ALPHA, CUTOFF = 0.15, 6.0
LR, B1, B2, EPS = 0.02, 0.9, 0.99, 1e-3


def gate(tau, alpha=ALPHA, cutoff=CUTOFF):
  """sigma(tau) as the paper writes it: a cosine gate reaching 0 at the
  cutoff, times exp(-alpha tau)."""
  gamma = 1.0 if not cutoff else (
      0.5 * (1 + math.cos(math.pi * tau / cutoff)) if tau < cutoff else 0.0)
  return gamma * math.exp(-alpha * tau)


class Adam:
  """Adam in numpy (optax's form: eps outside the square root)."""

  def __init__(self, shape):
    self.m, self.v, self.t = np.zeros(shape), np.zeros(shape), 0

  def step(self, g):
    self.t += 1
    self.m = B1 * self.m + (1 - B1) * g
    self.v = B2 * self.v + (1 - B2) * g * g
    m_hat = self.m / (1 - B1 ** self.t)
    v_hat = self.v / (1 - B2 ** self.t)
    return -LR * m_hat / (np.sqrt(v_hat) + EPS)


@pytest.mark.parametrize("alpha, cutoff", [(ALPHA, CUTOFF), (0.3, 0.0),
                                           (0.0, 4.0), (0.0, 0.0)])
def test_the_gate_is_the_formula(alpha, cutoff):
  for tau in (0, 1, 2, 3.5, 5, 5.99, 6, 9, 30):
    assert float(_stale.cgad_scale(tau, alpha, cutoff)) == pytest.approx(
        gate(tau, alpha, cutoff), rel=1e-5, abs=1e-7)
  assert float(_stale.cgad_scale(0, alpha, cutoff)) == 1.0


def _stream(seed=0, steps=12):
  rng = np.random.default_rng(seed)
  ages = [0, 0, 1, 3, 2, 7, 0, 5, 6, 1, 4, 2][:steps]
  grads = [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
           for _ in ages]
  return grads, ages


def test_cgad_is_adam_on_the_gated_pseudo_gradients():
  grads, ages = _stream()
  tx = _stale.cgad(ALPHA, CUTOFF, LR, b1=B1, b2=B2, eps=EPS)
  update = jax.jit(tx.update)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state = tx.init(params)
  ref = {k: Adam(v.shape) for k, v in grads[0].items()}
  for g, tau in zip(grads, ages):
    got, state = update(jax.tree.map(jnp.float32, g), state, params,
                        age=float(tau))
    for k in g:
      want = ref[k].step(gate(tau) * g[k])
      np.testing.assert_allclose(got[k], want, rtol=2e-4, atol=1e-6)


def test_per_fragment_ages_gate_each_fragment_by_its_own():
  """PA-CGAD: an age per fragment (here per tensor), each fragment's Adam
  fed its own gated pseudo-gradient."""
  grads, ages = _stream(seed=1)
  tx = _stale.cgad(ALPHA, CUTOFF, LR, b1=B1, b2=B2, eps=EPS)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state = tx.init(params)
  ref = {k: Adam(v.shape) for k, v in grads[0].items()}
  for i, g in enumerate(grads):
    age = {"w": float(ages[i]), "b": float(ages[-1 - i])}
    got, state = tx.update(jax.tree.map(jnp.float32, g), state, params,
                           age=age)
    for k in g:
      np.testing.assert_allclose(got[k], ref[k].step(gate(age[k]) * g[k]),
                                 rtol=2e-4, atol=1e-6)


def test_no_gate_is_plain_adam_bit_for_bit():
  grads, ages = _stream(seed=2)
  gated = _stale.cgad(0.0, 0.0, LR, b1=B1, b2=B2, eps=EPS)
  plain = _stale._optim.outer_optimizer(LR, kind="adam", b1=B1, b2=B2,
                                        eps=EPS)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  s_gated, s_plain = gated.init(params), plain.init(params)
  for g, tau in zip(grads, ages):
    g = jax.tree.map(jnp.float32, g)
    a, s_gated = gated.update(g, s_gated, params, age=float(tau))
    b, s_plain = plain.update(g, s_plain, params)
    for k in g:
      np.testing.assert_array_equal(a[k], b[k])


def test_past_the_cutoff_a_pseudo_gradient_does_not_move_the_moments():
  tx = _stale.scale_by_age(ALPHA, CUTOFF)
  g = {"w": jnp.ones(3)}
  out, _ = tx.update(g, tx.init(g), age=CUTOFF + 1)
  np.testing.assert_array_equal(out["w"], np.zeros(3))
  fresh, _ = tx.update(g, tx.init(g))   # no age: fresh, unchanged
  np.testing.assert_array_equal(fresh["w"], np.ones(3))


@pytest.mark.parametrize("kwargs, field", [
    (dict(alpha=-0.1, cutoff=4.0), "alpha"),
    (dict(alpha=0.1, cutoff=-1.0), "cutoff"),
    (dict(alpha=0.1, cutoff=float("inf")), "cutoff"),
])
def test_bad_settings_name_the_setting(kwargs, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    _stale.cgad(**kwargs)
  with pytest.raises(ValueError, match=f"^{field}="):
    _stale.scale_by_age(**kwargs)


def test_the_transform_composes_with_optax_chain():
  tx = optax.chain(_stale.scale_by_age(ALPHA, CUTOFF), optax.sgd(1.0))
  out, _ = tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}),
                     age=2.0)
  np.testing.assert_allclose(out["w"], -gate(2.0) * np.ones(2), rtol=1e-6)
