"""Byzantine workers and robust aggregation, against numpy and a per-worker
Python loop written here."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import network as net_lib
from lowbw.network import _clock
from lowbw import strategies
from lowbw.transforms import adversaries, corrupt, participating, robust_mean
from lowbw.transforms._robust import Adversaries, check_robust

W = 5


def _values(seed=0, shape=(W, 7, 3)):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize("mask", [None, [1, 1, 0, 1, 1], [0, 1, 0, 1, 1],
                                  [0, 0, 0, 0, 1]])
def test_robust_aggregates_match_numpy_over_the_participants(mask):
  x = _values()
  active = np.ones(W, bool) if mask is None else np.asarray(mask, bool)
  kept = x[active]
  mask_j = None if mask is None else jnp.asarray(active)
  with participating(mask_j):
    median = robust_mean({"x": jnp.asarray(x)}, "median")["x"]
    trimmed = robust_mean({"x": jnp.asarray(x)}, "trimmed_mean", 0.25)["x"]
  np.testing.assert_allclose(median, np.median(kept, axis=0), rtol=1e-6)
  k = kept.shape[0]
  t = int(np.floor(0.25 * k))
  want = np.sort(kept, axis=0)[t:k - t].mean(axis=0)
  np.testing.assert_allclose(trimmed, want, rtol=1e-5, atol=1e-6)


def test_a_robust_aggregate_over_nobody_is_zero():
  with participating(jnp.zeros(W, bool)):
    out = robust_mean({"x": jnp.asarray(_values())}, "median")["x"]
  assert not np.any(np.asarray(out))


def test_corrupt_replaces_only_the_byzantine_workers_rows():
  x = {"a": jnp.asarray(_values(1)), "b": jnp.asarray(_values(2, (W, 4)))}
  mask = jnp.asarray([False, True, False, False, True])
  ids = jnp.arange(W)
  key = jax.random.PRNGKey(3)
  with adversaries(Adversaries(mask, jnp.float32(-1), jnp.float32(0), key)):
    flipped = corrupt(x, ids)
  with adversaries(Adversaries(mask, jnp.float32(0), jnp.float32(1), key)):
    noisy = corrupt(x, ids)
  for name in x:
    honest, bad = np.asarray(x[name]), np.asarray(mask)
    np.testing.assert_array_equal(flipped[name][~bad], honest[~bad])
    np.testing.assert_array_equal(flipped[name][bad], -honest[bad])
    np.testing.assert_array_equal(noisy[name][~bad], honest[~bad])
    assert not np.allclose(noisy[name][bad], honest[bad])
  # Noise with each tensor's own scale: the RMS of the big tensor's rows.
  rms = np.sqrt(np.mean(np.asarray(x["a"])[1] ** 2))
  assert 0.5 * rms < np.sqrt(np.mean(np.asarray(noisy["a"])[1] ** 2)) < 2 * rms


def test_diloco_with_a_byzantine_worker_and_a_median_matches_a_loop():
  """Worker 4 sends its pseudo-gradient negated; the outer step takes the
  coordinate-wise median of the five, every worker restarts from it."""
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
  batches = jnp.asarray(rng.normal(size=(6, W, 3, 4)), jnp.float32)
  loss = lambda p, x: jnp.mean(jnp.tanh(x @ p["w"]) ** 2)  # noqa: E731
  inner, outer, H = optax.sgd(0.1), optax.sgd(0.7, momentum=0.9,
                                              nesterov=True), 3
  strategy = strategies.diloco(inner=inner, outer=outer, H=H,
                               robust="median")
  state = strategy.init(params, W, jax.random.PRNGKey(0))
  bad = jnp.asarray([False] * (W - 1) + [True])
  grad_W = jax.vmap(jax.grad(loss))
  for t in range(6):
    with adversaries(Adversaries(bad, jnp.float32(-1), jnp.float32(0),
                                 jax.random.PRNGKey(1))):
      state, _ = strategy.step(state, grad_W(state.params_W, batches[t]))
  theta, ostate = params, outer.init(params)
  workers = [params] * W
  for t in range(6):
    workers = [jax.tree.map(lambda p, g: p - 0.1 * g, p,
                            jax.grad(loss)(p, batches[t, w]))
               for w, p in enumerate(workers)]
    if (t + 1) % H == 0:
      deltas = [jax.tree.map(lambda a, b: a - b, theta, p) for p in workers]
      deltas[-1] = jax.tree.map(lambda d: -d, deltas[-1])
      median = jax.tree.map(lambda *d: jnp.median(jnp.stack(d), axis=0),
                            *deltas)
      updates, ostate = outer.update(median, ostate, theta)
      theta = optax.apply_updates(theta, updates)
      workers = [theta] * W
  np.testing.assert_allclose(state.comm.global_params["w"], theta["w"],
                             rtol=1e-5, atol=1e-6)


def _run(strategy, faults=None):
  net = net_lib.network("1Gbps", "10ms", hardware="0.01s", faults=faults)
  return lowbw.simulate(
      model=lowbw.models.mlp(hidden=(16,), num_classes=10),
      data=lowbw.data.digits(), strategy=strategy, workers=W,
      batch_size=8, steps=60, network=net, eval_every=60, seed=0)


def test_a_median_resists_a_sign_flipping_worker_that_the_mean_does_not():
  clean = _run(strategies.diloco(H=10))
  byz = net_lib.Faults(byzantine=(4,), byzantine_kind="scale",
                       byzantine_scale=-20.0)
  attacked = _run(strategies.diloco(H=10), byz)
  median = _run(strategies.diloco(H=10, robust="median"), byz)
  gap = lambda r: abs(r.summary["final_eval_loss"] -  # noqa: E731
                      clean.summary["final_eval_loss"])
  assert gap(attacked) > 5 * gap(median)
  # Every worker all-gathers the others' pseudo-gradients: (W-1) x payload.
  payload = median.history["payload_bytes"][-1]
  assert median.history["wire_bytes"][-1] == (W - 1) * payload
  assert clean.history["wire_bytes"][-1] == 2 * (W - 1) / W * payload


def test_byzantine_settings_are_checked():
  for bad, match in [(dict(byzantine=(7,)), "byzantine"),
                     (dict(byzantine="0,x"), "byzantine='0,x'.*indices"),
                     (dict(byzantine=(1,), byzantine_kind="evil"),
                      "byzantine_kind"),
                     (dict(byzantine=(1,), byzantine_kind="scale",
                           byzantine_scale=float("inf")), "byzantine_scale")]:
    with pytest.raises(ValueError, match=match):
      _clock.check_network(net_lib.network(faults=net_lib.Faults(**bad)), W)
  with pytest.raises(ValueError, match="sends no pseudo-gradients"):
    _run(strategies.ddp(), net_lib.Faults(byzantine=(1,)))
  for robust in ["avg", "median:0.1", "trimmed_mean:0.5", "trimmed_mean:x"]:
    with pytest.raises(ValueError, match="robust"):
      check_robust(robust)
  with pytest.raises(ValueError, match="all-gathered"):
    strategies.diloco(codec="quant:4", aggregation="reduce_scatter",
                      robust="median")
