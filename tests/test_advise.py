"""``lowbw.advise``: a probe study's token efficiencies and the clock's step
times at the user's model size make a ranked table; each figure is checked
against its parts (the probe's points, the clock's price of a DDP step by
hand), and ``lowbw advise`` prints it."""

import json
import math

import numpy as np
import pytest

import lowbw
from lowbw import cli
from lowbw.network._collectives import ring_allreduce
from lowbw.studies import _advise

PROBE = dict(steps=40, hidden="8", eval_every=20, eval_examples=64)
CANDIDATES = [{"strategy": "ddp"}, {"strategy": "diloco", "H": 10}]
FLEET = dict(bandwidth="1Gbps", latency="20ms", hardware="0.05s",
             gpu_price=2.0, egress_price=0.05)
P, TOKENS, W = 100_000_000, 2e9, 4


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("advise") / "probe")


@pytest.fixture(scope="module")
def advice(probe_dir):
  return lowbw.advise(P, TOKENS, workers=W, fleet=dict(FLEET), probe=PROBE,
                      candidates=CANDIDATES, seeds=[0, 1], progress=False,
                      out=probe_dir)


def test_ddp_is_timed_by_the_clock_at_the_models_size(advice):
  ddp = next(r for r in advice.rows if r["candidate"]["strategy"] == "ddp")
  assert (ddp["eta"], ddp["eta_low"], ddp["eta_high"]) == (1.0, 1.0, 1.0)
  # One DDP step at P parameters on the fleet, priced by the clock itself:
  # the bucketed gradient all-reduce and the compute per step.
  net = lowbw.network.network("1Gbps", "20ms", hardware="0.05s")
  pricing = lowbw.network.price(net, {"gradients": ring_allreduce(
      4 * P, W)._replace(bucketed=True)}, W, P, 1.0)
  step = pricing.step_s + pricing.clock_costs["gradients"].seconds
  assert ddp["step_s"] == pytest.approx(step, rel=1e-6)
  steps = TOKENS / (W * 8192)
  startup = net.profile.startup_s
  assert ddp["time_s"] == pytest.approx(steps * step + startup, rel=1e-6)
  assert ddp["sent_gb"] == pytest.approx(
      steps * W * 1.5 * 4 * P / 1e9, rel=1e-6)  # a ring's bytes per worker
  hours = W * ddp["time_s"] / 3600
  assert ddp["cost_usd"] == pytest.approx(
      hours * 2.0 + ddp["sent_gb"] * 0.05, rel=1e-9)


def test_a_candidates_eta_is_its_probe_points_and_the_ranking_is_by_time(
    advice):
  diloco = next(r for r in advice.rows if r["candidate"].get("H") == 10)
  etas = [p.summary["token_efficiency"] for p in advice.probe.points
          if p.values.get("H") == 10]
  assert diloco["eta"] == pytest.approx(np.mean(etas))
  low, high = lowbw.studies.paired_interval(etas)
  assert (diloco["eta_low"], diloco["eta_high"]) == (pytest.approx(low),
                                                     pytest.approx(high))
  assert diloco["time_s"] == pytest.approx(
      TOKENS / (W * 8192) / diloco["eta"] * diloco["step_s"]
      + lowbw.network.network().profile.startup_s, rel=1e-9)
  times = [r["time_s"] for r in advice.rows]
  assert times == sorted(times)


def test_the_notes_say_when_the_first_two_overlap():
  rows = [{"candidate": {"a": 1}, "eta": 1.0, "time_s": 10.0,
           "time_low": 8.0, "time_high": 12.0},
          {"candidate": {"b": 2}, "eta": 1.0, "time_s": 11.0,
           "time_low": 11.5, "time_high": 13.0},
          {"candidate": {"c": 3}, "eta": math.nan, "time_s": math.nan,
           "error": "diverged"}]
  notes = _advise._notes(rows, "time_s")
  assert any("cannot tell {'a': 1} from {'b': 2}" in n for n in notes)
  assert any("{'c': 3}: eta not measured (diverged)" in n for n in notes)
  rows[1]["time_low"] = 12.5
  assert not any("cannot tell" in n for n in _advise._notes(rows, "time_s"))


@pytest.mark.parametrize("kw, match", [
    (dict(params="lots"), "^params='lots' is invalid"),
    (dict(workers=0), "^workers=0 is invalid"),
    (dict(rank_by="speed"), "^rank_by='speed' is invalid"),
    (dict(rank_by="cost"), "^rank_by='cost' is invalid: needs a price"),
    (dict(fleet={"bandwith": "1Gbps"}), "^fleet=.*bandwith"),
    (dict(tokens=None), "^tokens=None is invalid: required: give a model's "
                        "size"),
    (dict(target_loss=1.0), "^target_loss=1.0 is invalid: is a loss on the "
                            "probe's own task"),
    (dict(params=None, tokens=None, target_loss=-1.0), "^target_loss=-1.0"),
])
def test_bad_input_is_named(kw, match):
  args = dict(params=P, tokens=TOKENS, candidates=CANDIDATES, probe=PROBE,
              progress=False)
  with pytest.raises(lowbw.ConfigError, match=match):
    lowbw.advise(**{**args, **kw})


