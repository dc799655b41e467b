"""Stage links over simulated time (``stage_bandwidth_trace``): a pipeline's
step follows each hop's bandwidth as its trace says, against step times
worked out by hand; bad traces are refused naming the setting."""

import math

import numpy as np
import pytest

import lowbw
from lowbw import ConfigError

B, T, D = 2, 8, 16  # a worker's batch, the window, the width
MESSAGE = 4 * B * T * D  # one float32 activation (or gradient) per hop


def _write(tmp_path, name, rows):
  path = tmp_path / name
  path.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
  return str(path)


def _config(tmp_path, **kw):
  text = tmp_path / "text"  # apart from the trace files
  text.mkdir(exist_ok=True)
  (text / "a.txt").write_text("hello world, the quick brown fox. " * 300)
  return lowbw.Config(**{
      **dict(model="gpt", layers=3, d_model=D, heads=2, seq_len=T,
             data="text", data_root=str(text), strategy="ddp",
             workers=2, batch_size=B, steps=6, log_every=1, progress=False),
      **({} if kw.get("clock") is False else NET), **kw})


NET = dict(hardware="1s", bandwidth="1000Tbps", latency="0ms",
           network_profile="ideal")


def _by_hand(sim_time, hops_at, latency):
  """Each step's time, one micro-batch (the stages in series): the whole
  model's 1 s of compute, and on every hop the activation forward and its
  gradient back, each ``8 * MESSAGE / bandwidth`` plus the latency, at the
  hops' bandwidths when the step (its round: DDP syncs every step) starts."""
  starts = np.concatenate([[0.0], sim_time[:-1]])
  return np.array([1.0 + sum(2 * (8 * MESSAGE / bw + latency)
                             for bw in hops_at(t)) for t in starts])


# Three stages, each hop a link of its own: the same run with the second
# hop's bandwidth halving at 2.5 s (a trace per hop), and with fixed links.
PIPE = dict(stages=3, stage_latency="1ms")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("links")
  first = _write(root, "a.csv", [("time", "bw"), (0, "1Mbps")])
  second = _write(root, "b.csv", [("time", "bw"), (0, "2Mbps"),
                                  ("2.5s", "1Mbps")])
  traced = lowbw.simulate(_config(
      root, **PIPE, stage_bandwidth_trace=f"{first},{second}",
      out=str(root / "traced")))
  fixed = lowbw.simulate(_config(root, **PIPE, stage_bandwidth="1Mbps,2Mbps",
                                 out=str(root / "fixed")))
  return root, traced, fixed


def test_each_hop_follows_its_own_trace(runs):
  """The first hop keeps 1 Mbps (and a 1 ms latency), the second's
  bandwidth halves, from 2 Mbps to 1 Mbps, at 2.5 s. Each step's time is
  worked out by hand from the hops in force when it starts."""
  _, r, _ = runs
  sim_time = r.history["sim_time_s"]
  steps = _by_hand(sim_time, lambda t: [1e6, 2e6 if t < 2.5 else 1e6], 1e-3)
  # The all-reduce on 1000 Tbps takes under a microsecond a step.
  np.testing.assert_allclose(np.diff(sim_time, prepend=0.0), steps,
                             rtol=1e-5, atol=1e-6)
  assert steps[0] < steps[-1]  # the trace changed the run
  assert sum(steps < steps[-1]) == 3  # the steps from 0, 1.03 s and 2.06 s
  # Goodput: every step merged, over the steps the fleet could have taken,
  # each stretch of the trace at its own step (the first 2.5 s at the
  # first steps', the rest at the last steps').
  capacity = 2.5 / steps[0] + (sim_time[-1] - 2.5) / steps[-1]
  assert r.summary["goodput"] == pytest.approx(len(steps) / capacity,
                                               rel=1e-5)


