"""The paired DDP lane (shadow="ddp"): trained in the run's own program, it
equals a separate DDP run with the same seed, workers and batch size, in
every way the run can be built (rounds and a tail, worker groups, a traced
learning rate, its own optimizer, a resumed checkpoint); its errors and its
command-line flag."""

import json

import jax
import numpy as np
import optax
import pytest

import lowbw
from lowbw import cli, models, strategies

RUN = dict(model=models.mlp(hidden=(16,)), data="digits", workers=4,
           batch_size=8, eval_every=5, eval_examples=128, progress=False)


def _evaluated(result, column):
  h = result.history
  at = ~np.isnan(h["eval_loss"])
  return h["step"][at], np.asarray(h[column])[at]


def _same_params(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def _same_as_ddp(run, ddp):
  steps, lane = _evaluated(run, "shadow_eval_loss")
  ddp_steps, ddp_loss = _evaluated(ddp, "eval_loss")
  np.testing.assert_array_equal(steps, ddp_steps)
  assert len(steps) >= 3
  np.testing.assert_allclose(lane, ddp_loss, rtol=1e-6)
  _same_params(run.state.shadow.params, ddp.params)
  _, loss = _evaluated(run, "eval_loss")
  _, gap = _evaluated(run, "shadow_gap")
  np.testing.assert_allclose(gap, loss / lane - 1, rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def ddp_22():
  return lowbw.simulate(strategy=strategies.ddp(), steps=22, **RUN)


def test_the_lane_equals_a_separate_ddp_run(ddp_22):
  """DiLoCo H=5 over 22 steps (four rounds and a two-step tail): the lane's
  evaluations are the DDP run's, its parameters DDP's final ones."""
  run = lowbw.simulate(strategy=strategies.diloco(H=5), steps=22,
                       shadow="ddp", **RUN)
  _same_as_ddp(run, ddp_22)
  # The run itself is not DDP: the comparison has something to show.
  _, gap = _evaluated(run, "shadow_gap")
  assert np.all(np.abs(gap[1:]) > 1e-4)
  assert run.summary["final_shadow_gap"] == pytest.approx(gap[-1])
  assert run.config["shadow"]["name"] == "ddp"
  # Its token efficiency, from the two evaluated curves by hand.
  steps, loss = _evaluated(run, "eval_loss")
  _, lane = _evaluated(run, "shadow_eval_loss")
  assert run.summary["token_efficiency"] == pytest.approx(
      _efficiency_by_hand(steps, loss, lane))


def _efficiency_by_hand(steps, run, lane):
  """Walk the evaluations: where the worse curve first reaches the better
  one's final loss, interpolated between the two evaluations around it."""
  worse, better = (lane, run) if run[-1] >= lane[-1] else (run, lane)
  level = better[-1]
  for k in range(1, len(steps)):
    if worse[k] <= level < worse[k - 1]:
      at = steps[k - 1] + (worse[k - 1] - level) / (
          worse[k - 1] - worse[k]) * (steps[k] - steps[k - 1])
      return at / steps[-1] if worse is lane else steps[-1] / at
  return None


@pytest.mark.parametrize("run, lane, expected", [
    ([3.0, 2.0, 1.0], [2.5, 1.5, 0.5], 2.5 / 3),  # the lane gets to 1 first
    ([2.5, 1.5, 0.5], [3.0, 2.0, 1.0], 3 / 2.5),  # the run beats the lane
    ([1.0, 1.0, 1.0], [0.9, 0.8, 0.7], None),      # reached at the first
    ([2.0, 1.0, 1.0], [2.0, 1.0, 1.0], 2 / 3),     # equal: when it got there
])
def test_token_efficiency_by_hand(run, lane, expected):
  from lowbw.simulation._track import token_efficiency
  got = token_efficiency(np.array([1, 2, 3]), np.array(run), np.array(lane))
  assert got == (None if expected is None else pytest.approx(expected))


def test_the_lane_with_worker_groups_and_a_traced_learning_rate():
  """Workers computed two at a time, and an inner learning rate given per
  run: the lane takes the same value (it applies the inner optimizer)."""
  hp = {"inner_lr": 2e-3}
  run = lowbw.simulate(strategy=strategies.diloco(H=5), steps=20,
                       shadow="ddp", worker_batch=2, hparams=hp, **RUN)
  ddp = lowbw.simulate(strategy=strategies.ddp(), steps=20, hparams=hp, **RUN)
  _same_as_ddp(run, ddp)


def test_the_lane_takes_an_optimizer_of_its_own():
  """An optax transformation as ``shadow``: DDP with that optimizer, whatever
  the strategy's inner one (here DeMo, which has none of the kind)."""
  sgd = optax.sgd(0.3, momentum=0.9)
  run = lowbw.simulate(strategy=strategies.demo(), steps=20, shadow=sgd,
                       **RUN)
  ddp = lowbw.simulate(strategy=strategies.ddp(sgd), steps=20, **RUN)
  _same_as_ddp(run, ddp)


def test_a_resumed_run_resumes_the_lane(tmp_path, ddp_22):
  """A checkpoint holds the lane: stopping at step 10 and going on to 22
  gives the uninterrupted lane."""
  kw = dict(strategy=strategies.diloco(H=5), shadow="ddp", **RUN)
  lowbw.simulate(steps=10, out=str(tmp_path), checkpoint_every=10, **kw)
  resumed = lowbw.simulate(steps=22, resume_from=str(tmp_path), **kw)
  _same_params(resumed.state.shadow.params, ddp_22.params)


@pytest.mark.parametrize("value", ["ddpx", 1, strategies.ddp()])
def test_a_bad_shadow_names_the_field_and_what_is_allowed(value):
  with pytest.raises(lowbw.ConfigError, match=r"^shadow=.* is invalid: "
                     r"expected None, 'ddp' .*optax.GradientTransformation"):
    lowbw.build(models.mlp(hidden=(16,)), "digits", strategies.diloco(H=5),
                shadow=value, compile=False)


def test_the_command_line_lane(tmp_path, capsys):
  out = tmp_path / "run"
  cli.main(["train", "--data", "digits", "--hidden", "16", "--workers", "4",
            "--batch-size", "8", "--steps", "10", "--strategy", "diloco",
            "--H", "5", "--eval-every", "5", "--shadow", "ddp", "--out",
            str(out), "--no-progress"])
  printed = capsys.readouterr().out
  assert "DDP lane          eval loss" in printed
  header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
  assert {"shadow_eval_loss", "shadow_gap"} <= set(header)
  assert json.loads((out / "config.json").read_text())["shadow"]["name"] == "ddp"
  assert cli.main(["train", "--shadow", "fedavg"]) == 2
  assert ("--shadow='fedavg' is invalid: expected one of 'ddp'"
          in capsys.readouterr().err)


def test_the_paired_interval_is_the_textbook_t_interval():
  """Differences 1, 2, 3: mean 2, std 1 (ddof 1), t_0.95(2 df) = 2.919986,
  so the one-sided 95 % bounds are 2 -/+ 2.919986 / sqrt(3)."""
  from lowbw.studies import paired_interval
  low, high = paired_interval([1.0, 2.0, 3.0])
  assert (low, high) == pytest.approx((2 - 1.685854, 2 + 1.685854), abs=1e-5)
  assert np.isnan(paired_interval([0.5])[0])


def test_a_study_reports_the_gap_paired_by_seed(tmp_path):
  base = lowbw.Config(data="digits", hidden="16", workers=4, batch_size=8,
                      steps=10, eval_every=5, strategy="diloco", H=5,
                      shadow="ddp", progress=False)
  study = lowbw.study(base, grid={"outer_lr": [0.5]}, seeds=[0, 1, 2],
                      out=str(tmp_path / "s"))
  from lowbw.studies import paired_interval
  gaps = [p.summary["final_shadow_gap"] for p in study.points]
  final = study.final(frame=False)
  assert final["final_shadow_gap_mean"][0] == pytest.approx(np.mean(gaps))
  assert (final["final_shadow_gap_low"][0], final["final_shadow_gap_high"][0]
          ) == pytest.approx(paired_interval(gaps))
  header = (tmp_path / "s" / "final.csv").read_text().splitlines()[0]
  assert "final_shadow_gap_high" in header
  # Each point's token efficiency is its own run's, from its evaluations,
  # and the table's mean is theirs; the reloaded study reads the same.
  for p in study.points:
    steps, loss = _evaluated(p, "eval_loss")
    _, lane = _evaluated(p, "shadow_eval_loss")
    assert p.summary["token_efficiency"] == pytest.approx(
        _efficiency_by_hand(steps, loss, lane))
  etas = [p.summary["token_efficiency"] for p in study.points]
  assert final["token_efficiency_mean"][0] == pytest.approx(np.mean(
      [e for e in etas if e is not None]))
  again = lowbw.studies.load(str(tmp_path / "s")).final(frame=False)
  assert again["token_efficiency_mean"] == pytest.approx(
      final["token_efficiency_mean"])


def test_init_from_starts_every_worker_and_the_lane_from_a_run(tmp_path,
                                                               ddp_22):
  """A DDP run's folder as ``init_from``: every worker and the lane hold its
  final parameters at step 0; a folder of another model, or none, is an
  error naming init_from."""
  warm = tmp_path / "warm"
  lowbw.simulate(strategy=strategies.ddp(), steps=10, out=str(warm),
                 **RUN)
  sim = lowbw.build(strategy=strategies.diloco(H=5), steps=10, shadow="ddp",
                    compile=False, **{k: v for k, v in RUN.items()
                                      if k != "progress"})
  state = sim.initial(0, init_from=str(warm))[0]
  saved = np.load(warm / "params.npz")
  flat = jax.tree_util.tree_flatten_with_path(state.strategy.params_W)[0]
  for path, leaf_W in flat:
    stored = saved[jax.tree_util.keystr(path)]
    for w in range(RUN["workers"]):
      np.testing.assert_array_equal(leaf_W[w], stored)
  _same_params(state.shadow.params, jax.tree.map(
      lambda p: p[0], state.strategy.params_W))
  other = lowbw.build(model=models.mlp(hidden=(8,)), data="digits",
                      strategy=strategies.ddp(), steps=10, compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^init_from=.* has shape"):
    other.initial(0, init_from=str(warm))
  with pytest.raises(lowbw.ConfigError, match=r"^init_from=.* no params.npz"):
    sim.initial(0, init_from=str(tmp_path / "nowhere"))
  with pytest.raises(lowbw.ConfigError, match=r"^init_from=3 is invalid: "
                     r"expected the path of a finished run's folder"):
    sim.initial(0, init_from=3)


def test_snoo_by_hand():
  """SNOO's equations (arXiv 2510.15830, §2) in a plain loop: K inner SGD
  steps on the fast weights, s = w - w_K, b = mu b + s, w -= lr (mu b + s),
  the fast weights restart from w."""
  c = np.array([1.0, -2.0, 0.5])
  grad = lambda x: x - c  # noqa: E731  (of 0.5 |x - c|^2)
  K, inner_lr, lr, mu = 3, 0.1, 0.7, 0.9
  tx = strategies.snoo_optimizer(optax.sgd(inner_lr),
                                 optax.sgd(lr, momentum=mu, nesterov=True), K=K)
  x = np.zeros(3, np.float32)
  state = tx.init(x)
  w, fast, b = np.zeros(3), np.zeros(3), np.zeros(3)
  for step in range(1, 11):
    updates, state = tx.update(grad(x), state, x)
    x = np.asarray(optax.apply_updates(x, updates))
    fast = fast - inner_lr * grad(fast)
    if step % K == 0:
      s = w - fast
      b = mu * b + s
      w = w - lr * (mu * b + s)
      fast = w.copy()
    np.testing.assert_allclose(x, fast, rtol=1e-5, atol=1e-6)


def test_the_snoo_lane_is_a_ddp_run_of_snoo_and_the_snoo_strategy():
  """shadow="snoo": the strategy's inner optimizer inside SNOO with K = H,
  on the union of the workers' batches: a separate DDP run whose optimizer
  is that SNOO, and the strategy ``snoo``."""
  run = lowbw.simulate(strategy=strategies.diloco(H=5), steps=20,
                       shadow="snoo", **RUN)
  ddp = lowbw.simulate(strategy=strategies.ddp(strategies.snoo_optimizer(
      strategies.default_inner(), K=5)), steps=20, **RUN)
  _same_as_ddp(run, ddp)
  # The strategy snoo is that lane as a run of its own, sending DDP's bytes.
  own = lowbw.simulate(strategy="snoo", H=5, steps=20, **RUN)
  _, lane = _evaluated(run, "shadow_eval_loss")
  np.testing.assert_allclose(_evaluated(own, "eval_loss")[1], lane, rtol=1e-6)
  _same_params(run.state.shadow.params, own.params)
  for column in ("payload_bytes", "wire_bytes"):
    np.testing.assert_array_equal(own.history[column], ddp.history[column])
  with pytest.raises(lowbw.ConfigError, match="^shadow='snoo' is invalid: "
                     "SNOO's outer step comes every H steps"):
    lowbw.Config(data="digits", strategy="ddp", shadow="snoo")
