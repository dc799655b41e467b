"""Counterfactual lanes (``lanes``): each lane, stepped in the run's own
compiled program, equals a separate run of the config with that one cause
removed (faults, stragglers, Byzantine workers, the codec) or one setting
changed (a quorum): the same logged losses and simulated times, bit for
bit. Their summary figures, memory,
errors, the command-line flag and a study's paired interval."""

import json

import numpy as np
import pytest

import lowbw
from lowbw import cli
from lowbw.simulation import _lanes
from lowbw.studies import _result

# DiLoCo over 4 workers with every cause the lanes remove: faults (drops),
# stragglers (uneven speeds and jitter), a Byzantine worker and an 8-bit
# codec. 22 steps: four rounds and a two-step tail.
BASE = dict(data="digits", strategy="diloco", H=5, workers=4, batch_size=8,
            hidden="16", steps=22, eval_every=5, eval_examples=128,
            devices=1, progress=False, hardware="0.1s", bandwidth="10Mbps",
            drop_prob=0.25, speeds="1,1,1,0.5", jitter=0.3,
            byzantine="2", codec="quant:8")
# Each lane and the settings of the separate run it must equal.
LANES = {
    "no_faults": dict(drop_prob=None),
    "no_stragglers": dict(speeds=None, jitter=None),
    "no_byzantine": dict(byzantine=None),
    "codec=none": dict(codec=None),
}
LOGGED = ("train_loss", "eval_loss", "sim_time_s")


def _config(**changes):
  values = {**BASE, **changes}
  return lowbw.Config(**{k: v for k, v in values.items() if v is not None})


@pytest.fixture(scope="module")
def laned():
  sim = lowbw.build(_config(lanes=list(LANES)))
  result = sim.run(seed=3)
  return sim, result


@pytest.mark.parametrize("lane", list(LANES))
def test_a_lane_equals_the_run_without_its_cause(laned, lane):
  """The lane's rows are those of a separate run of the config without
  the cause, same seed: train and eval losses and simulated time equal
  bit for bit (the same computation, traced into one program)."""
  _, result = laned
  alone = lowbw.simulate(_config(**LANES[lane], seed=3))
  h = result.history
  np.testing.assert_array_equal(h["step"], alone.history["step"])
  for col in LOGGED:
    np.testing.assert_array_equal(h[_lanes.metric(lane, col)],
                                  alone.history[col], err_msg=col)
  s = result.summary
  assert s[f"lane/{lane}/final_eval_loss"] == alone.summary["final_eval_loss"]
  assert s[f"lane/{lane}/sim_time_s"] == alone.summary["sim_time_s"]
  assert s[f"lane/{lane}/loss_cost"] == (s["final_eval_loss"] -
                                         alone.summary["final_eval_loss"])
  assert s[f"lane/{lane}/time_cost_s"] == (s["sim_time_s"] -
                                           alone.summary["sim_time_s"])
  assert s[f"lane/{lane}/goodput"] == alone.summary["goodput"]
  assert s[f"lane/{lane}/goodput_cost"] == (s["goodput"] -
                                            alone.summary["goodput"])


def test_the_run_is_unchanged_by_its_lanes(laned):
  """The run itself logs what it logs without lanes, and every lane
  differs from it (each removes something that matters)."""
  sim, result = laned
  alone = lowbw.simulate(_config(seed=3))
  for col in LOGGED:
    np.testing.assert_array_equal(result.history[col], alone.history[col])
  for lane in LANES:
    assert not all(np.array_equal(
        result.history[col], result.history[_lanes.metric(lane, col)],
        equal_nan=True) for col in LOGGED), lane
  # One compiled program for the run and its four lanes; a second run
  # with another seed reuses it.
  assert sim.compilations == 1
  sim.run(seed=4)
  assert sim.compilations == 1


def test_traced_values_reach_the_lanes_that_keep_their_setting(laned):
  """A traced drop_prob changes the run and the lanes that keep faults,
  not the no_faults lane (it has no drop_prob); nothing compiles."""
  sim, result = laned
  other = sim.run(seed=3, hparams={"drop_prob": 0.5})
  same = _lanes.metric("no_faults", "train_loss")
  np.testing.assert_array_equal(other.history[same], result.history[same])
  for col in ("train_loss", _lanes.metric("no_stragglers", "train_loss")):
    assert not np.array_equal(other.history[col], result.history[col]), col
  assert sim.compilations == 1


def test_the_lanes_columns_in_metrics_csv(laned, tmp_path):
  sim, result = laned
  out = tmp_path / "run"
  sim.run(seed=3, out=str(out))
  header = (out / "metrics.csv").read_text().splitlines()[0]
  for lane in LANES:
    for col in LOGGED:
      assert _lanes.metric(lane, col) in header
  summary = json.loads((out / "summary.json").read_text())
  assert summary["lane/no_faults/time_cost_s"] == (
      result.summary["lane/no_faults/time_cost_s"])
  config = json.loads((out / "config.json").read_text())
  assert config["memory"]["lane_bytes"] > 0
  assert sim.compilations == 1