def test_a_one_row_trace_prices_as_a_constant_link(tmp_path):
  """A trace of one row times the pipeline as stage_bandwidth does; a
  trace that changes prices each stretch of time as that bandwidth would
  (the clock's prices, without running)."""
  from lowbw.network import _clock
  from lowbw.simulation._api import engine_config

  def priced(**kw):
    config = _config(tmp_path, stages=2, **kw)
    net = config.built().checked["network"]
    return _clock.price(net, {}, 2, 1000, 1.0,
                        pipeline=engine_config(config).pipeline)
  one = _write(tmp_path, "one.csv", [("time", "bw"), (0, "3Mbps")])
  two = _write(tmp_path, "two.csv", [("time", "bw"), (0, "3Mbps"),
                                     ("1h", "5Mbps")])
  fixed = {bw: priced(stage_bandwidth=bw) for bw in ("3Mbps", "5Mbps")}
  assert priced(stage_bandwidth_trace=one).step_s == fixed["3Mbps"].step_s
  assert len(priced(stage_bandwidth_trace=one).segments) == 1
  changing = priced(stage_bandwidth_trace=two)
  assert [start for start, _, _ in changing.segments] == [0.0, 3600.0]
  assert changing.segment_step_s == tuple(
      (fixed[bw].step_s,) * 2 for bw in ("3Mbps", "5Mbps"))
  assert fixed["3Mbps"].step_s > fixed["5Mbps"].step_s


def test_the_runs_pipeline_holds_the_traces(tmp_path):
  from lowbw.simulation._api import engine_config
  trace = _write(tmp_path, "hop.csv", [("time", "bw"), (0, "1Mbps"),
                                       ("1min", "2Mbps")])
  p = engine_config(_config(tmp_path, stages=3,
                            stage_bandwidth_trace=trace)).pipeline
  assert p.bandwidth == (1e6, 1e6) and len(p.bandwidth_trace) == 2
  assert p.at(59.0).bandwidth == (1e6, 1e6)
  assert p.at(60.0).bandwidth == (2e6, 2e6)


@pytest.mark.parametrize("settings,match", [
    ({"stage_bandwidth_trace": "TRACE"},
     "stage_bandwidth_trace.*needs stages >= 2"),
    ({"stages": 2, "stage_bandwidth_trace": "missing.csv"},
     "stage_bandwidth_trace='missing.csv'.*cannot read the trace file"),
    ({"stages": 2, "stage_bandwidth_trace": "TRACE,TRACE"},
     "stage_bandwidth_trace.*one trace file for every hop or one per hop, "
     "1 \\(stages=2\\); 2 given"),
    ({"stages": 3, "stage_bandwidth_trace": "TRACE,TRACE,TRACE"},
     "stage_bandwidth_trace.*one per hop, 2 \\(stages=3\\); 3 given"),
    ({"stages": 2, "stage_bandwidth_trace": "WIDE"},
     "stage_bandwidth_trace.*2 values per row; expected one"),
    ({"stages": 2, "stage_bandwidth_trace": "TRACE",
      "stage_bandwidth": "1Gbps"}, "stage_bandwidth_trace.*not both"),
    ({"stages": 2, "stage_bandwidth_trace": "TRACE", "clock": False},
     "stage_bandwidth_trace.*not used: with clock=False"),
    ({"stages": 2, "stage_bandwidth_trace": "LATE"},
     "stage_bandwidth_trace.*first row must be at time 0"),
])
def test_bad_stage_traces_name_the_field(tmp_path, settings, match):
  files = {"TRACE": [("time", "bw"), (0, "1Mbps")],
           "WIDE": [("time", "a", "b"), (0, "1Mbps", "1Mbps")],
           "LATE": [("time", "bw"), (5, "1Mbps")]}
  for name, rows in files.items():
    path = _write(tmp_path, name.lower() + ".csv", rows)
    settings = {k: v.replace(name, path) if isinstance(v, str) else v
                for k, v in settings.items()}
  with pytest.raises(ConfigError, match=match):
    lowbw.build(_config(tmp_path, **settings))


def test_stage_traces_belong_to_the_gpt(tmp_path):
  with pytest.raises(ConfigError,
                     match="stage_bandwidth_trace.*not used by model 'mlp'"):
    lowbw.Config(model="mlp", data="digits", stage_bandwidth_trace="a.csv")


# -- re-timing a pipeline run on other stage links -------------------------------

def _net(root):
  return _config(root, **PIPE).built().checked["network"]


