"""Tests for lowbw.models: the contract, each built-in, wrappers, validation."""

import functools
import json
import re
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw import ConfigError, models
from lowbw.models import _cnn
from lowbw.models import _gpt

W = 3


def _classification_batch(rng, b, feature_shape, num_classes=10):
  return {"x": rng.normal(size=(b, *feature_shape)).astype(np.float32),
          "y": rng.integers(0, num_classes, size=(b,)).astype(np.int32)}


def _lm_batch(rng, b, seq_len, vocab):
  return {"tokens": rng.integers(0, vocab, size=(b, seq_len + 1)).astype(
      np.int32)}


_SMALL_GPT = dict(layers=2, d_model=32, heads=4, seq_len=16, vocab=50)

# name -> (model factory, (rng, b) -> one worker's batch). Compiling init is
# the slow part on CPU (every parameter's threefry draw), so each case is built
# and compiled once per session by _setup and shared between tests.
CASES = {
    "mlp": (lambda: models.mlp(hidden=(16, 8), activation="gelu"),
            lambda rng, b: _classification_batch(rng, b, (8, 8))),
    "cnn_8x8": (lambda: models.cnn(channels=(4, 8), dense=16),
                lambda rng, b: _classification_batch(rng, b, (8, 8, 1))),
    "gpt": (lambda: models.gpt(**_SMALL_GPT),
            lambda rng, b: _lm_batch(rng, b, 16, 50)),
}


class _Setup(NamedTuple):
  model: models.Model
  make_batch: Callable
  init: Callable  # jitted model.init
  value_and_grad: Callable  # jitted value_and_grad of model.loss


@functools.cache
def _setup(case):
  make_model, make_batch = CASES[case]
  model = make_model()
  return _Setup(model, make_batch, jax.jit(model.init), jax.jit(
      jax.value_and_grad(model.loss, has_aux=True)))


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _slice(tree, w):
  return jax.tree.map(lambda x: x[w], tree)


def _assert_trees_close(a, b, **tols):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tols), a, b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_finite_with_finite_grads(case):
  setup = _setup(case)
  batch = setup.make_batch(np.random.default_rng(0), 4)
  params = setup.init(jax.random.key(0), batch)
  assert models.param_count(params) > 0

  (loss, metrics), grads = setup.value_and_grad(
      params, batch, jax.random.key(1))

  assert loss.shape == () and loss.dtype == jnp.float32
  assert np.isfinite(loss)
  assert set(metrics) == {"accuracy"} and metrics["accuracy"].shape == ()
  assert 0.0 <= metrics["accuracy"] <= 1.0
  assert jax.tree.structure(grads) == jax.tree.structure(params)
  for g in jax.tree.leaves(grads):
    assert np.all(np.isfinite(g))
  json.dumps(setup.model.config)
  assert setup.model.config["name"] == setup.model.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_vmap_over_workers_matches_loop(case):
  setup = _setup(case)
  rng = np.random.default_rng(1)
  batch_W = _stack([setup.make_batch(rng, 4) for _ in range(W)])
  keys_W = jax.random.split(jax.random.key(2), W)
  # Per-worker inits (the loop reference for params); vmap(init) itself is
  # checked once below, its compile being the costly part.
  params_W = _stack([setup.init(keys_W[w], _slice(batch_W, w))
                     for w in range(W)])

  (loss_W, metrics_W), grads_W = jax.jit(jax.vmap(
      jax.value_and_grad(setup.model.loss, has_aux=True)))(
          params_W, batch_W, keys_W)

  assert loss_W.shape == (W,) and metrics_W["accuracy"].shape == (W,)
  for w in range(W):
    (loss, metrics), grads = setup.value_and_grad(
        _slice(params_W, w), _slice(batch_W, w), keys_W[w])
    np.testing.assert_allclose(loss_W[w], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics_W["accuracy"][w], metrics["accuracy"])
    _assert_trees_close(_slice(grads_W, w), grads, rtol=1e-4, atol=1e-6)