def test_the_ddp_lane_equals_a_ddp_run_on_the_same_fleet():
  """lanes=["ddp"]: DDP (one-step rounds, H of them per round of the run,
  and the run's two-step tail as rounds) with the run's inner optimizer,
  on the same faulty, jittery fleet, equals a separate DDP run, bit for
  bit (the separate run chunks its steps its own way)."""
  common = {k: v for k, v in BASE.items()
            if k not in ("byzantine", "codec", "speeds")}
  run = lowbw.simulate(lowbw.Config(**common, lanes=["ddp"], seed=3))
  ddp = {**common, "strategy": "ddp",
         "inner_lr": lowbw.Config(**common).inner_lr}
  del ddp["H"]
  alone = lowbw.simulate(lowbw.Config(**ddp, seed=3))
  for col in LOGGED:
    np.testing.assert_array_equal(run.history[_lanes.metric("ddp", col)],
                                  alone.history[col], err_msg=col)
  assert run.summary["lane/ddp/time_cost_s"] == (
      run.summary["sim_time_s"] - alone.summary["sim_time_s"])


def test_memory_counts_each_lane():
  """Each lane adds about one run's state (its own parameters and
  optimizer states); zero lanes add nothing."""
  plain = lowbw.build(_config(), compile=False).memory
  one = lowbw.build(_config(lanes=["no_faults"]), compile=False).memory
  two = lowbw.build(_config(lanes=["no_faults", "codec=none"]),
                    compile=False).memory
  assert plain.lane_bytes == 0
  assert one.lane_bytes == pytest.approx(plain.state_bytes
                                         + plain.buffer_bytes)
  assert two.lane_bytes > one.lane_bytes
  assert plain.estimate_bytes < one.estimate_bytes < two.estimate_bytes
  assert one.estimate_bytes - plain.estimate_bytes == pytest.approx(
      one.lane_bytes)
  # A budget the run fits and its lane does not: refused, naming it.
  budget = int(plain.estimate_bytes + one.lane_bytes / 2)
  lowbw.build(_config(memory_budget=budget), compile=False)
  with pytest.raises(ValueError, match="memory_budget=.*give fewer lanes"):
    lowbw.build(_config(lanes=["no_faults"], memory_budget=budget),
                compile=False)


@pytest.mark.parametrize("changes, lane, says", [
    (dict(drop_prob=None), "no_faults", "has no drops"),
    (dict(speeds=None, jitter=None), "no_stragglers", "has no uneven"),
    (dict(byzantine=None), "no_byzantine", "has no Byzantine"),
    (dict(), "no_fault", "did you mean 'no_faults'"),
    (dict(), "codec=quant:8", "codec is 'quant:8' already"),
    (dict(), "codec=", "expected codec=SPEC"),
    (dict(strategy="snoo", codec=None, byzantine=None), "codec=none",
     "takes no codec"),
    (dict(), ["no_faults", "no_faults"], "given twice"),
    (dict(strategy="ddp", H=None, byzantine=None), "ddp", "is DDP already"),
    (dict(), "H=5", "the run's H is 5 already"),
    (dict(), "H=five", "H: expected an integer"),
    (dict(), "quorum=3", "'quorum' is not a setting of strategy 'diloco'"),
])
def test_a_bad_lane_is_refused_naming_lanes(changes, lane, says):
  with pytest.raises(ValueError, match="lanes=") as e:
    _config(**changes, lanes=lane)
  assert says in str(e.value)


def test_a_setting_lane_equals_the_run_at_that_setting():
  """``SETTING=VALUE`` lanes: Decoupled DiLoCo (two fragments) with a
  quorum of 1, beside lanes with a quorum of 3 and a plain mean; each
  equals the separate run at that setting, bit for bit."""
  base = dict(data="digits", strategy="decoupled_diloco", H=5, workers=4,
              batch_size=8, hidden="16", steps=30, eval_every=10,
              eval_examples=64, devices=1, progress=False, hardware="0.1s",
              bandwidth="10Mbps", speeds="1,1,0.5,0.25", quorum=1,
              fragments=2, seed=1)
  laned = lowbw.simulate(lowbw.Config(
      **base, lanes=["quorum=3", "token_weighted=false"]))
  for lane, change in (("quorum=3", dict(quorum=3)),
                       ("token_weighted=false", dict(token_weighted=False))):
    alone = lowbw.simulate(lowbw.Config(**{**base, **change}))
    for col in LOGGED:
      np.testing.assert_array_equal(laned.history[_lanes.metric(lane, col)],
                                    alone.history[col], err_msg=col)
    assert laned.summary[f"lane/{lane}/goodput"] == alone.summary["goodput"]
  # A lane whose rounds do not run beside the run's is refused.
  with pytest.raises(ValueError, match="lanes='H=10'.*rounds of 10 steps"):
    lowbw.build(_config(lanes=["H=10"], eval_every=10, steps=20),
                compile=False)


