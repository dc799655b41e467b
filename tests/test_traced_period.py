"""A traced H: one build runs every sync period of a DiLoCo-style strategy
(``lowbw.build(config, traced=("H",))``), and a study over H builds once
per strategy; every point equals its single run (``lowbw.simulate``)."""

import numpy as np
import pytest

import lowbw

HS = (2, 3, 5)
STEPS = 23  # a tail of 1, 2 and 3 steps past the last round
BASE = dict(data="digits", workers=4, batch_size=8, hidden=16, steps=STEPS,
            progress=False,
            bandwidth="100Mbps", latency="20ms", hardware="0.01s")
EXACT = ("payload_bytes", "wire_bytes", "sim_time_s", "step", "examples")


def config(strategy="diloco", H=5, **kw):
  return lowbw.Config(strategy=strategy, H=H, **{**BASE, **kw})


def assert_same(history, reference, label, exact=EXACT):
  """Losses to float tolerance; steps, bytes and simulated time (``exact``)
  exact."""
  assert sorted(history) == sorted(reference), label
  for name, want in reference.items():
    got, want = np.asarray(history[name]), np.asarray(want)
    assert got.shape == want.shape, (label, name)
    if name in exact:
      np.testing.assert_array_equal(got, want, err_msg=f"{label}: {name}")
    elif name != "wall_time_s":
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6,
                                 err_msg=f"{label}: {name}")


@pytest.fixture(scope="module")
def references():
  """Each (strategy, H)'s single run, built with that H."""
  return {(s, h): lowbw.simulate(config(s, h))
          for s in ("diloco", "sparseloco") for h in HS}


def test_a_study_over_H_builds_once_per_strategy_and_equals_single_runs(
    references, tmp_path):
  study = lowbw.study(lowbw.Config(**BASE),
                      grid={"strategy": ["diloco", "sparseloco"], "H": HS},
                      seeds=[0], out=str(tmp_path / "study"), plots=False)
  assert study.summary["builds"] == 2
  assert study.summary["groups"] == 2
  for point in study.points:
    label = f"{point.values}"
    assert not point.summary.get("error"), label
    ref = references[point.values["strategy"], point.values["H"]]
    assert_same(point.history, ref.history, label)
    for key in ("payload_bytes", "wire_bytes", "sim_time_s"):
      assert point.summary[key] == ref.summary[key], (label, key)
    # The point's folder describes its own H.
    assert point.config.H == point.values["H"]


def test_one_build_runs_every_H_without_compiling_again(references):
  sim = lowbw.build(config("diloco", 5), traced=("H",), compile=False)
  for h in HS:
    result = sim.run(hparams={"H": h}, progress=False)
    assert_same(result.history, references["diloco", h].history, f"H={h}")
    assert result.config["strategy"]["H"] == h
  assert sim.compilations == 1
  # The build keeps its view of each H (a study asks for it per point);
  # a view's own views are made afresh, from the view.
  assert sim.at_period(2) is sim.at_period(2)
  assert sim.at_period(2) is not sim.at_period(3)
  assert sim.at_period(3).config.period == 3
  view = sim.at_period(2)
  assert view.at_period(3) is not sim.at_period(3)
  assert view.at_period(3).config.period == 3


def test_vmapped_points_of_one_H_equal_their_single_runs(references):
  """``points_per_batch``: a batch's points share their H (and host loop);
  the points of several H still share one build."""
  study = lowbw.study({**BASE, "strategy": "diloco"},
                      grid={"H": [2, 3], "outer_lr": [0.7, 0.5]},
                      seeds=[0], points_per_batch=2, plots=False)
  assert study.summary["builds"] == 1
  for point in study.points:
    if point.values["outer_lr"] == 0.7:
      assert_same(point.history,
                  references["diloco", point.values["H"]].history,
                  f"{point.values}")
    single = lowbw.simulate(point.config) if (
        point.values == {"H": 3, "outer_lr": 0.5}) else None
    if single is not None:
      assert_same(point.history, single.history, f"{point.values}")


@pytest.mark.parametrize("kw, traced, message", [
    (dict(strategy="sparta"), ("H",),
     r"^traced=\('H',\) is invalid: not supported with strategy 'sparta'"),
    (dict(outer_delay=1), ("H",),
     r"^traced=\('H',\) is invalid: not supported with strategy 'diloco'"),
    (dict(clients=20), ("H",), r"^traced=\('H',\) is invalid: not "
     r"supported with clients=20 \(sampled clients\)"),
    (dict(), ("p",), r"^traced='p' is invalid: not a field a build can "
     r"trace; expected one of H"),
    (dict(), "H", r"^traced='H' is invalid: expected a tuple of field names"),
])
def test_a_build_refuses_what_it_cannot_trace(kw, traced, message):
  c = config(**kw) if kw.get("strategy") != "sparta" else lowbw.Config(
      strategy="sparta", **BASE)
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.build(c, traced=traced, compile=False)


def test_a_run_refuses_an_H_the_build_cannot_run():
  sim = lowbw.build(config("diloco", 4, eval_every=8), traced=("H",),
                    compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^H=6 is invalid: at most 4"):
    sim.run(hparams={"H": 6})
  with pytest.raises(lowbw.ConfigError, match=r"^H=3 is invalid: "
                     r"eval_every=8: .*multiple"):
    sim.run(hparams={"H": 3})
  with pytest.raises(lowbw.ConfigError, match=r"^H=0 is invalid"):
    sim.run(hparams={"H": 0})
  with pytest.raises(lowbw.ConfigError, match=r"^checkpoint_every=4 is "
                     r"invalid: not supported on a build with a traced H"):
    sim.run(hparams={"H": 2}, checkpoint_every=4)
  plain = lowbw.build(config("diloco", 4), compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^hparams='H' is invalid: "
                     r"not a traced hyperparameter"):
    plain.run(hparams={"H": 2})
