"""models.moe_gpt: routing against a per-token Python reference, the
one-expert case against a dense SwiGLU MLP, the router losses, and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw import models
from lowbw.models import _moe_gpt


def _moe(E, k, d=8, f=16, n=12, seed=0):
  layer = _moe_gpt.MoE(E, k, f, 0.02)
  x = jax.random.normal(jax.random.key(seed), (1, n, d))
  params = layer.init(jax.random.key(seed + 1), x)["params"]
  # Larger router weights than the init's so that routing is decisive.
  params["router"]["kernel"] = params["router"]["kernel"] * 50
  y, stats = layer.apply({"params": params}, x)
  return params, np.asarray(x[0], np.float64), np.asarray(y[0]), stats


def _swiglu(x, w_gate, w_up, w_down):
  g = x @ w_gate
  return ((g / (1 + np.exp(-g))) * (x @ w_up)) @ w_down


def _expert(params, e):
  ex = params["experts"]
  return [np.asarray(ex[n][e], np.float64) for n in ("w_gate", "w_up",
                                                     "w_down")]


def test_one_expert_top_one_is_the_dense_swiglu_mlp():
  params, x, y, stats = _moe(E=1, k=1)
  np.testing.assert_allclose(y, _swiglu(x, *_expert(params, 0)), rtol=1e-5,
                             atol=1e-6)
  assert float(stats["balance"]) == pytest.approx(1.0)


@pytest.mark.parametrize("E,k", [(4, 2), (6, 3), (4, 1)])
def test_routing_against_a_per_token_reference(E, k):
  params, x, y, _ = _moe(E, k)
  router = np.asarray(params["router"]["kernel"], np.float64)
  for n, token in enumerate(x):
    logits = token @ router
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    chosen = np.argsort(-probs)[:k]
    want = sum(probs[e] * _swiglu(token, *_expert(params, e))
               for e in chosen)
    np.testing.assert_allclose(y[n], want, rtol=1e-4, atol=1e-6)


def _stats(logits, k):
  logits = jnp.asarray(logits, jnp.float32)
  combine, probs, chosen = _moe_gpt.route(logits, k, False)
  return _moe_gpt.router_losses(logits, probs, chosen, k)


def test_the_balance_loss_is_smallest_for_uniform_routing():
  E, n = 4, 64
  rng = np.random.default_rng(0)

  def decisive(experts_NxK):  # logits that pick exactly these experts
    return 12.0 * jax.nn.one_hot(experts_NxK, E).sum(1)

  for k in (1, 2):
    uniform = decisive((np.arange(n)[:, None] + np.arange(k)) % E)
    best = float(_stats(uniform, k)["balance"])
    assert best == pytest.approx(1.0, abs=1e-3)
    skewed = decisive(np.tile(np.arange(k), (n, 1)))
    assert float(_stats(skewed, k)["balance"]) > 1.5
    for _ in range(20):
      random = decisive(np.stack([rng.permutation(E)[:k] for _ in range(n)]))
      assert float(_stats(random, k)["balance"]) >= best - 1e-3
    share = np.asarray(_stats(uniform, k)["share"])
    np.testing.assert_allclose(share, 1 / E)


def test_router_z_loss_is_the_mean_squared_logsumexp():
  logits = np.random.default_rng(1).normal(size=(10, 4))
  want = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
  assert float(_stats(logits, 2)["z"]) == pytest.approx(want, rel=1e-5)


def test_loss_is_cross_entropy_plus_weighted_router_terms():
  model = models.moe_gpt(layers=2, d_model=16, heads=2, seq_len=8,
                         num_experts=4, top_k=2, expert_hidden=8)
  batch = {"tokens": np.random.default_rng(0).integers(0, 256, (3, 9))}
  params = model.init(jax.random.key(0), batch)
  assert params["block_0"]["moe"]["experts"]["w_gate"].shape == (4, 16, 8)
  loss, m = model.loss(params, batch, None)
  want = (m["cross_entropy"] + 0.01 * m["moe_balance_loss"] +
          0.001 * m["moe_z_loss"] + 1e-5 * m["output_z_loss"])
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  shares = [float(m[f"moe_expert_share_{e}"]) for e in range(4)]
  assert sum(shares) == pytest.approx(1.0, abs=1e-5)
  plain = models.moe_gpt(layers=2, d_model=16, heads=2, seq_len=8,
                         num_experts=4, top_k=2, expert_hidden=8,
                         balance_coef=0, router_z_coef=0, output_z_coef=0)
  assert float(plain.loss(params, batch, None)[0]) == pytest.approx(
      float(m["cross_entropy"]), rel=1e-6)


def test_registry_builds_it():
  model = models.get("moe_gpt", num_experts=4, top_k=1)
  assert model.config["num_experts"] == 4 and model.task == "lm"


@pytest.mark.parametrize("kw,field", [
    ({"top_k": 5, "num_experts": 4}, "top_k"),
    ({"heads": 3}, "heads"),
    ({"d_model": 12, "heads": 4}, "heads"),   # head width 3: odd, no RoPE
    ({"num_experts": 0}, "num_experts"),
    ({"balance_coef": -1.0}, "balance_coef"),
])
def test_errors_name_the_field(kw, field):
  with pytest.raises(ValueError, match=field):
    models.moe_gpt(**kw)
