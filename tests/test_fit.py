"""``lowbw.fit``: laws fitted to studies. The fits recover the parameters of
synthetic studies drawn here from known laws (within their bootstrap
intervals, most of the time, as intervals should), predict points the study
did not run, and refuse bad input naming it; ``lowbw fit`` on a real
study's folder."""

import json
import math

import numpy as np
import pytest

import lowbw
from lowbw import cli
from lowbw.studies._result import PointResult, Study

E, A, ALPHA, B, BETA = 1.7, 400.0, 0.34, 410.0, 0.28
NS, DS = (1e4, 1e5, 1e6, 1e7, 1e8), (1e6, 1e7, 1e8, 1e9)


def chinchilla(n, d):
  """The law the synthetic studies are drawn from (by hand)."""
  return E + A * n ** -ALPHA + B * d ** -BETA


def synthetic(law, grid, seeds=4, noise=0.003, rng=0, name="final_eval_loss"):
  """A ``Study`` whose points' ``name`` is ``law`` at each grid point times
  one plus Gaussian noise per seed."""
  rng = np.random.default_rng(rng)
  points = []
  for values in grid:
    for s in range(seeds):
      y = law(**values) * (1 + noise * rng.standard_normal())
      points.append(PointResult(len(points), dict(values), s,
                                {name: y, "num_params": values.get("n")},
                                {}, None, None))
  return Study(points, sorted(grid[0]), list(range(seeds)), {}, {})


GRID = [{"n": n, "d": d} for n in NS for d in DS]


def test_a_power_law_is_recovered_within_its_intervals():
  """Over ten studies, most parameters fall in their 90 % intervals and
  the extrapolation to a 10x larger model and data is within 2 %."""
  inside, total = 0, 0
  for trial in range(10):
    f = lowbw.fit(synthetic(chinchilla, GRID, rng=trial), ["params", "d"],
                  form="power", bootstrap=60)
    truth = {"E": E, "A_params": A, "A_d": B, "alpha_params": ALPHA,
             "alpha_d": BETA}
    inside += sum(f.intervals[k][0] <= v <= f.intervals[k][1]
                  for k, v in truth.items())
    total += len(truth)
    far = f.predict({"params": 1e9, "d": 1e10})[0]
    assert far["final_eval_loss"] == pytest.approx(chinchilla(1e9, 1e10),
                                                   rel=0.02)
    assert far["low"] <= far["final_eval_loss"] <= far["high"]
  assert inside / total >= 0.6


def test_the_joint_and_log_laws_are_exact_on_exact_data():
  joint = lambda n, m: 3.0 * n ** -0.05 * m ** 0.02  # noqa: E731
  grid = [{"n": n, "m": m} for n in NS for m in (1, 2, 4, 8)]
  f = lowbw.fit(synthetic(joint, grid, seeds=1, noise=0), ["n", "m"],
                form="joint", bootstrap=20)
  assert f.params == pytest.approx({"A": 3.0, "beta_n": -0.05,
                                    "beta_m": 0.02})
  assert f.predict({"n": 1e12, "m": 64})[0]["final_eval_loss"] == (
      pytest.approx(joint(1e12, 64)))
  log = lambda h: 0.9 - 0.03 * math.log(h)  # noqa: E731
  f = lowbw.fit(synthetic(log, [{"h": h} for h in (1, 4, 16, 64, 256)],
                          seeds=2, noise=0), "h", form="log", bootstrap=0)
  assert f.params == pytest.approx({"a": 0.9, "b_h": -0.03})
  assert f.quality()["max_rel_residual"] < 1e-9


def test_one_seed_bootstraps_the_residuals_and_failed_points_are_left_out():
  study = synthetic(chinchilla, GRID, seeds=1, noise=0.003)
  study.points[0].summary["error"] = "non-finite loss at step 3"
  f = lowbw.fit(study, ["params", "d"], bootstrap=40)
  assert len(f.rows) == len(GRID) - 1
  lo, hi = f.intervals["alpha_params"]
  assert lo < hi and lo <= f.params["alpha_params"] <= hi


def test_where_fits_a_subset_of_the_points():
  """Two laws in one study (a method field tells them apart): ``where``
  fits each one alone, as a dict of values or a function of a point."""
  law = {"a": lambda n: 2.0 * n ** -0.1, "b": lambda n: 3.0 * n ** -0.2}
  points = []
  for method, f in law.items():
    for n in NS:
      points.append(PointResult(len(points), {"method": method, "n": n}, 0,
                                {"final_eval_loss": f(n)}, {}, None, None))
  study = Study(points, ["method", "n"], [0], {}, {})
  for where in ({"method": "b"}, {"method": ["b"]},
                lambda p: p.values["method"] == "b"):
    f = lowbw.fit(study, "n", form="joint", bootstrap=0, where=where)
    assert f.params == pytest.approx({"A": 3.0, "beta_n": -0.2})
  with pytest.raises(lowbw.ConfigError, match="^where=.*keeps none of the "
                     "study's 10 points"):
    lowbw.fit(study, "n", form="joint", where={"method": "c"})
  with pytest.raises(lowbw.ConfigError, match="^where=3 is invalid"):
    lowbw.fit(study, "n", form="joint", where=3)


def test_a_fit_saves_and_loads(tmp_path):
  f = lowbw.fit(synthetic(chinchilla, GRID), ["params", "d"], bootstrap=10)
  g = lowbw.studies.load_fit(f.save(str(tmp_path / "fit.json")))
  assert g.params == f.params and g.intervals == f.intervals
  at = {"params": 3e8, "d": 3e9}
  assert g.predict(at) == f.predict(at)


