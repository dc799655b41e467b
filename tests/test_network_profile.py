"""The clock's terms beyond latency + bytes / bandwidth (``Profile``): a
collective reaches a fraction of the link that depends on its bandwidth,
every collective call costs a fixed time, the first communication sets up
the communicator, and the host adds time to every step. Each is checked
against the ideal clock plus the term computed by hand."""

import math

import numpy as np
import pytest

import lowbw
from lowbw import cli
from lowbw import network as net_lib
from lowbw.network import _profile

W, H, STEPS, BW, LAT, STEP_S = 4, 4, 12, 100e6, 0.01, 0.01
RUN = dict(data="digits", model="mlp", hidden="8", workers=W, batch_size=4,
           steps=STEPS, H=H, eval_examples=16, progress=False,
           bandwidth="100Mbps", latency="10ms", hardware="0.01s")


def _sim_time(**changes) -> float:
  return lowbw.simulate(**{**RUN, **changes}).summary["sim_time_s"]


def _ring_s(payload_bytes: float, bandwidth: float) -> float:
  """Ring all-reduce by hand: 2(W-1) hops of payload/W bytes."""
  return 2 * (W - 1) * (LAT + 8 * payload_bytes / W / bandwidth)


def test_efficiency_is_interpolated_in_log_bandwidth_and_clamped():
  p = _profile.CALIBRATED
  assert p.efficiency_at(10e6) == p.efficiency_at(50e6) == 0.79
  assert p.efficiency_at(100e6) == pytest.approx(
      0.79 + (0.907 - 0.79) * math.log(2) / math.log(4))
  assert p.efficiency_at(1e9) == 1.0 and p.efficiency_at(100e9) == 0.989
  assert _profile.IDEAL.efficiency_at(50e6) == 1.0


@pytest.fixture(scope="module")
def ideal_and_calibrated():
  ideal = lowbw.simulate(**RUN, network_profile="ideal")
  calibrated = lowbw.simulate(**RUN)  # the default profile
  return ideal, calibrated


def test_the_calibrated_clock_is_the_ideal_one_plus_each_term_by_hand(
    ideal_and_calibrated):
  ideal, calibrated = ideal_and_calibrated
  p = _profile.CALIBRATED
  payload = 4 * ideal.summary["num_params"]  # a float32 pseudo-gradient
  syncs = STEPS // H
  assert ideal.summary["sim_time_s"] == pytest.approx(
      STEPS * STEP_S + syncs * _ring_s(payload, BW), rel=1e-6)
  per_sync = p.per_call_s + _ring_s(payload, BW * p.efficiency_at(BW))
  assert calibrated.summary["sim_time_s"] == pytest.approx(
      STEPS * STEP_S + syncs * per_sync + p.startup_s, rel=1e-6)
  # Only the clock moves: the training and the bytes are the same.
  np.testing.assert_array_equal(ideal.history["train_loss"],
                                calibrated.history["train_loss"])
  assert ideal.summary["wire_bytes"] == calibrated.summary["wire_bytes"]


