"""Autocast in micro-batches: the parameters are cast to bfloat16 once per
step, outside the micro-batch scan, and each micro-batch's gradient (taken
with respect to that cast copy) is widened to float32 before it is summed.
Checked against the old form, written out here: the cast inside every
micro-batch's loss, the gradient taken with respect to the float32
parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw import data, models
from lowbw.simulation._backward import Backward
from lowbw.simulation._grouping import loss_and_grads, replica_grads

KEY = jax.random.PRNGKey(0)
MICRO = 4


def _low(tree):
  return jax.tree.map(lambda x: x.astype(jnp.bfloat16)
                      if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _cast_per_micro_batch(model, params, batch, key, micro=MICRO):
  """The reference: a python loop over the micro-batches, each casting the
  float32 parameters inside its loss; the float32 gradients summed in
  order, then divided by ``micro``."""
  def loss(p, b, k):
    value, metrics = model.loss(_low(p), _low(b), k)
    return value.astype(jnp.float32), metrics

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
  size = jax.tree.leaves(batch)[0].shape[0] // micro
  total_loss, total = 0.0, None
  for i in range(micro):
    part = jax.tree.map(lambda x: x[i * size:(i + 1) * size], batch)
    (value, _), g = grad(params, part, jax.random.fold_in(key, i))
    total_loss = total_loss + value
    total = g if total is None else jax.tree.map(jnp.add, total, g)
  return total_loss / micro, jax.tree.map(lambda x: x / micro, total)


def _cases():
  gpt = models.gpt(layers=1, d_model=32, heads=2, seq_len=16)
  text = {"tokens": jax.random.randint(KEY, (8, 17), 0, 256)}
  mlp = models.mlp(hidden=(16,))
  digits = data.digits().example_batch(8)
  return {"gpt": (gpt, text), "mlp": (mlp, digits)}


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_cast_once_gives_the_per_micro_batch_casts_gradient(name):
  model, batch = CASES[name]
  params = model.init(KEY, batch)
  grads = jax.jit(loss_and_grads(model, Backward(MICRO, jnp.bfloat16)))
  loss, _, g = grads(params, batch, KEY)
  ref_loss, ref = _cast_per_micro_batch(model, params, batch, KEY)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(g))
  for got, want in zip(jax.tree.leaves(g), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  np.testing.assert_array_equal(np.asarray(loss), np.asarray(ref_loss))
  # It is bfloat16 arithmetic: the float32 gradient differs.
  full = jax.jit(loss_and_grads(model, Backward(MICRO)))(params, batch, KEY)
  assert any(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(full[2]), jax.tree.leaves(g)))


def test_one_replica_over_workers_matches_the_reference():
  # replica_grads splits every worker's batch (axis 1) into micro-batches.
  model, batch = CASES["mlp"]
  params = model.init(KEY, batch)
  batch_W = jax.tree.map(lambda x: x.reshape((2, 4) + x.shape[1:]), batch)
  keys_W = jax.random.split(KEY, 2)
  fn = jax.jit(replica_grads(model, Backward(2, jnp.bfloat16)))
  _, _, g = fn(params, batch_W, keys_W)
  # Micro-batch i holds rows i*2..i*2+1 of each worker's 4: the reference
  # reorders the batch so that its plain split picks the same rows.
  order = jax.tree.map(
      lambda x: jnp.concatenate([x[:, :2].reshape((-1,) + x.shape[2:]),
                                 x[:, 2:].reshape((-1,) + x.shape[2:])]),
      batch_W)
  ref = _reference_mean_of_workers(model, params, order, keys_W)
  for got, want in zip(jax.tree.leaves(g), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _reference_mean_of_workers(model, params, order, keys_W):
  """The old form of ``replica_grads`` for a model that is not pooled:
  the mean of the workers' losses, differentiated with respect to the
  float32 parameters, cast inside each of the 2 micro-batches."""
  def loss(p, b, k):
    b_W = jax.tree.map(lambda x: x.reshape((2, -1) + x.shape[1:]), b)
    values, _ = jax.vmap(lambda bb, kk: model.loss(_low(p), _low(bb), kk))(
        b_W, k)
    return jnp.mean(values.astype(jnp.float32))

  grad = jax.jit(jax.grad(loss))
  total = None
  for i in range(2):
    part = jax.tree.map(lambda x: x[i * 4:(i + 1) * 4], order)
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys_W, i)
    g = grad(params, part, keys)
    total = g if total is None else jax.tree.map(jnp.add, total, g)
  return jax.tree.map(lambda x: x / 2, total)



def _param_casts(jaxpr, shapes) -> int:
  """float32 -> bfloat16 conversions of arrays of the parameters' shapes
  in ``jaxpr`` and the jaxprs it calls."""
  count = 0
  for eqn in jaxpr.eqns:
    if (eqn.primitive.name == "convert_element_type"
        and eqn.params["new_dtype"] == jnp.bfloat16
        and eqn.invars[0].aval.dtype == jnp.float32
        and tuple(eqn.invars[0].aval.shape) in shapes):
      count += 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          count += _param_casts(getattr(inner, "jaxpr", inner), shapes)
  return count


def test_the_weights_are_cast_outside_the_micro_batch_scan():
  model, batch = CASES["gpt"]
  params = model.init(KEY, batch)
  shapes = {tuple(x.shape) for x in jax.tree.leaves(params) if x.ndim == 2}
  grads = loss_and_grads(model, Backward(MICRO, jnp.bfloat16))
  jaxpr = jax.make_jaxpr(grads)(params, batch, KEY).jaxpr
  scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
  assert len(scans) == 1
  body = scans[0].params["jaxpr"].jaxpr
  outside = _param_casts(jaxpr, shapes) - _param_casts(body, shapes)
  assert _param_casts(body, shapes) == 0
  assert outside >= len(shapes)


def test_a_run_gives_the_bits_of_the_cast_in_every_micro_batch(monkeypatch):
  # The whole run (DiLoCo's inner steps, the sync) with autocast and two
  # micro-batches, against the same run with the cast moved back into every
  # micro-batch's loss (the form this replaced).
  import optax
  import lowbw
  from lowbw import strategies

  def run():
    return lowbw.simulate(
        models.mlp(hidden=(8,)), data.digits(),
        strategies.diloco(optax.sgd(0.1), H=2), workers=2, batch_size=4,
        steps=4, minibatch_size=2, autocast="bfloat16", progress=False)

  def old_on_cast(self, grad_fn, params):
    return lambda batch, key: grad_fn(params, batch, key)

  new = run()
  monkeypatch.setattr(Backward, "_on_cast", old_on_cast)
  old = run()
  np.testing.assert_array_equal(new.history["train_loss"],
                                old.history["train_loss"])
  for a, b in zip(jax.tree.leaves(new.state), jax.tree.leaves(old.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