def test_vmap_init_matches_loop():
  # Flax init is generic over modules, so one (cheap) model suffices.
  setup = _setup("mlp")
  rng = np.random.default_rng(2)
  batch_W = _stack([setup.make_batch(rng, 4) for _ in range(W)])
  keys_W = jax.random.split(jax.random.key(3), W)

  params_W = jax.jit(jax.vmap(setup.model.init))(keys_W, batch_W)

  for w in range(W):
    _assert_trees_close(_slice(params_W, w),
                        setup.init(keys_W[w], _slice(batch_W, w)), atol=1e-6)


def test_mlp_param_count():
  model = models.mlp(hidden=(16,), num_classes=3)
  batch = _classification_batch(np.random.default_rng(0), 2, (4, 5), 3)
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch)
  assert models.param_count(shapes) == (20 * 16 + 16) + (16 * 3 + 3)
  params = _setup("mlp").init(
      jax.random.key(0), _setup("mlp").make_batch(np.random.default_rng(0), 4))
  assert models.param_count(params) == (64 * 16 + 16) + (16 * 8 + 8) + (
      8 * 10 + 10)


# Shape logic only (eval_shape compiles nothing); the cnn_8x8 case runs the
# same ops for real.
@pytest.mark.parametrize(
    "shape", [(8, 8), (8, 8, 1), (28, 28), (28, 28, 1), (9, 7, 3)])
def test_cnn_logit_shapes(shape):
  model = models.cnn(channels=(4, 4, 4), dense=8, num_classes=7)
  batch = _classification_batch(np.random.default_rng(0), 2, shape, 7)
  module = _cnn.CNN(channels=(4, 4, 4), dense=8, num_classes=7)

  params = jax.eval_shape(model.init, jax.random.key(0), batch)
  logits = jax.eval_shape(module.apply, {"params": params}, batch["x"])
  loss, metrics = jax.eval_shape(model.loss, params, batch, jax.random.key(1))

  assert logits.shape == (2, 7)
  assert loss.shape == () and metrics["accuracy"].shape == ()


@functools.cache
def _gpt_apply():
  """Jitted ``_gpt.GPT.apply`` on the parameters of the "gpt" case."""
  setup = _setup("gpt")
  params = setup.init(jax.random.key(0),
                      setup.make_batch(np.random.default_rng(0), 4))
  module = _gpt.GPT(mlp_ratio=4, **_SMALL_GPT)
  return params, jax.jit(lambda p, t: module.apply({"params": p}, t))


def test_gpt_is_causal():
  params, apply = _gpt_apply()
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 50, size=(4, 16)).astype(np.int32)
  logits = apply(params, tokens)
  assert logits.shape == (4, 16, 50)

  for t in (0, 5, 14):
    changed = tokens.copy()
    shifts = rng.integers(1, 50, size=changed[:, t + 1:].shape)
    changed[:, t + 1:] = (changed[:, t + 1:] + shifts) % 50  # all differ
    new_logits = apply(params, changed)
    np.testing.assert_allclose(new_logits[:, :t + 1], logits[:, :t + 1],
                               rtol=1e-5, atol=1e-5)
    # ...and the change is visible downstream, so the check above has teeth.
    assert not np.allclose(new_logits[:, t + 1:], logits[:, t + 1:])


def test_gpt_loss_matches_manual_cross_entropy():
  params, apply = _gpt_apply()
  batch = _lm_batch(np.random.default_rng(3), 4, 16, 50)
  targets = batch["tokens"][:, 1:]
  logits = np.asarray(apply(params, batch["tokens"][:, :-1]))
  logp = jax.nn.log_softmax(logits, axis=-1)
  expected = -np.mean(np.take_along_axis(
      np.asarray(logp), targets[..., None], axis=-1))

  (loss, metrics), _ = _setup("gpt").value_and_grad(
      params, batch, jax.random.key(1))

  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(
      metrics["accuracy"], np.mean(np.argmax(logits, -1) == targets))


def test_gpt_accepts_sequences_shorter_than_seq_len():
  params, _ = _gpt_apply()
  short = _lm_batch(np.random.default_rng(0), 2, 8, 50)
  loss, _ = jax.jit(_setup("gpt").model.loss)(params, short, jax.random.key(1))
  assert np.isfinite(loss)


