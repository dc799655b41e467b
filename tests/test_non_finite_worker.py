"""A non-finite value is named where it started: the first worker whose own
loss or own gradient (before any reduction over workers) was non-finite,
not the worker that happens to come first once an all-reduce has spread it
to every worker."""

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import data, strategies

W, B, DIM, CLASSES = 4, 8, 6, 3
BAD_WORKER, BAD_STEP = 1, 3   # worker 1's own gradient is NaN at step 3


@jax.custom_vjp
def poisoned(logits, bad):
  """``logits``, whose gradient is NaN for the examples flagged ``bad``."""
  del bad
  return logits


def _poisoned_fwd(logits, bad):
  return logits, bad


def _poisoned_bwd(bad, g):
  return jnp.where(bad[:, None], jnp.nan, g), None


poisoned.defvjp(_poisoned_fwd, _poisoned_bwd)


def init(key, batch):
  del batch
  return {"w": 0.1 * jax.random.normal(key, (DIM, CLASSES)),
          "t": jnp.zeros(())}


def loss(params, batch, key):
  """Cross-entropy plus ``-t``: under SGD at a rate of 1 the gradient of
  ``t`` is -1 on every worker, so ``t`` counts the steps taken (0 at step
  1). Examples whose last feature is 1 (worker 1's shard only) poison the
  gradient from step ``BAD_STEP`` on; every loss stays finite."""
  del key
  x, y = batch["x"], batch["y"]
  marked = x[:, -1] > 0.5
  bad = marked & (jax.lax.stop_gradient(params["t"]) >= BAD_STEP - 1)
  logits = poisoned(x @ params["w"], bad)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return ce - params["t"], {}


MODEL = lowbw.models.as_model((init, loss))


def arrays(n=W * 32):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, DIM)).astype(np.float32)
  x[:, -1] = 0.0
  x[32 * BAD_WORKER:32 * (BAD_WORKER + 1), -1] = 1.0   # contiguous shards
  return x, (x[:, 0] > 0).astype(np.int32)


SOURCE = data.arrays(*arrays(), eval=arrays(24), sharding="contiguous")


def test_the_reference_loop_finds_worker_1_at_step_3():
  # A plain per-worker loop: each worker's own gradient at the parameters
  # of step BAD_STEP (t = BAD_STEP - 1) on its whole shard.
  x, y = arrays()
  params = init(jax.random.key(0), None)
  params["t"] = jnp.float32(BAD_STEP - 1)
  own = []
  for w in range(W):
    rows = slice(32 * w, 32 * (w + 1))
    value, g = jax.value_and_grad(lambda p: loss(
        p, {"x": x[rows], "y": y[rows]}, None)[0])(params)
    assert np.isfinite(value)
    own.append(all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(g)))
  assert own.index(False) == BAD_WORKER and own.count(False) == 1
  params["t"] = jnp.float32(BAD_STEP - 2)
  g = jax.grad(lambda p: loss(p, {"x": x[32:64], "y": y[32:64]},
                               None)[0])(params)
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(g))


def run(strategy, **kw):
  kw.setdefault("progress", False)
  return lowbw.simulate(model=MODEL, data=SOURCE, strategy=strategy,
                        workers=W, batch_size=B, steps=12, log_every=1,
                        devices=1, **kw)


SGD = optax.sgd(1.0)
GRADIENT = ("gradient", BAD_STEP)
CASES = {
    # One replica (DDP without a codec): the gradient of the mean loss; the
    # workers' own are computed only once it is non-finite.
    "ddp_one_replica": (strategies.ddp(SGD), {}, GRADIENT),
    # Every worker's own gradient, then the all-reduce; one step a chunk,
    # so the NaN loss comes a chunk after the gradient.
    "ddp_per_worker": (strategies.ddp(SGD)._replace(replicated=False),
                       dict(rounds_per_chunk=1), GRADIENT),
    # The bad step is a round's last: its sync spreads worker 1's model.
    "diloco_sync_step": (strategies.diloco(SGD, optax.sgd(1.0), H=BAD_STEP),
                         {}, GRADIENT),
    "diloco_sync_step_worker_batch": (
        strategies.diloco(SGD, optax.sgd(1.0), H=BAD_STEP),
        dict(worker_batch=2), GRADIENT),
    # A local step: worker 1's model alone is NaN, so its own loss of the
    # next step names it (flags are computed only where a step shares the
    # gradients' work: ``_grouping.when_shared``).
    "diloco_local_step": (strategies.diloco(SGD, optax.sgd(1.0), H=4), {},
                          ("loss", BAD_STEP + 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_error_names_the_worker_whose_own_value_was_not_finite(
    name, tmp_path):
  strategy, kw, (quantity, step) = CASES[name]
  with pytest.raises(lowbw.NonFiniteLossError) as info:
    run(strategy, out=str(tmp_path), **kw)
  err = info.value
  assert (err.step, err.worker, err.quantity) == (step, BAD_WORKER, quantity)
  assert err.stopped_at == BAD_STEP + 1
  message = str(err)
  assert "\n" not in message
  if quantity == "gradient":
    assert message.startswith(
        f"non-finite gradient of worker {BAD_WORKER} at step {BAD_STEP} (its "
        "loss was finite); it reached the other workers through that step's "
        f"communication; the training loss was non-finite at step "
        f"{BAD_STEP + 1}"), message
  else:
    assert message.startswith(f"non-finite training loss at step {step} on "
                              f"worker {BAD_WORKER};"), message
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["ended"] == "non_finite_loss"
  assert (summary["non_finite_worker"], summary["non_finite_step"],
          summary["non_finite_quantity"], summary["stopped_at_step"]) == (
              BAD_WORKER, step, quantity, BAD_STEP + 1)
  with open(tmp_path / "metrics.csv") as f:
    steps = [int(r["step"]) for r in csv.DictReader(f)]
  assert steps == list(range(1, BAD_STEP + 1))


def test_a_non_finite_loss_is_still_named_as_a_loss():
  # Worker 2's first feature squared overflows float32: its own loss is
  # infinite at step 1 (and so is its gradient; the loss is named).
  def squares(params, batch, key):
    return loss(params, batch, key)[0] + jnp.mean(batch["x"][:, 0] ** 2), {}

  x, y = arrays()
  x[64:96, 0] = 3e38
  source = data.arrays(x, y, eval=arrays(24), sharding="contiguous")
  for strategy in (strategies.ddp(SGD),
                   strategies.diloco(SGD, optax.sgd(1.0), H=4)):
    with pytest.raises(lowbw.NonFiniteLossError) as info:
      lowbw.simulate(model=lowbw.models.as_model((init, squares)),
                     data=source, strategy=strategy, workers=W,
                     batch_size=B, steps=4, devices=1, progress=False)
    err = info.value
    assert (err.step, err.worker, err.quantity, err.stopped_at) == (
        1, 2, "loss", 1)
    assert str(err).startswith(
        "non-finite training loss at step 1 on worker 2;")