def test_the_start_up_is_paid_once_at_the_first_sync(ideal_and_calibrated):
  ideal, calibrated = ideal_and_calibrated
  steps = ideal.history["step"]
  gap = calibrated.history["sim_time_s"] - ideal.history["sim_time_s"]
  before = gap[steps < H]
  assert np.all(before == 0)  # nothing communicated yet
  first_sync = gap[steps == H][0]
  last = gap[steps == STEPS][0]
  per_sync_extra = (last - first_sync) / (STEPS // H - 1)
  assert first_sync - per_sync_extra == pytest.approx(
      _profile.CALIBRATED.startup_s, rel=1e-5)


def test_one_call_per_tensor_and_host_time_per_step(tmp_path):
  base = _sim_time(network_profile="ideal")
  profile = _profile.Profile(efficiency=((1.0, 1.0),), per_call_s=0.002,
                             calls="per_tensor", startup_s=0.0, host_s=0.003)
  path = _profile.save(profile, tmp_path / "p.yaml")
  tensors = 4  # the MLP's two weight matrices and two biases
  assert _sim_time(network_profile=str(path)) == pytest.approx(
      base + (STEPS // H) * tensors * 0.002 + STEPS * 0.003, rel=1e-6)


def test_a_profile_file_round_trips_and_bad_terms_name_themselves(tmp_path):
  p = _profile.Profile(efficiency=((1e8, 0.5), (1e9, 0.9)), calls=57)
  assert _profile.load(_profile.save(p, tmp_path / "p.yaml")) == p
  assert net_lib.network(profile=p).profile == p
  bad = {"efficiency": ((1e9, 0.5), (1e8, 0.9)), "per_call_s": -1.0,
         "calls": "all", "startup_s": math.inf, "host_s": True,
         "bucketed_allreduce": "butterfly", "bucketed_overlap": 1.5}
  for term, value in bad.items():
    with pytest.raises(lowbw.ConfigError, match=rf"^{term}=.* is invalid"):
      net_lib.network(profile=p._replace(**{term: value}))
  (tmp_path / "odd.yaml").write_text("per_call: 1\n")
  with pytest.raises(lowbw.ConfigError, match="'per_call' is not a term"):
    net_lib.profile(str(tmp_path / "odd.yaml"))
  (tmp_path / "list.yaml").write_text("- 1\n")
  with pytest.raises(lowbw.ConfigError, match="expected a YAML table"):
    net_lib.profile(str(tmp_path / "list.yaml"))
  with pytest.raises(lowbw.ConfigError, match="^network_profile='fast' is "
                     "invalid: expected 'calibrated' or 'ideal'"):
    lowbw.Config(data="digits", network_profile="fast")


def test_the_command_line_takes_a_profile_file(tmp_path, capsys):
  path = _profile.save(_profile.IDEAL._replace(startup_s=2.0),
                       tmp_path / "p.yaml")
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
          "--steps", "4", "--H", "2", "--eval-every", "2", "--no-plot",
          "--no-progress", "--hardware", "0.01s"]
  assert cli.main(argv + ["--network-profile", str(path), "--out",
                          str(tmp_path / "a")]) == 0
  assert cli.main(argv + ["--network-profile", "ideal", "--out",
                          str(tmp_path / "b")]) == 0
  a = lowbw.load(str(tmp_path / "a")).summary["sim_time_s"]
  b = lowbw.load(str(tmp_path / "b")).summary["sim_time_s"]
  assert a - b == pytest.approx(2.0, rel=1e-6)


def test_the_calibrated_default_is_the_fit_of_the_committed_measurements():
  # One source for the defaults: lowbw calibrate's fit of the measured runs
  # in benchmarks/calibration, rounded (docs/calibration.md shows the data).
  import os
  from lowbw.network import _calibrate
  path = os.path.join(os.path.dirname(__file__), "..", "benchmarks",
                      "calibration", "measurements.csv")
  fitted = _calibrate.fit(_calibrate.read_rows(path))
  default = _profile.CALIBRATED
  assert len(fitted.efficiency) == len(default.efficiency)
  for (b, e), (b0, e0) in zip(fitted.efficiency, default.efficiency):
    assert b == pytest.approx(b0, rel=0.01) and e == pytest.approx(e0, abs=0.002)
  assert fitted.per_call_s == pytest.approx(default.per_call_s, rel=0.01)
  assert fitted.startup_s == pytest.approx(default.startup_s, rel=0.01)
  assert fitted.bucketed_allreduce == default.bucketed_allreduce == "tree"


def _tree_s(payload_bytes: float, bandwidth: float) -> float:
  """A double binary tree all-reduce of 4 members by hand: the busiest
  member sends 2 x payload, and a latency per level up and down two
  levels."""
  return 8 * 2 * payload_bytes / bandwidth + 4 * LAT


def test_the_busiest_member_of_a_double_binary_tree_sends_twice_the_payload():
  # NCCL's two trees of 4 ranks, spelled out: 0 -> 2 -> {1, 3}, and its
  # mirror 3 -> 1 -> {2, 0}; each carries half the payload, up and down.
  from lowbw.network._collectives import tree_allreduce_wire
  trees = [{0: None, 2: 0, 1: 2, 3: 2}, {3: None, 1: 3, 2: 1, 0: 1}]
  sent = dict.fromkeys(range(4), 0.0)
  for parent in trees:
    for rank, up in parent.items():
      children = sum(1 for p in parent.values() if p == rank)
      sent[rank] += 0.5 * ((up is not None) + children)
  assert max(sent.values()) == tree_allreduce_wire(1.0, 4) == 2.0
  assert tree_allreduce_wire(1.0, 2) == 1.0 and tree_allreduce_wire(1.0, 1) == 0


@pytest.fixture(scope="module")
def ddp_runs():
  ddp = dict(RUN, strategy="ddp")
  del ddp["H"]
  return {name: lowbw.simulate(**ddp, network_profile=p) for name, p in (
      ("ideal", "ideal"), ("calibrated", "calibrated"),
      ("ring", _profile.CALIBRATED._replace(bucketed_allreduce="ring")))}


def test_a_strategy_that_communicates_every_step_pays_the_start_up_once(
    ddp_runs):
  # DDP all-reduces every step (no round sync): the communicator is set up
  # before its first step's all-reduce. Its bucketed all-reduce is timed as
  # a tree under the calibrated profile.
  ideal, calibrated = ddp_runs["ideal"], ddp_runs["calibrated"]
  p = _profile.CALIBRATED
  assert p.bucketed_allreduce == "tree"
  payload = 4 * ideal.summary["num_params"]  # a float32 gradient
  # 2/3 of each step's compute hides the all-reduce (the backward pass).
  extra = STEPS * (p.per_call_s + _tree_s(payload, BW * p.efficiency_at(BW))
                   - 2 / 3 * STEP_S - _ring_s(payload, BW))
  assert p.bucketed_overlap == pytest.approx(2 / 3)
  assert calibrated.summary["sim_time_s"] - ideal.summary["sim_time_s"] == (
      pytest.approx(p.startup_s + extra, rel=1e-5))
  gap = calibrated.history["sim_time_s"] - ideal.history["sim_time_s"]
  assert gap[0] == pytest.approx(p.startup_s + extra / STEPS, rel=1e-4)


def test_a_bucketed_all_reduce_timed_as_a_ring_logs_the_same_bytes(ddp_runs):
  ideal, ring = ddp_runs["ideal"], ddp_runs["ring"]
  p = _profile.CALIBRATED
  payload = 4 * ideal.summary["num_params"]
  extra = STEPS * (p.per_call_s + _ring_s(payload, BW * p.efficiency_at(BW))
                   - 2 / 3 * STEP_S - _ring_s(payload, BW))
  assert ring.summary["sim_time_s"] - ideal.summary["sim_time_s"] == (
      pytest.approx(p.startup_s + extra, rel=1e-5))
  # The profile times the real reducer; the bytes are lowbw's own ring's.
  for run in ddp_runs.values():
    assert run.summary["sent_bytes"] == ideal.summary["sent_bytes"] == (
        STEPS * W * 2 * (W - 1) / W * payload)


def test_only_a_bucketed_all_reduce_is_timed_as_a_tree():
  from lowbw.network import _clock
  from lowbw.network._collectives import all_gather, ring_allreduce
  net = net_lib.network("100Mbps", "10ms", profile="calibrated")
  explicit, gathered = ring_allreduce(4000, W), all_gather(4000, W)
  costs = _clock.channel_costs(net, {
      "explicit": explicit, "bucketed": explicit._replace(bucketed=True),
      "gathered": gathered._replace(bucketed=True)}, W)
  bw = BW * _profile.CALIBRATED.efficiency_at(BW)
  call = _profile.CALIBRATED.per_call_s
  assert costs["explicit"].seconds == pytest.approx(_ring_s(4000, bw) + call)
  assert costs["bucketed"].seconds == pytest.approx(_tree_s(4000, bw) + call)
  assert costs["gathered"].seconds == pytest.approx(
      (W - 1) * (LAT + 8 * 4000 / bw) + call)


def test_the_planner_prices_a_sync_as_a_simulated_run_does():
  """One link model: lowbw plan's sync (the planner document's upload and
  download, the clock's parameter-server collective) and its time per
  round equal a simulated lock-step DiLoCo run's on the same link, bytes,
  compute per step and profile."""
  run = lowbw.simulate(**{**RUN, "topology": "parameter_server"})
  (sync_s,) = run.config["network"]["comm_s_per_event"].values()
  bits = 8 * 4 * run.summary["num_params"]  # a float32 pseudo-gradient
  params_b = 2e-5  # the plan's model: its payload made the run's bits
  planned = net_lib.plan(
      parameters=params_b, compression=params_b * 1e9 * 16 / bits,
      bandwidth="100Mbps", latency="10ms", network_profile="calibrated",
      num_nodes=W, inner_steps=H, straggler_mitigation="threshold",
      streaming=False, local_batch=1, mfu=0.5,
      pflops_per_node=6 * params_b * 1e9 / (STEP_S * 1e15 * 0.5))
  assert planned["mode"] == "diloco"
  assert planned["t_sync_s"] == pytest.approx(sync_s, rel=1e-9)
  rounds = STEPS // H
  per_round = (run.summary["sim_time_s"] - _profile.CALIBRATED.startup_s) / (
      rounds)
  assert planned["t_outer_s"] == pytest.approx(per_round, rel=1e-6)


def test_a_run_from_before_profiles_resumes_on_the_ideal_clock(tmp_path):
  # A checkpoint written before network profiles has no network.profile in
  # its config.json: it ran on the ideal clock, and resumes on it, from the
  # command line by default.
  import json
  out = tmp_path / "old"
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
          "--steps", "8", "--H", "4", "--eval-every", "4", "--no-plot",
          "--no-progress", "--hardware", "0.01s", "--checkpoint-every", "4"]
  assert cli.main(argv + ["--network-profile", "ideal", "--out",
                          str(out)]) == 0
  record = json.loads((out / "config.json").read_text())
  del record["network"]["profile"]  # as the run was written then
  record["metadata"]["train_args"].pop("network_profile", None)
  (out / "config.json").write_text(json.dumps(record))
  assert cli.main(["train", "--resume", str(out), "--steps", "12",
                   "--no-progress", "--no-plot"]) == 0
  resumed = json.loads((out / "summary.json").read_text())
  assert resumed["steps"] == 12


def test_a_run_from_before_a_profile_term_resumes(tmp_path):
  # A checkpoint whose profile lacks a term added since (here
  # bucketed_allreduce) is not refused for it.
  import json
  out = tmp_path / "old"
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
          "--steps", "8", "--H", "4", "--eval-every", "4", "--no-plot",
          "--no-progress", "--hardware", "0.01s", "--checkpoint-every", "4"]
  assert cli.main(argv + ["--out", str(out)]) == 0

  def strip(value):
    if isinstance(value, dict):
      return {k: strip(v) for k, v in value.items()
              if k != "bucketed_allreduce"}
    return [strip(v) for v in value] if isinstance(value, list) else value
  edited = 0  # config.json and the checkpoints' JSON, as written then
  for path in out.rglob("*"):
    if path.is_file() and b"bucketed_allreduce" in path.read_bytes():
      path.write_text(json.dumps(strip(json.loads(path.read_text()))))
      edited += 1
  assert edited >= 2
  assert cli.main(["train", "--resume", str(out), "--steps", "12",
                   "--no-progress", "--no-plot"]) == 0
  assert json.loads((out / "summary.json").read_text())["steps"] == 12