class _UserClassifier(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(jnp.tanh(nn.Dense(8)(x)))


class _UserLM(nn.Module):
  vocab: int = 11

  @nn.compact
  def __call__(self, tokens):
    return nn.Dense(self.vocab)(nn.Embed(self.vocab, 6)(tokens))


def _fixed_params(model, batch):
  """Deterministic non-zero params shaped like ``model.init``'s, without
  compiling the random initialisers (the costly part of a small test)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), batch)
  leaves, treedef = jax.tree.flatten(shapes)
  return jax.tree.unflatten(treedef, [
      np.sin(np.arange(l.size, dtype=np.float32) + i).reshape(l.shape)
      for i, l in enumerate(leaves)])


def test_from_flax_classification():
  model = models.from_flax(_UserClassifier())
  assert (model.name, model.task) == ("_UserClassifier", "classification")
  assert model.config == {"name": "_UserClassifier", "task": "classification"}
  batch = _classification_batch(np.random.default_rng(0), 4, (5,), 3)
  params = _fixed_params(model, batch)

  loss, metrics = jax.jit(model.loss)(params, batch, jax.random.key(1))

  logits = _UserClassifier().apply({"params": params}, batch["x"])
  expected = -np.mean(np.take_along_axis(
      np.asarray(jax.nn.log_softmax(logits)), batch["y"][:, None], axis=-1))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(
      metrics["accuracy"], np.mean(np.argmax(logits, -1) == batch["y"]))


def test_from_flax_lm():
  model = models.from_flax(_UserLM(), task="lm")
  assert model.config == {"name": "_UserLM", "task": "lm"}
  batch = _lm_batch(np.random.default_rng(0), 3, 7, 11)
  params = _fixed_params(model, batch)
  assert params["Embed_0"]["embedding"].shape == (11, 6)

  loss, metrics = jax.jit(model.loss)(params, batch, jax.random.key(1))

  logits = _UserLM().apply({"params": params}, batch["tokens"][:, :-1])
  assert logits.shape == (3, 7, 11)
  expected = -np.mean(np.take_along_axis(
      np.asarray(jax.nn.log_softmax(logits)),
      batch["tokens"][:, 1:, None], axis=-1))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert metrics["accuracy"].shape == ()


def test_from_flax_rejects_stateful_modules():
  class WithBatchNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(nn.BatchNorm(use_running_average=False)(x))

  model = models.from_flax(WithBatchNorm())
  batch = _classification_batch(np.random.default_rng(0), 4, (5,), 3)
  with pytest.raises(ValueError, match="model=.*batch_stats"):
    jax.eval_shape(model.init, jax.random.key(0), batch)


def test_as_model():
  model = models.mlp()
  assert models.as_model(model) is model
  assert models.as_model(_UserClassifier()).name == "_UserClassifier"

  def init(key, batch):
    return {"w": jax.random.normal(key, (batch["x"].shape[1],))}

  def loss(params, batch, key):
    del key
    err = batch["x"] @ params["w"] - batch["y"]
    return jnp.mean(err**2), {}

  custom = models.as_model((init, loss))
  assert (custom.task, custom.name, custom.config) == (
      "custom", "custom", {"name": "custom"})
  batch = {"x": np.ones((4, 3), np.float32), "y": np.zeros((4,), np.float32)}
  params = custom.init(jax.random.key(0), batch)
  value, _ = custom.loss(params, batch, jax.random.key(1))
  assert np.isfinite(value)
  assert models.as_model([init, loss]).init is init


def test_get_round_trips_config():
  for name in ("mlp", "cnn", "gpt"):
    model = models.get(name)
    assert model.name == name
    rebuilt = models.get(**model.config)
    assert rebuilt.config == model.config
  assert models.get("gpt", layers=1, d_model=16, heads=2).config["heads"] == 2


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: models.get("resnet"), "model='resnet'.*'mlp', 'cnn', 'gpt'"),
        (lambda: models.get("gpt", depth=3), "model.depth=3.*layers"),
        (lambda: models.gpt(d_model=30, heads=4), "heads=4.*d_model=30"),
        (lambda: models.gpt(layers=0), "layers=0"),
        (lambda: models.gpt(vocab=2.5), "vocab=2.5"),
        (lambda: models.mlp(activation="swish"), "activation='swish'"),
        (lambda: models.mlp(hidden=(8, 0)), r"hidden\[1\]=0"),
        (lambda: models.mlp(hidden=8), "hidden=8"),
        (lambda: models.cnn(channels=(-1,)), r"channels\[0\]=-1"),
        (lambda: models.cnn(dense=True), "dense=True"),
        (lambda: models.from_flax(_UserLM(), task="seq2seq"), "task='seq2seq'"),
        (lambda: models.from_flax(lambda x: x), "module="),
        (lambda: models.as_model("gpt"), "model='gpt'"),
        (lambda: models.as_model((len,)), "model="),
        (lambda: models.as_model(_UserClassifier), "model="),
    ],
)
def test_bad_config_raises(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def test_gpt_rejects_sequences_longer_than_seq_len():
  model = models.gpt(**_SMALL_GPT)
  batch = _lm_batch(np.random.default_rng(0), 2, 17, 50)
  with pytest.raises(ValueError, match="seq_len=16.*17"):
    model.init(jax.random.key(0), batch)
  with pytest.raises(ValueError, match="seq_len=16"):
    jax.jit(model.init)(jax.random.key(0), batch)


def test_gpt_rejects_out_of_range_tokens():
  model = models.gpt(**_SMALL_GPT)
  batch = {"tokens": np.full((2, 9), 50, np.int32)}
  with pytest.raises(ValueError, match="vocab=50"):
    model.init(jax.random.key(0), batch)


def test_bad_batches_raise():
  with pytest.raises(ValueError, match="batch="):
    models.mlp().init(jax.random.key(0), {"tokens": np.zeros((2, 3))})
  with pytest.raises(ValueError, match="tokens"):
    models.gpt(**_SMALL_GPT).init(jax.random.key(0),
                                  {"tokens": np.zeros((2, 1), np.int32)})
  with pytest.raises(ValueError, match="cnn expects images"):
    models.cnn().init(jax.random.key(0), _classification_batch(
        np.random.default_rng(0), 2, (4,)))


def _linear_loss(params, batch, key):
  del key
  return jnp.mean(batch["x"] @ params["w"]), {}


@pytest.mark.parametrize("init, loss, message", [
    (lambda k, b: {"w": jnp.zeros((3,)), "s": 1.0}, _linear_loss,
     "init returned parameter ['s'] as a Python float; every parameter must "
     "be a floating-point array (jnp.asarray(value, jnp.float32) makes one)"),
    (lambda k, b: {}, lambda p, b, k: (jnp.mean(b["x"]), {}),
     "init returned no parameters; expected at least one floating-point "
     "array to train"),
    (lambda k, b: {"w": jnp.zeros((3,))},
     lambda p, b, k: (_linear_loss(p, b, k)[0], {"acc": "x"}),
     "its metric 'acc' is a Python str; expected a numeric scalar"),
    (lambda k, b: {"w": jnp.zeros((3,), jnp.float16)}, _linear_loss,
     "init returned parameter ['w'] of dtype float16; float16 parameters are "
     "not supported"),
])
def test_check_contract_refuses_what_training_cannot_use(init, loss, message):
  batch = {"x": np.ones((4, 3), np.float32), "y": np.zeros((4,), np.int32)}
  with pytest.raises(ConfigError, match=re.escape(message)):
    models.check_contract(models.as_model((init, loss)), batch,
                          jax.random.key(0))


def test_check_contract_accepts_numpy_leaves_and_python_metrics():
  def loss(params, batch, key):
    return _linear_loss(params, batch, key)[0], {"one": 1.0}

  batch = {"x": np.ones((4, 3), np.float32), "y": np.zeros((4,), np.int32)}
  params, names = models.check_contract(models.as_model((
      lambda k, b: {"w": np.zeros(3, np.float32)}, loss)), batch,
      jax.random.key(0))
  assert params["w"].shape == (3,) and names == ["one"]