def test_lanes_need_one_device_and_no_checkpoints(tmp_path):
  with pytest.raises(ValueError, match="checkpoint_every"):
    lowbw.simulate(_config(lanes=["no_faults"], checkpoint_every=10,
                           out=str(tmp_path / "r")))


def test_a_sweep_refuses_lanes_and_lanes_leave_run_only_outputs(laned):
  sim, _ = laned
  with pytest.raises(ValueError, match="lanes="):
    lowbw.sweep(sim, grid={"inner_lr": [1e-3, 3e-3]})
  config = _config(lanes=["no_faults"], shadow="ddp", eval_local=True)
  (name, lane, reset), = config.built().lanes
  assert name == "no_faults" and lane.drop_prob is None
  assert "drop_prob" in reset
  assert lane.shadow is None and not lane.eval_local
  assert lane.jitter == config.jitter and lane.codec == config.codec


def test_the_flag_is_repeatable(tmp_path):
  out = tmp_path / "run"
  args = ["train", "--data", "digits", "--strategy", "diloco", "--H", "5",
          "--workers", "4", "--steps", "10", "--hidden", "16",
          "--batch-size", "8", "--drop-prob", "0.25", "--devices", "1",
          "--lane", "no_faults", "--lane", "codec=quant:4",
          "--out", str(out), "--no-plot", "--no-progress"]
  assert cli.main(args) == 0
  summary = json.loads((out / "summary.json").read_text())
  assert {"lane/no_faults/loss_cost",
          "lane/codec=quant:4/loss_cost"} <= set(summary)


def test_a_study_gives_each_cause_a_paired_interval():
  """Over seeds, the final table holds each lane's loss and time cost
  with the paired t-interval of their means."""
  # The fixture's configuration: its program comes from the test session's
  # compilation cache.
  study = lowbw.study(_config(lanes=list(LANES)), grid={}, seeds=[0, 1, 2])
  row = study.final(frame=False)
  costs = [p.summary["lane/no_faults/loss_cost"] for p in study.points]
  low, high = _result.paired_interval(costs)
  assert row["lane/no_faults/loss_cost_mean"][0] == pytest.approx(
      np.mean(costs))
  assert row["lane/no_faults/loss_cost_low"][0] == pytest.approx(low)
  assert row["lane/no_faults/loss_cost_high"][0] == pytest.approx(high)
  assert "lane/no_faults/time_cost_s_low" in row


def test_a_study_over_networks_trains_each_point_with_lanes(tmp_path):
  """A study re-times a point from another's run when only the network
  differs, but not a point with lanes (their clocks and costs would be the
  other network's): each trains, and its time cost is its own run's time
  minus its lane's."""
  # No faults or stragglers: the run's training does not follow its
  # clock, so without lanes the second point would be re-timed.
  config = _config(drop_prob=None, speeds=None, jitter=None, byzantine=None,
                   lanes=["codec=none"])
  study = lowbw.study(config, grid={"bandwidth": ["1Mbps", "100Mbps"]},
                      seeds=[0], out=str(tmp_path / "study"), progress=False)
  for p in study.points:
    s = p.summary
    assert not s.get("retimed_from")
    assert s["lane/codec=none/time_cost_s"] == pytest.approx(
        s["sim_time_s"] - s["lane/codec=none/sim_time_s"])
  times = [p.summary["lane/codec=none/sim_time_s"] for p in study.points]
  assert times[0] > times[1]


def test_a_lane_that_failed_reports_its_error_and_no_costs():
  """A lane whose loss turned non-finite stops where it failed: its last
  figures are a partial run's, so no cost is reported against it."""
  from lowbw.simulation import _lanes
  run = {"final_eval_loss": 1.0, "sim_time_s": 10.0, "goodput": 0.9}
  failed = {"final_eval_loss": 0.5, "sim_time_s": 3.0, "goodput": 0.8,
            "error": "loss is nan at step 7"}
  assert _lanes.costs("no_faults", run, failed) == {
      "lane/no_faults/error": "loss is nan at step 7"}
  ok = _lanes.costs("no_faults", run, {**failed, "error": None})
  assert ok["lane/no_faults/loss_cost"] == 0.5


def test_a_traced_value_never_reaches_the_lane_that_removed_its_setting():
  """A lane without stragglers takes no jitter given at run time, even
  when the run left jitter at its default: its clock is the equal fleet's
  whatever the run's traced values say."""
  config = _config(drop_prob=None, jitter=None, byzantine=None,
                   lanes=["no_stragglers"])
  sim = lowbw.build(config)
  plain = sim.run(seed=0)
  jittered = sim.run(seed=0, hparams={"jitter": 0.5})
  key = "lane/no_stragglers/sim_time_s"
  assert jittered.summary[key] == plain.summary[key]
  assert jittered.summary["sim_time_s"] != plain.summary["sim_time_s"]
