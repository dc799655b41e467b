"""``lowbw.retime``: a finished run's simulated time on another network equals
a re-run's on that network, for every strategy whose training does not
follow its clock; the others, and networks that would change the training,
are refused with one line naming the run and the reason."""

import json
import types

import numpy as np
import pytest

import lowbw
from lowbw import network as N
from lowbw import strategies
from lowbw.cli import main
from lowbw.simulation import _ledger

SMALL = dict(model="mlp", data="digits", hidden=8, batch_size=8, steps=8,
             log_every=1, bandwidth="100Mbps", latency="10ms",
             hardware="0.01s")
# The other network of the per-strategy test: its traced values, so the
# re-run reuses the first run's programs.
OTHER = {"bandwidth": "7Mbps", "latency": "40ms"}


def _fields(name: str) -> dict:
  """Small settings of strategy ``name``: H = 4 (two rounds) where it has
  one."""
  params = {p.name for p in strategies.spec(name).params}
  out = {**SMALL, "strategy": name, "workers": 2}
  if name == "spes":  # needs a mixture-of-experts model: the smallest
    del out["hidden"]
  if "H" in params:
    out["H"] = 4
  return out | {
      "hierarchical_diloco": dict(workers=4, groups=2),
      "desloc": dict(Kx=4, Ku=4, Kv=4),
      "mtdao": dict(Kx=4),
      "spes": dict(model="moe_gpt", data="text", layers=1, d_model=8,
                   heads=2, experts=2, top_k=1, expert_hidden=8, seq_len=8,
                   merge_top_k=1, merge_warmup_steps=4,
                   merge_every=4),
  }.get(name, {})


def _timing_independent(name: str) -> bool:
  s = strategies.get(name)
  return not s.asynchronous and not s.time_budget


RETIMABLE = [n for n in strategies.SPECS if _timing_independent(n)]
REFUSED = [n for n in strategies.SPECS if not _timing_independent(n)]

_RUNS: dict = {}


def _source(name: str, tmp_path_factory):
  """(log folder of a run of ``name`` on the first network, the same run
  re-run on ``OTHER``); one build per strategy, kept for the module."""
  if name not in _RUNS:
    sim = lowbw.build(**_fields(name))
    out = str(tmp_path_factory.mktemp(name))
    first = sim.run(out=out)
    again = sim.run(hparams=OTHER)
    _RUNS[name] = (out, first, again)
  return _RUNS[name]


def _other(**kw) -> N.Network:
  return N.network(OTHER["bandwidth"], OTHER["latency"], hardware="0.01s",
                   **kw)


def _assert_same(r: dict, result) -> None:
  """``retime``'s answer equals ``result``'s (a re-run) clock."""
  s = result.summary
  assert r["sim_time_s"] == pytest.approx(s["sim_time_s"], rel=1e-6)
  assert r["compute_s"] == pytest.approx(s["compute_s"], rel=1e-6)
  assert r["comm_s"] == pytest.approx(s["comm_s"], rel=1e-6)
  assert r["compute_share"] == pytest.approx(1 - s["comm_share"], rel=1e-6)
  np.testing.assert_array_equal(r["history"]["step"], result.history["step"])
  np.testing.assert_allclose(r["history"]["sim_time_s"],
                             result.history["sim_time_s"], rtol=1e-6)


@pytest.mark.parametrize("name", RETIMABLE)
def test_retime_equals_a_rerun(name, tmp_path_factory):
  out, first, again = _source(name, tmp_path_factory)
  _assert_same(lowbw.retime(out, _other()), again)
  # On its own network: the run as it ran.
  same = lowbw.retime(out, N.network(SMALL["bandwidth"], SMALL["latency"],
                                     hardware=SMALL["hardware"]))
  _assert_same(same, first)
  assert same["original_sim_time_s"] == first.summary["sim_time_s"]


def _profile() -> N.Profile:
  """A start-up, a cost per call and host time, all large enough to
  show."""
  return N.Profile(startup_s=1.5, per_call_s=0.01, calls="per_tensor",
                   host_s=0.002)