@pytest.mark.parametrize("changes, warned", [
    ({}, True),                                # 30M parameters at MFU 0.4
    ({"mfu": 0.2}, False),                     # an MFU given
    ({"bandwidth": "10Mbps"}, False),          # compute is < 10 % of time
])
def test_the_default_mfu_on_a_small_model_is_warned_where_compute_counts(
    changes, warned):
  run = dict(data="digits", model="mlp", hidden="8", workers=2, steps=4, H=2,
             eval_examples=16, progress=False, clock_params=30_000_000,
             bandwidth="100Gbps", latency="0ms", hardware="1TFLOPS")
  summary = lowbw.simulate(**{**run, **changes}).summary
  said = [w for w in summary["warnings"] if "priced at MFU 0.4" in w]
  assert bool(said) == warned
  if warned:
    compute = 1 - summary["comm_share"]
    assert f"compute is {100 * compute:.0f}% of the nominal time" in said[0]
    assert "30,000,000 parameters" in said[0]


def test_the_default_mfu_is_assumed_only_for_a_small_model_priced_by_flops():
  from lowbw.network import _clock
  small = net_lib.network(hardware="1TFLOPS", clock_params=30_000_000)
  assert _clock.assumed_mfu(small, 610) == 30_000_000
  assert _clock.assumed_mfu(small._replace(clock_params=None), 610) == 610
  assert _clock.assumed_mfu(net_lib.network(
      hardware="1TFLOPS", clock_params=2_000_000_000), 610) is None
  assert _clock.assumed_mfu(net_lib.network(hardware="0.05s"), 610) is None
  assert _clock.assumed_mfu(net_lib.network(hardware="1TFLOPS", mfu=0.2),
                            610) is None