@pytest.mark.parametrize("kw, match", [
    (dict(form="powr"), r"^form='powr' is invalid: expected one of power, "
     "joint, log.*did you mean 'power'"),
    (dict(x="flops"), r"^x='flops' is invalid: point 0 has flops=None"),
    (dict(x=[]), r"^x=\[\] is invalid: expected at least one input"),
    (dict(y="sim_time_s"), r"^y='sim_time_s' is invalid: point 0 has "
     "sim_time_s=None"),
    (dict(bootstrap=-1), r"^bootstrap=-1 is invalid"),
    (dict(confidence=1.5), r"^confidence=1.5 is invalid"),
])
def test_bad_input_is_named(kw, match):
  with pytest.raises(lowbw.ConfigError, match=match):
    lowbw.fit(synthetic(chinchilla, GRID[:6], seeds=1), **{"x": "params",
                                                           **kw})


def test_too_few_combinations_for_the_law_are_refused():
  few = synthetic(chinchilla, GRID[:3], seeds=2)
  with pytest.raises(lowbw.ConfigError, match="the power law has 5 "
                     "parameters .* 3 combinations"):
    lowbw.fit(few, ["params", "d"])
  with pytest.raises(lowbw.ConfigError, match="^predict=.*expected the "
                     "inputs params, d"):
    lowbw.fit(synthetic(chinchilla, GRID), ["params", "d"],
              bootstrap=0).predict({"params": 1e9})


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
  # One compiled program: the learning rate is a traced value.
  out = str(tmp_path_factory.mktemp("fit") / "study")
  lowbw.study(dict(data="digits", hidden="8", workers=2, steps=4, H=2,
                   eval_examples=32, eval_every=4),
              {"inner_lr": [1e-3, 3e-3, 1e-2, 3e-2]}, seeds=[0, 1], out=out,
              progress=False, plots=False)
  return out


def test_command_line(study_dir, tmp_path, capsys):
  assert cli.main(["fit", study_dir, "--x", "inner_lr", "--form", "log",
                   "--predict", "inner_lr=5e-3", "--out",
                   str(tmp_path / "f.json"), "--bootstrap", "20"]) == 0
  text = capsys.readouterr().out
  assert "log law of inner_lr" in text and "at inner_lr=0.005" in text
  saved = json.loads((tmp_path / "f.json").read_text())
  # The study's grid values and its points' losses, mean over seeds.
  points = lowbw.studies.load(study_dir).points
  for row in saved["rows"]:
    losses = [p.summary["final_eval_loss"] for p in points
              if p.values["inner_lr"] == row["inner_lr"]]
    assert row["final_eval_loss"] == pytest.approx(np.mean(losses))
  assert len(saved["rows"]) == 4
  assert cli.main(["fit", study_dir, "--x", "inner_lr", "--form", "log",
                   "--json", "--bootstrap", "0"]) == 0
  assert json.loads(capsys.readouterr().out)["form"] == "log"
  assert cli.main(["fit", study_dir, "--x", "inner_lr", "--predict",
                   "inner_lr"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("lowbw: error: --predict='inner_lr' is invalid") and (
      "\n" not in err)


def test_the_planner_reads_a_fitted_efficiency_at_its_h(tmp_path, capsys):
  """A law of token efficiency in H replaces the planner's heuristic: the
  plan's efficiency is the law's value at its H, and its time is the
  time before efficiency divided by it."""
  law = lambda H: 1.02 - 0.05 * math.log(H)  # noqa: E731
  study = synthetic(law, [{"H": h} for h in (1, 4, 16, 64)], seeds=2,
                    noise=0.002, name="token_efficiency")
  f = lowbw.fit(study, "H", y="token_efficiency", form="log", bootstrap=20)
  for h in (8, 128):
    out = lowbw.network.plan(inner_steps=h, efficiency=f)
    eta = f.predict({"H": h})[0]["token_efficiency"]
    assert out["efficiency"] == pytest.approx(eta)
    assert eta == pytest.approx(law(h), rel=0.01)
    assert out["total_days"] == pytest.approx(
        out["time_before_efficiency_days"] / eta)
    assert out["efficiency_source"] == "fitted token_efficiency in H"
  heuristic = lowbw.network.plan()
  assert heuristic["efficiency_source"].startswith("heuristic")
  assert lowbw.network.plan(efficiency=0.5)["efficiency"] == 0.5
  for bad in (-1, 0, "fast"):
    with pytest.raises(lowbw.ConfigError, match="^efficiency="):
      lowbw.network.plan(efficiency=bad)
  path = f.save(str(tmp_path / "eta.json"))
  assert cli.main(["plan", "--inner-steps", "32", "--efficiency", path,
                   "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)["outputs"]
  assert printed["efficiency"] == pytest.approx(
      f.predict({"H": 32})[0]["token_efficiency"])
  law_of_tokens = lowbw.fit(synthetic(chinchilla, GRID, seeds=1),
                            ["params", "d"], bootstrap=0)
  with pytest.raises(lowbw.ConfigError, match="'d' is not an input the plan "
                     "has"):
    lowbw.network.plan(efficiency=law_of_tokens)
  assert cli.main(["plan", "--efficiency", "nope.json"]) == 2
  assert "--efficiency='nope.json'" in capsys.readouterr().err