# (strategy, the other network's settings): compiled again, as they fix
# the program's shape. diloco runs 8 steps of H = 4 plus no tail; its
# tail case is below.
SHAPED = [
    ("ddp", dict(profile=_profile(), speeds=[1.0, 0.5], clock_params="1M")),
    ("diloco", dict(profile=_profile(), overlap=True,
                    topology="parameter_server", upload_bandwidth="2Mbps")),
    ("sparta_diloco", dict(profile=_profile(), hardware="a100", mfu=0.2)),
    ("streaming_diloco", dict(profile="ideal", speeds=[0.7, 1.0],
                              upload_bandwidth=["1Mbps", "3Mbps"])),
    ("hierarchical_diloco", dict(topology="hierarchical", group_size=2,
                                 regional_bandwidth="1Gbps",
                                 regional_latency="2ms", profile=_profile())),
]


@pytest.mark.parametrize("name,settings", SHAPED, ids=[n for n, _ in SHAPED])
def test_retime_on_networks_of_another_shape(name, settings,
                                             tmp_path_factory):
  out = _source(name, tmp_path_factory)[0]
  net = N.network(OTHER["bandwidth"], OTHER["latency"],
                  **{"hardware": "0.01s", **settings})
  clock_free = {k: v for k, v in _fields(name).items()
                if k not in ("bandwidth", "latency", "hardware")}
  again = lowbw.simulate(**clock_free, network=net)
  _assert_same(lowbw.retime(out, net), again)


def test_a_tail_and_a_resumed_run(tmp_path):
  """Steps after the last whole round (a tail), and a run resumed in its
  folder: its ledger keeps the steps before the checkpoint."""
  out = str(tmp_path / "run")
  fields = {**_fields("diloco"), "steps": 8}
  lowbw.simulate(**fields, out=out, checkpoint_every=4)
  lowbw.simulate(**{**fields, "steps": 10}, out=out, resume_from=out)
  assert _ledger.read(f"{out}/{_ledger.FILE}")["step_counts"].shape[0] == 10
  again = lowbw.simulate(**{**fields, "steps": 10, **OTHER})
  _assert_same(lowbw.retime(out, _other()), again)


def test_a_study_over_networks(tmp_path_factory):
  out, _, again = _source("diloco", tmp_path_factory)
  nets = [_other(), N.network("1Gbps", "1ms", hardware="0.01s")]
  one, fast = lowbw.retime(out, nets)
  assert one["sim_time_s"] == pytest.approx(again.summary["sim_time_s"],
                                            rel=1e-6)
  assert fast["sim_time_s"] < one["sim_time_s"]


# ------------------------------------------------------------- refusals
def test_ledger_names_what_made_training_follow_the_clock():
  """Every kind a run can depend on its clock by."""
  plain = N.network("1Gbps", "1ms")
  cfg = lambda s: types.SimpleNamespace(strategy=s)  # noqa: E731
  diloco = strategies.get("diloco", H=4)
  assert _ledger.timing_dependence(cfg(diloco), plain) == []
  assert _ledger.timing_dependence(cfg(diloco), None) == []
  kinds = {
      "asynchronous": (strategies.get("async_diloco"), plain),
      "time budget": (strategies.get("diloco", H=4, dylu=True), plain),
      "straggler mitigation": (diloco, plain._replace(
          stragglers=N.Stragglers(mitigation="threshold"))),
      "faults": (diloco, plain._replace(faults=N.Faults(drop_prob=0.1))),
  }
  for word, (strategy, net) in kinds.items():
    (reason,) = _ledger.timing_dependence(cfg(strategy), net)
    assert word in reason
  # Jitter alone drops nobody: the training is the clock-free run's.
  jitter = plain._replace(stragglers=N.Stragglers(jitter=0.5))
  assert _ledger.timing_dependence(cfg(diloco), jitter) == []