def test_command_line(advice, probe_dir, capsys):
  # The fixture's probe, resumed: nothing trains again.
  argv = ["advise", "--params", "100M", "--tokens", "2B", "--workers",
          str(W), "--bandwidth", "1Gbps", "--latency", "20ms", "--hardware",
          "0.05s", "--gpu-price", "2", "--egress-price", "0.05",
          "--candidate", "strategy=ddp", "--candidate", "strategy=diloco,H=10",
          "--seeds", "0,1", "--probe-steps", str(PROBE["steps"]), "--probe",
          ",".join(f"{k}={v}" for k, v in PROBE.items() if k != "steps"),
          "--out", probe_dir]
  assert cli.main(argv + ["--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert [r["time_s"] for r in printed["rows"]] == pytest.approx(
      [r["time_s"] for r in advice.rows])
  assert cli.main(argv) == 0
  text = capsys.readouterr().out
  assert "strategy=ddp" in text and "eta (90%)" in text
  assert cli.main(["advise", "--params", "100M", "--tokens", "2B",
                   "--candidate", "strategy"]) == 2
  assert "--candidate='strategy' is invalid" in capsys.readouterr().err


def test_the_default_probe_is_a_valid_study():
  """Every default candidate makes a valid run at the default probe (an
  evaluation spacing that fits each one's H), checked without running."""
  base, grid = _advise.probe_study(list(_advise.CANDIDATES), None, 8)
  points = lowbw.studies.expand(base, grid, [0, 1, 2])
  assert len(points) == 3 * len(_advise.CANDIDATES)
  for p in points:
    H = p.values.get("H")
    if H:
      assert p.config.eval_every % H == 0 and p.config.shadow == "ddp"


# ------------------------------------------------- time to a target loss
def test_reach_interpolates_between_the_evaluations_around_the_crossing():
  history = {"step": np.arange(1, 9), "eval_loss": np.array(
      [np.nan, 3.0, np.nan, 2.0, np.nan, 1.0, np.nan, 0.5])}
  seconds = np.arange(1, 9) * 10.0
  assert _advise.reach(history, seconds, 1.5) == (5.0, 50.0)
  assert _advise.reach(history, seconds, 3.5) == (2.0, 20.0)  # at once
  assert all(math.isnan(x) for x in _advise.reach(history, seconds, 0.1))


TARGET_FLEET = dict(bandwidth="100Mbps", latency="20ms", hardware="0.05s")
TARGET_PROBE = dict(steps=40, hidden="8", eval_every=10, eval_examples=64,
                    inner_lr=3e-3)


def test_time_to_a_target_is_what_running_the_candidates_on_the_fleet_gives(
    tmp_path):
  """With target_loss the advice is checked as a user would: each
  candidate is run on the fleet (the network as a run's own settings) with
  the probe's seeds, and its time to the target read off its history by
  hand; the recommendation is the fastest of those runs."""
  target = 2.12  # crossed between evaluations by every run
  advice = lowbw.advise(target_loss=target, workers=2,
                        fleet={**TARGET_FLEET, "gpu_price": 2.0},
                        candidates=CANDIDATES, probe=TARGET_PROBE,
                        seeds=[0, 1], progress=False, out=str(tmp_path))
  measured = {}
  for candidate in CANDIDATES:
    times = []
    for seed in (0, 1):
      run = lowbw.simulate(lowbw.Config(
          **{**_advise.PROBE, **TARGET_PROBE}, **candidate, workers=2,
          seed=seed, progress=False, **TARGET_FLEET))
      h = run.history
      evals = [i for i in range(len(h["step"]))
               if np.isfinite(h["eval_loss"][i])]
      hit = next(n for n, i in enumerate(evals) if h["eval_loss"][i] <= target)
      i, j = evals[hit], evals[hit - 1]
      share = (h["eval_loss"][j] - target) / (h["eval_loss"][j]
                                               - h["eval_loss"][i])
      times.append(h["sim_time_s"][j]
                   + share * (h["sim_time_s"][i] - h["sim_time_s"][j]))
    measured[candidate.get("H", 1)] = np.mean(times)
  rows = {r["candidate"].get("H", 1): r for r in advice.rows}
  for H, seconds in measured.items():
    assert rows[H]["time_s"] == pytest.approx(seconds, rel=1e-5)
    assert rows[H]["reached"] == 2
    assert rows[H]["cost_usd"] == pytest.approx(
        2 * seconds / 3600 * 2.0, rel=1e-5)
  best = min(measured, key=measured.get)
  assert advice.best["candidate"].get("H", 1) == best
  text = "\n".join(cli._advise.table(advice))
  assert "steps" in text and "eta" not in text


def test_a_candidate_that_does_not_reach_the_target_is_named_and_last(
    tmp_path):
  # The task as a lowbw.Config: its given fields are the probe's (its
  # workers the fleet's), its strategy's settings the candidates' to choose.
  task = lowbw.Config(data="digits", strategy="diloco", H=10, workers=2,
                      **TARGET_PROBE)
  advice = lowbw.advise(target_loss=0.01, fleet=TARGET_FLEET,
                        candidates=CANDIDATES[:1], probe=task,
                        seeds=[0], progress=False, out=str(tmp_path))
  assert math.isnan(advice.best["time_s"]) and advice.best["reached"] == 0
  (point,) = advice.probe.points
  assert (point.config.strategy, point.config.workers) == ("ddp", 2)
  assert point.config.inner_lr == TARGET_PROBE["inner_lr"]
  assert advice.notes == ["{'strategy': 'ddp'}: reached eval loss 0.01 in 0 "
                          "of 1 seeds within 40 steps; left last (give more "
                          "probe steps)"]
