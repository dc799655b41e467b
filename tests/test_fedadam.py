"""FedAdam (Reddi et al., "Adaptive Federated Optimization", arXiv
2003.00295): DiLoCo's rounds with an Adam outer step.

Checked against a per-worker Python loop whose outer Adam is written out
here (not optax's), and trained alike from the Python API, a config file and
the command line: the outer optimizer is a choice with its own settings, so
every route builds Adam, and SGD's settings are refused with it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml

import lowbw
from lowbw import cli, strategies, telemetry

W, STEPS, DIM = 3, 9, 4


def _loss(params, batch):
  pred = jnp.tanh(batch["x"] @ params["w"]) + params["b"][None]
  return jnp.mean(jnp.square(pred - batch["y"]))


def _problem():
  rng = np.random.default_rng(3)
  params = {"w": jnp.asarray(rng.normal(size=(DIM, 2)), jnp.float32),
            "b": jnp.zeros((2,), jnp.float32)}
  batches = {"x": rng.normal(size=(STEPS, W, 5, DIM)).astype(np.float32),
             "y": rng.normal(size=(STEPS, W, 5, 2)).astype(np.float32)}
  return params, batches


def _reference(params, batches, H, inner_lr, lr, b1, b2, eps):
  """FedAdam on Python lists: every worker's SGD steps in a loop, then the
  mean pseudo-gradient through Adam written out in numpy (bias-corrected)."""
  theta = {k: np.asarray(v, np.float64) for k, v in params.items()}
  workers = [dict(theta) for _ in range(W)]
  m = {k: np.zeros_like(v) for k, v in theta.items()}
  v = {k: np.zeros_like(x) for k, x in theta.items()}
  t = 0
  for step in range(STEPS):
    for w in range(W):
      batch = {k: x[step, w] for k, x in batches.items()}
      g = jax.grad(_loss)({k: jnp.asarray(x, jnp.float32)
                           for k, x in workers[w].items()}, batch)
      workers[w] = {k: workers[w][k] - inner_lr * np.asarray(g[k])
                    for k in theta}
    if (step + 1) % H:
      continue
    t += 1
    for k in theta:
      delta = np.mean([theta[k] - workers[w][k] for w in range(W)], axis=0)
      m[k] = b1 * m[k] + (1 - b1) * delta
      v[k] = b2 * v[k] + (1 - b2) * delta ** 2
      m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
      theta[k] = theta[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    workers = [dict(theta) for _ in range(W)]
  return theta, workers


@pytest.mark.parametrize("H", [1, 3])
def test_fedadam_matches_a_loop_over_workers(H):
  params, batches = _problem()
  strategy = strategies.fedadam(inner=optax.sgd(0.1), H=H)
  state = strategy.init(params, W, jax.random.PRNGKey(0))
  step = jax.jit(strategy.step)
  grads = jax.jit(jax.vmap(jax.grad(_loss)))
  for t in range(STEPS):
    state, _ = step(state, grads(state.params_W,
                                 jax.tree.map(lambda x: x[t], batches)))
  theta, workers = _reference(params, batches, H, 0.1, lr=1e-2, b1=0.9,
                              b2=0.99, eps=1e-3)
  for k in theta:
    np.testing.assert_allclose(state.comm.global_params[k], theta[k],
                               rtol=2e-5, atol=2e-6)
    for w in range(W):
      np.testing.assert_allclose(state.params_W[k][w], workers[w][k],
                                 rtol=2e-5, atol=2e-6)


def test_the_paper_defaults_are_the_spec_and_the_built_optimizer():
  spec = strategies.spec("fedadam")
  assert (spec.outer.kind, spec.outer.b1, spec.outer.b2) == ("adam", 0.9, 0.99)
  config = lowbw.Config(strategy="fedadam")
  assert (config.outer, config.outer_lr, config.outer_b1, config.outer_b2,
          config.outer_eps) == ("adam", 1e-2, 0.9, 0.99, 1e-3)
  hyper = optax.tree_utils.tree_get(
      strategies.fedadam().init({"a": jnp.ones(2)}, 2, jax.random.PRNGKey(0))
      .comm.outer_state, "hyperparams")
  assert {k: round(float(hyper[k]), 6) for k in ("b1", "b2", "eps")} == {
      "b1": 0.9, "b2": 0.99, "eps": 1e-3}


SETTINGS = dict(strategy="fedadam", data="digits", hidden="8", workers=2,
                batch_size=4, steps=8, H=4, eval_examples=16,
                outer_lr=0.05, outer_eps=1e-4, worker_batch="all", devices=1)


def _flags(settings):
  out = ["train", "--no-progress"]
  for name, value in settings.items():
    out += ["--" + name.replace("_", "-"), str(value)]
  return out


def _adam_moments(state):
  """The outer optimizer's Adam moments in a run's state (none for SGD)."""
  return [x for x in jax.tree.leaves(state.strategy.comm.outer_state,
                                     is_leaf=lambda x: hasattr(x, "nu"))
          if hasattr(x, "nu")]


def test_fedadam_trains_with_adam_from_the_api_a_config_file_and_the_cli(
    tmp_path):
  api = lowbw.simulate(lowbw.Config(**SETTINGS, progress=False))
  assert _adam_moments(api.state), "the API run's outer optimizer is not Adam"
  path = tmp_path / "fedadam.yaml"
  path.write_text(yaml.safe_dump(SETTINGS))
  from_file = lowbw.simulate(lowbw.Config.load(str(path), progress=False))
  assert cli.main(_flags(SETTINGS) + ["--out", str(tmp_path / "cli")]) == 0
  written = yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())
  assert (written["outer"], written["outer_eps"]) == ("adam", 1e-4)
  from_cli = telemetry.load_params(str(tmp_path / "cli"), like=api.params)
  for other in (from_file.params, from_cli):
    jax.tree.map(np.testing.assert_array_equal, api.params, other)


def test_diloco_takes_an_adam_outer_step_from_the_cli_as_from_python(
    tmp_path):
  settings = dict(SETTINGS, strategy="diloco", outer="adam", outer_b2=0.95)
  assert cli.main(_flags(settings) + ["--out", str(tmp_path / "cli")]) == 0
  model = lowbw.models.mlp(hidden=(8,), num_classes=10)
  python = lowbw.simulate(
      model=model, data=lowbw.data.digits(), workers=2, batch_size=4,
      steps=8, eval_examples=16, worker_batch="all", devices=1,
      progress=False, strategy=strategies.diloco(
          H=4, inner=strategies.paper_inner("diloco", 8),
          outer=strategies.outer_optimizer(0.05, kind="adam", b2=0.95,
                                           eps=1e-4)))
  from_cli = telemetry.load_params(str(tmp_path / "cli"), like=python.params)
  jax.tree.map(np.testing.assert_array_equal, python.params, from_cli)


@pytest.mark.parametrize("settings, field, words", [
    (dict(strategy="fedadam", outer_momentum=0.9), "outer_momentum",
     "not used by outer 'adam'"),
    (dict(strategy="diloco", outer_b2=0.9), "outer_b2",
     "not used by outer 'sgd'"),
    (dict(strategy="diloco", outer="adagrad"), "outer", "expected one of"),
    (dict(strategy="sparta", outer="adam"), "outer",
     "not used by strategy 'sparta'"),
    (dict(strategy="fedadam", outer_momentum_warmup=3),
     "outer_momentum_warmup", "not used by outer 'adam'"),
    (dict(strategy="fedadam", outer_b1=1.0), "outer_b1", "[0, 1)"),
    (dict(strategy="fedadam", outer_eps=0.0), "outer_eps", "> 0"),
    (dict(strategy="diloco", eps=-1e-8), "eps", "> 0"),
    (dict(strategy="diloco", inner="sgd", eps=1e-6), "eps",
     "not used by inner 'sgd'"),
])
def test_settings_of_another_outer_optimizer_are_refused(settings, field,
                                                         words):
  with pytest.raises(lowbw.ConfigError) as e:
    lowbw.Config(**settings)
  assert e.value.field == field and words in str(e.value), str(e.value)


def test_an_adam_outer_optimizer_refuses_a_momentum_schedule():
  with pytest.raises(lowbw.ConfigError, match="outer_momentum_warmup"):
    strategies.outer_optimizer(0.01, kind="adam", momentum_warmup=3)
  with pytest.raises(lowbw.ConfigError, match="momentum"):
    strategies.outer_optimizer(0.01, 0.5, kind="adam")
  # DiLoCo's own 0.9 too: any momentum given with Adam is refused.
  with pytest.raises(lowbw.ConfigError, match="momentum=0.9"):
    strategies.outer_optimizer(0.01, 0.9, kind="adam")