@pytest.mark.parametrize("name", REFUSED)
def test_a_clock_driven_strategy_is_refused(name, tmp_path):
  out = str(tmp_path / name)
  lowbw.simulate(**{**_fields(name), "steps": 4}, out=out)
  with pytest.raises(lowbw.ConfigError, match=r"run_dir=.*asynchronous"):
    lowbw.retime(out, _other())


def test_a_run_with_faults_is_refused(tmp_path):
  out = str(tmp_path / "faulty")
  lowbw.simulate(**{**_fields("diloco"), "steps": 4}, out=out,
                 drop_prob=0.2, mitigation="threshold")
  with pytest.raises(lowbw.ConfigError,
                     match=r"straggler mitigation 'threshold'.*faults"):
    lowbw.retime(out, _other())


_TRACE = N.Trace((0.0, 10.0), ((1.0, 1.0), (1.0, 0.5)))


@pytest.mark.parametrize("field,net", [
    ("stragglers", _other(stragglers=N.Stragglers(jitter=0.3))),
    ("faults", _other(faults=N.Faults(message_loss=0.1))),
    ("speed_trace", _other()._replace(speed_trace=_TRACE)),
    ("bandwidth_trace", _other()._replace(bandwidth_trace=N.Trace(
        (0.0, 10.0), ((1e9, 1e9), (1e6, 1e6))))),
])
def test_a_network_that_changes_training_is_refused(field, net,
                                                    tmp_path_factory):
  out = _source("diloco", tmp_path_factory)[0]
  with pytest.raises(lowbw.ConfigError, match=rf"network=.*{field}.*{out}"):
    lowbw.retime(out, net)


def test_a_network_of_another_worker_count_is_refused(tmp_path_factory):
  out = _source("diloco", tmp_path_factory)[0]
  with pytest.raises(lowbw.ConfigError,
                     match=r"speeds=.*expected 2 values.*a run of 2 workers"):
    lowbw.retime(out, _other(speeds=[1, 1, 1]))
  with pytest.raises(lowbw.ConfigError, match=r"group_size=3.*workers=2"):
    lowbw.retime(out, _other(topology="hierarchical", group_size=3))


def test_folders_without_a_whole_ledger_are_refused(tmp_path,
                                                    tmp_path_factory):
  with pytest.raises(lowbw.ConfigError, match="no such folder"):
    lowbw.retime(tmp_path / "nothing", _other())
  with pytest.raises(lowbw.ConfigError, match="holds no ledger.npz"):
    lowbw.retime(tmp_path, _other())
  # A run resumed from another folder's checkpoint: its ledger starts late.
  src = _source("diloco", tmp_path_factory)[0]
  ledger = _ledger.read(f"{src}/{_ledger.FILE}")
  late = tmp_path / "late"
  late.mkdir()
  meta = {**ledger["meta"], "first_step": 4}
  np.savez(late / _ledger.FILE, **{**ledger, "meta": np.asarray(
      json.dumps(meta))})
  with pytest.raises(lowbw.ConfigError, match="starts at step 4"):
    lowbw.retime(late, _other())