def test_the_planner_notes_the_default_mfu_on_a_small_model():
  from lowbw.network import _planner
  assert any("mfu=0.4 is the default" in n
             for n in _planner.plan(parameters=0.03)["warnings"])
  assert not any("is the default" in n for n in _planner.plan(
      parameters=0.03, mfu=0.16).get("warnings") or ())
  assert not any("is the default" in n for n in _planner.plan(
      parameters=7)["warnings"] or ())


def test_a_described_profile_reads_back_and_a_missing_term_is_the_ideal_one(
    tmp_path):
  p = _profile.CALIBRATED._replace(per_call_s=0.002, calls=57)
  assert _profile.from_description(p.describe()) == p
  old = {k: v for k, v in p.describe().items() if k != "bucketed_allreduce"}
  assert _profile.from_description(old).bucketed_allreduce == "ring"
  # A YAML file's missing term is the calibrated default's.
  (tmp_path / "p.yaml").write_text("per_call_s: 0.002\n")
  assert net_lib.profile(str(tmp_path / "p.yaml")) == (
      _profile.CALIBRATED._replace(per_call_s=0.002))


def test_a_worker_that_joins_pays_the_start_up_again():
  # Worker 1 joins at step 4: its catch-up download opens its connections,
  # so the start-up is paid at the run's first sync and again at the join.
  run = dict(RUN, workers=2, joins="1@4")
  times = [lowbw.simulate(**run, network_profile=_profile.CALIBRATED._replace(
      startup_s=s)).summary["sim_time_s"] for s in (0.0, 1.0)]
  assert times[1] - times[0] == pytest.approx(2.0, rel=1e-6)