def test_retime_on_other_stage_links_equals_a_fresh_run(runs):
  """The traced run re-timed on the fixed links takes the fixed run's
  time, step by step: the boundary bytes are the run's, only the hops'
  times change (the training is the same: stage links never change it)."""
  root, traced, fixed = runs
  np.testing.assert_array_equal(traced.history["train_loss"],
                                fixed.history["train_loss"])
  r = lowbw.retime(traced.summary["log_dir"], _net(root),
                   stage_bandwidth="1Mbps,2Mbps")
  assert r["sim_time_s"] == pytest.approx(fixed.summary["sim_time_s"],
                                          rel=1e-6)
  np.testing.assert_allclose(r["history"]["sim_time_s"],
                             fixed.history["sim_time_s"], rtol=1e-6)
  assert r["network"]["stage_bandwidth_bps"] == [1e6, 2e6]


def test_retime_on_other_stage_links_against_steps_by_hand(runs):
  root, _, fixed = runs
  r = lowbw.retime(fixed.summary["log_dir"], _net(root),
                   stage_bandwidth=["4Mbps", "250kbps"], stage_latency="3ms")
  times = r["history"]["sim_time_s"]
  np.testing.assert_allclose(
      np.diff(times, prepend=0.0),
      _by_hand(times, lambda t: [4e6, 2.5e5], 3e-3), rtol=1e-5, atol=1e-6)
  # Free links: the model's compute alone (and the sub-microsecond sync).
  free = lowbw.retime(fixed.summary["log_dir"], _net(root),
                      stage_bandwidth=math.inf, stage_latency=0)
  np.testing.assert_allclose(np.diff(free["history"]["sim_time_s"],
                                     prepend=0.0), 1.0, atol=1e-5)
  # Not given: the run's own links.
  own = lowbw.retime(fixed.summary["log_dir"], _net(root))
  assert own["sim_time_s"] == pytest.approx(fixed.summary["sim_time_s"],
                                            rel=1e-6)


def test_retime_refusals_name_the_setting(runs, tmp_path):
  root, traced, fixed = runs
  with pytest.raises(ConfigError, match="stage links followed a trace.*"
                     "give stage_bandwidth"):
    lowbw.retime(traced.summary["log_dir"], _net(root))
  with pytest.raises(ConfigError, match="stage_bandwidth.*one per hop, 2 "
                     "\\(the run's stages: 3\\)"):
    lowbw.retime(fixed.summary["log_dir"], _net(root),
                 stage_bandwidth="1Mbps,2Mbps,3Mbps")
  with pytest.raises(ConfigError, match="stage_latency='soon'"):
    lowbw.retime(fixed.summary["log_dir"], _net(root), stage_latency="soon")
  plain = lowbw.simulate(_config(tmp_path, steps=2, out=str(tmp_path / "p")))
  with pytest.raises(ConfigError, match="stage_bandwidth.*ran without "
                     "stages"):
    lowbw.retime(plain.summary["log_dir"], _net(root),
                 stage_bandwidth="1Mbps")


def test_retime_command_takes_the_stage_links(runs, capsys):
  import json
  from lowbw.cli import main
  root, _, fixed = runs
  assert main(["retime", fixed.summary["log_dir"], "--stage-bandwidth",
               "4Mbps,250kbps", "--stage-latency", "3ms", "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  r = lowbw.retime(fixed.summary["log_dir"], _net(root),
                   stage_bandwidth="4Mbps,250kbps", stage_latency="3ms")
  assert printed["sim_time_s"] == pytest.approx(r["sim_time_s"], rel=1e-9)
  assert printed["sim_time_s"] > fixed.summary["sim_time_s"]


def test_a_study_over_stage_links_trains_once(tmp_path):
  """Stage links change only the clock: a study over them trains the first
  point and re-times the others, each at its own links' steps."""
  base = _config(tmp_path, stages=2, steps=3).to_dict()
  study = lowbw.study(base, {"stage_bandwidth": ["1Mbps", "250kbps"]},
                      out=str(tmp_path / "s"), progress=False, plots=False)
  first, second = study.points
  assert not first.summary.get("retimed_from")
  assert second.summary["retimed_from"]
  for point, bw in ((first, 1e6), (second, 2.5e5)):
    times = point.history["sim_time_s"]
    np.testing.assert_allclose(np.diff(times, prepend=0.0),
                               _by_hand(times, lambda t: [bw], 0.0),
                               rtol=1e-5, atol=1e-6)