# ---------------------------------------------------------- command line
def test_command_line(tmp_path_factory, capsys):
  out, _, again = _source("diloco", tmp_path_factory)
  flags = ["--bandwidth", OTHER["bandwidth"], "--latency", OTHER["latency"],
           "--hardware", "0.01s"]
  assert main(["retime", out, *flags, "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed["sim_time_s"] == pytest.approx(
      again.summary["sim_time_s"], rel=1e-6)
  assert main(["retime", out, *flags]) == 0
  text = capsys.readouterr().out
  assert "on the network" in text and "CU" in text and "as it ran" in text
  # A setting not given is the run's own: with none, the run's own time.
  assert main(["retime", out, "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed["sim_time_s"] == pytest.approx(
      printed["original_sim_time_s"], rel=1e-6)
  assert main(["retime", out, "--bandwidth", "3Mbps", "--json"]) == 0
  printed = json.loads(capsys.readouterr().out)
  mine = lowbw.retime(out, N.network("3Mbps", SMALL["latency"],
                                     hardware=SMALL["hardware"]))
  assert printed["sim_time_s"] == pytest.approx(mine["sim_time_s"], rel=1e-9)
  assert main(["retime", out, "--speeds", "1,1,1"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("lowbw: error: --speeds=") and "\n" not in err
  assert main(["retime", out, "--bandwidth", "fast"]) == 2
  assert "--bandwidth" in capsys.readouterr().err


def test_a_run_that_did_not_finish_is_refused(tmp_path):
  # A non-finite loss stops the run at step 2 of its first chunk: the
  # ledger holds the whole chunk, the summary is never written.
  from lowbw import cli
  out = tmp_path / "nan"
  assert cli.main(["train", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--steps", "8", "--H", "4", "--inner", "sgd",
                   "--inner-lr", "1e20", "--no-plot", "--no-progress",
                   "--out", str(out)]) != 0
  with pytest.raises(lowbw.ConfigError, match="the run did not finish"):
    lowbw.retime(str(out), lowbw.network.network("10Mbps"))


def test_a_study_trains_once_per_training_and_retimes_the_clock_settings(
    tmp_path, capsys):
  """Points that differ only in settings of the clock (here bandwidth and
  latency: traced, so the study that trains every point builds once) are
  re-timed from the first one's ledger: the same histories and
  clock figures as a study that trains every point (no folder, no
  ledgers)."""
  base = dict(SMALL, workers=2, strategy="diloco", H=4, eval_every=4,
              eval_examples=16, gpu_price=2.0)
  grid = {"bandwidth": ["1Mbps", "100Mbps"], "latency": ["10ms", "40ms"],
          "inner_lr": [1e-3, 3e-3]}
  kept = lowbw.study(base, grid, out=str(tmp_path / "s"), progress=False,
                     plots=False)
  trained = lowbw.study(base, grid, progress=False, plots=False)
  retimed = [p for p in kept.points if p.summary.get("retimed_from")]
  assert len(retimed) == 6  # 2 trainings (inner_lr) x 4 networks, less 2
  assert kept.summary["retimed"] == 6 and trained.summary["retimed"] == 0
  for a, b in zip(kept.points, trained.points):
    assert a.values == b.values
    for key in ("sim_time_s", "compute_s", "comm_s", "comm_share",
                "gpu_hours", "cost_usd", "sent_bytes", "final_eval_loss"):
      assert a.summary[key] == pytest.approx(b.summary[key], rel=1e-6), key
    np.testing.assert_allclose(a.history["sim_time_s"],
                               b.history["sim_time_s"], rtol=1e-6)
    np.testing.assert_array_equal(a.history["train_loss"],
                                  b.history["train_loss"])
  # The folder reloads with the re-timed points, and re-times again.
  again = lowbw.studies.load(str(tmp_path / "s"))
  assert [p.summary["sim_time_s"] for p in again.points] == [
      p.summary["sim_time_s"] for p in kept.points]
  # A re-timed point is a run's folder: re-timed on its own network (the
  # command's defaults are the point's), it gives its own time.
  for point in retimed[:2]:
    r = lowbw.retime(point.log_dir, N.network(
        point.values["bandwidth"], point.values["latency"],
        hardware=SMALL["hardware"]))
    assert r["sim_time_s"] == pytest.approx(point.summary["sim_time_s"],
                                            rel=1e-9)
    assert main(["retime", point.log_dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sim_time_s"] == (
        pytest.approx(point.summary["sim_time_s"], rel=1e-9))


def test_a_study_of_a_clock_driven_strategy_trains_every_point(tmp_path):
  base = dict(_fields("async_diloco"), eval_examples=16)
  s = lowbw.study(base, {"bandwidth": ["1Mbps", "100Mbps"]},
                  out=str(tmp_path / "s"), progress=False, plots=False)
  assert not any(p.summary.get("retimed_from") for p in s.points)
  assert s.points[0].summary["sim_time_s"] != s.points[1].summary[
      "sim_time_s"]
