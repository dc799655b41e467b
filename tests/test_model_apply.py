"""``Model.apply`` of every built-in: logits of the right shape whose
cross-entropy, computed here with a plain log-softmax, is the model's loss."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw import models


def _classification(feature_shape, classes):
  def batch(rng, b):
    return {"x": rng.normal(size=(b, *feature_shape)).astype(np.float32),
            "y": rng.integers(0, classes, size=(b,)).astype(np.int32)}
  return batch


def _lm(seq_len, vocab):
  def batch(rng, b):
    return {"tokens": rng.integers(0, vocab, size=(b, seq_len + 1)).astype(
        np.int32)}
  return batch


class _UserLM(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(11)(nn.Embed(11, 6)(tokens))


# name -> (model, example batch maker, logits' trailing shape)
CASES = {
    "mlp": (lambda: models.mlp(hidden=(16,), num_classes=7),
            _classification((5, 3), 7), (7,)),
    "cnn": (lambda: models.cnn(channels=(4,), dense=8, num_classes=5),
            _classification((8, 8), 5), (5,)),
    "gpt": (lambda: models.gpt(layers=1, d_model=16, heads=2, seq_len=8,
                               vocab=40),
            _lm(8, 40), (8, 40)),
    "moe_gpt": (lambda: models.moe_gpt(layers=1, d_model=16, heads=2,
                                       seq_len=8, vocab=40, num_experts=2,
                                       top_k=1, expert_hidden=8,
                                       balance_coef=0, router_z_coef=0,
                                       output_z_coef=0),
                _lm(8, 40), (8, 40)),
    "from_flax": (lambda: models.from_flax(_UserLM(), task="lm"),
                  _lm(6, 11), (6, 11)),
}


def _params(model, batch):
  """Random parameters shaped like ``model.init``'s, without compiling its
  initialisers (the costly part of a small test on CPU)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch)
  rng = np.random.default_rng(1)
  return jax.tree.map(
      lambda s: (0.3 * rng.normal(size=s.shape)).astype(s.dtype), shapes)


def _cross_entropy(logits, labels):
  logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32)))
  return -np.mean(np.take_along_axis(logp, labels[..., None], axis=-1))


@pytest.mark.parametrize("case", sorted(CASES))
def test_apply_logits_score_to_the_loss(case):
  make_model, make_batch, trailing = CASES[case]
  model = make_model()
  batch = make_batch(np.random.default_rng(0), 3)
  params = _params(model, batch)
  if model.task == "lm":
    inputs, labels = batch["tokens"][:, :-1], batch["tokens"][:, 1:]
  else:
    inputs, labels = batch["x"], batch["y"]

  logits = jax.jit(model.apply)(params, inputs)
  loss, metrics = jax.jit(model.loss)(params, batch, jax.random.key(1))

  assert logits.shape == (3, *trailing)
  assert jnp.issubdtype(logits.dtype, jnp.floating)
  np.testing.assert_allclose(loss, _cross_entropy(logits, labels), rtol=2e-6)
  np.testing.assert_allclose(
      metrics["accuracy"], np.mean(np.argmax(logits, -1) == labels))


def test_lm_apply_takes_shorter_sequences():
  model = models.gpt(layers=1, d_model=16, heads=2, seq_len=8, vocab=40)
  batch = _lm(8, 40)(np.random.default_rng(0), 2)
  params = _params(model, batch)
  logits = jax.eval_shape(model.apply, params, batch["tokens"][:, :5])
  assert logits.shape == (2, 5, 40)


def test_apply_survives_rebuilding_the_model():
  model = models.gpt(layers=1, d_model=16, heads=2, seq_len=8, vocab=40)
  assert models.as_model(model).apply is model.apply
  assert model._replace(name="other").apply is model.apply
  assert models.get(**model.config).apply is not None
  # The five-field construction of before still builds a Model.
  custom = models.Model(model.init, model.loss, "lm", "custom", {})
  assert custom.apply is None
  assert models.as_model((model.init, model.loss)).apply is None
