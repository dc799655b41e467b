"""Models written for Flax NNX and Equinox train as lowbw workers without
edits: each wrapped model trains under DiLoCo as the same network written
as plain functions (``from_apply``, the reference here) does, from the API
and from a config file; its parameters, FLOPs and errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

import lowbw
from lowbw import models
from lowbw.models import _registry

HIDDEN, CLASSES = 8, 10
RUN = dict(data="digits", strategy="diloco", H=3, workers=2, steps=6,
           batch_size=4, eval_examples=32, eval_every=6, devices=1,
           progress=False)


class NnxNet(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(64, HIDDEN, rngs=rngs)
    self.out = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    return self.out(jax.nn.relu(self.hidden(x)))


def _nnx_reference(net):
  """The same network as plain functions of a dict of its arrays."""
  start = {"hidden": {"kernel": net.hidden.kernel[...],
                      "bias": net.hidden.bias[...]},
           "out": {"kernel": net.out.kernel[...], "bias": net.out.bias[...]}}

  def apply(p, x):
    x = x.reshape(x.shape[0], -1)
    h = jax.nn.relu(x @ p["hidden"]["kernel"] + p["hidden"]["bias"][None])
    return h @ p["out"]["kernel"] + p["out"]["bias"][None]

  return models.from_apply(lambda key, x: start, apply)


def _eqx_reference(mlp):
  """An Equinox MLP's layers as plain functions (weights are (out, in))."""
  start = [(layer.weight, layer.bias) for layer in mlp.mlp.layers]

  def apply(p, x):
    x = x.reshape(x.shape[0], -1)
    for i, (w, b) in enumerate(p):
      x = x @ w.T + b[None]
      x = jax.nn.relu(x) if i < len(p) - 1 else x
    return x

  return models.from_apply(lambda key, x: start, apply)


class EqxNet(eqx.Module):
  """Equinox's MLP on one flattened digit."""
  mlp: eqx.nn.MLP

  def __call__(self, x):
    return self.mlp(x.reshape(-1))


def _eqx():
  return EqxNet(eqx.nn.MLP(64, CLASSES, HIDDEN, 1, key=jax.random.key(3)))


@pytest.mark.parametrize("library", ["nnx", "equinox"])
def test_a_wrapped_model_trains_as_its_plain_function_reference(library):
  if library == "nnx":
    net = NnxNet(nnx.Rngs(7))
    wrapped, reference = models.from_nnx(net), _nnx_reference(net)
  else:
    wrapped, reference = models.from_equinox(_eqx()), _eqx_reference(_eqx())
  got = lowbw.simulate(lowbw.Config(model=wrapped, **RUN))
  want = lowbw.simulate(lowbw.Config(model=reference, **RUN))
  for key in ("train_loss", "eval_loss"):
    np.testing.assert_allclose(got.history[key], want.history[key],
                               rtol=1e-5)
  assert got.history["train_loss"][-1] < got.history["train_loss"][0]
  # The parameters are the model's own arrays, every worker starting from
  # the values the module was built with.
  n = 64 * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES
  assert models.param_count(got.params) == n
  # ``model=`` takes the object itself.
  obj = net if library == "nnx" else _eqx()
  assert models.as_model(obj).config["library"] == (
      "flax.nnx" if library == "nnx" else "equinox")


@pytest.fixture
def nnx_registered():
  """``test_nnx_net`` registered for one test (a name left registered
  turns the executable store off for the rest of the process)."""
  models.register("test_nnx_net", lambda: models.from_nnx(
      NnxNet(nnx.Rngs(7))))
  yield
  del _registry._FACTORIES["test_nnx_net"]


def test_a_registered_nnx_model_runs_from_a_config_file(tmp_path,
                                                        nnx_registered):
  settings = dict(RUN, model="test_nnx_net")
  del settings["progress"]
  path = tmp_path / "run.yaml"
  path.write_text(yaml.safe_dump(settings))
  from_file = lowbw.simulate(lowbw.Config.load(str(path), progress=False))
  from_api = lowbw.simulate(lowbw.Config(
      model=models.from_nnx(NnxNet(nnx.Rngs(7))), **RUN))
  for a, b in zip(jax.tree.leaves(from_file.params),
                  jax.tree.leaves(from_api.params)):
    np.testing.assert_array_equal(a, b)


def test_a_custom_loss_and_flops_reach_the_model():
  net = NnxNet(nnx.Rngs(0))
  batch = {"x": np.ones((4, 8, 8, 1), np.float32), "y": np.arange(4)}

  def squared(forward, batch):
    logits = forward(batch["x"])
    return jnp.mean(logits ** 2), {"scale": jnp.max(jnp.abs(logits))}

  model = models.from_nnx(net, loss=squared, flops_per_token=1234.0)
  params = model.init(jax.random.key(0), batch)
  value, metrics = model.loss(params, batch, None)
  logits = net(jnp.asarray(batch["x"]))
  np.testing.assert_allclose(value, jnp.mean(logits ** 2), rtol=1e-6)
  assert set(metrics) == {"scale"}
  assert models.flops_per_token(model, 10, None) == 1234.0
  assert models.flops_per_token(models.from_nnx(net), 10, None) == 60.0


class WithBatchNorm(nnx.Module):
  def __init__(self, rngs):
    self.dense = nnx.Linear(64, 4, rngs=rngs)
    self.norm = nnx.BatchNorm(4, rngs=rngs)

  def __call__(self, x):
    return self.norm(self.dense(x))


@pytest.mark.parametrize("call, field, allowed", [
    (lambda: models.from_nnx(WithBatchNorm(nnx.Rngs(0))), "module",
     "nnx.Param only; it has .*BatchStat"),
    (lambda: models.from_nnx(_eqx()), "module", "a flax.nnx.Module"),
    (lambda: models.from_equinox(NnxNet(nnx.Rngs(0))), "model",
     "an equinox.Module"),
    (lambda: models.from_nnx(NnxNet(nnx.Rngs(0)), loss=3), "loss",
     "a function"),
    (lambda: models.from_equinox(_eqx(), task="regression"), "task",
     "classification"),
    (lambda: models.from_apply(None, lambda p, x: x), "init", "a function"),
    (lambda: models.from_nnx(NnxNet(nnx.Rngs(0)), flops_per_token=-1),
     "flops_per_token", ""),
])
def test_wrappers_name_the_bad_field(call, field, allowed):
  with pytest.raises(ValueError, match=f"^{field}=.*{allowed}"):
    call()