def test_a_config_file_keeps_a_profile_as_its_terms(tmp_path):
  # A profile file or object is written into config.yaml as its terms, so
  # the file stands alone once the profile's own file is gone; a config
  # file may give such a table (a term left out is the default's).
  path = tmp_path / "p.yaml"
  p = _profile.CALIBRATED._replace(per_call_s=0.002, calls=57)
  _profile.save(p, path)
  for given in (str(path), p):
    saved = lowbw.Config(**RUN, network_profile=given).save(
        str(tmp_path / "c.yaml"))
    path.unlink(missing_ok=True)
    again = lowbw.Config.load(saved)
    assert net_lib.profile(again.network_profile) == p
    _profile.save(p, path)
  (tmp_path / "t.yaml").write_text("data: digits\nnetwork_profile:\n"
                                   "  per_call_s: 0.004\n")
  table = lowbw.Config.load(str(tmp_path / "t.yaml")).network_profile
  assert net_lib.profile(table) == _profile.CALIBRATED._replace(
      per_call_s=0.004)
  (tmp_path / "bad.yaml").write_text("data: digits\nnetwork_profile:\n"
                                     "  per_call: 0.004\n")
  with pytest.raises(lowbw.ConfigError, match="'per_call' is not a term"):
    lowbw.Config.load(str(tmp_path / "bad.yaml"))
  assert lowbw.Config(**RUN).to_yaml().count("network_profile: calibrated")


def test_a_bucketed_all_reduce_hides_behind_the_backward_pass():
  # price(): a step waits for what is left of a bucketed all-reduce after
  # bucketed_overlap of the device's step; an explicit one is not hidden.
  from lowbw.network._collectives import ring_allreduce
  explicit = ring_allreduce(40_000, W)
  channels = {"explicit": explicit, "bucketed": explicit._replace(
      bucketed=True)}
  for step_s in (0.001, 1.0):  # hides part of it; hides all of it
    net = net_lib.network("100Mbps", "10ms", hardware=f"{step_s}s",
                          profile=_profile.CALIBRATED._replace(
                              bucketed_allreduce="ring"))
    pricing = net_lib.price(net, channels, W, 10_000, 1.0)
    whole = pricing.clock_costs["explicit"].seconds
    assert pricing.clock_costs["bucketed"].seconds == pytest.approx(
        max(whole - 2 / 3 * step_s, 0.0))
    assert pricing.costs["bucketed"].wire_bytes == (
        pricing.costs["explicit"].wire_bytes)
