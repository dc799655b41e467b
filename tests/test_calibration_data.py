"""The calibration data set (benchmarks/calibration/): measured runs of DDP,
LocalSGD and DiLoCo, the scripts that extract them and price them with
lowbw's clock. References here are written out by hand, not read from the
scripts under test."""

import csv
import importlib.util
import json
import os
import pathlib
import statistics

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAL = ROOT / "benchmarks" / "calibration"
COLUMNS = (
    "run_id", "method", "H", "link", "nominal_bps", "shaped_bps",
    "rate_source", "workers", "params", "dtype_bytes", "repeat", "steps",
    "warmup_steps", "window_steps", "syncs_in_window", "compute_s_per_step",
    "host_s_per_step", "sync_s_mean", "sync_s_min", "sync_s_max",
    "first_sync_s", "first_sync_in_window", "wall_s_per_step",
    "wall_s_per_round", "cu", "allreduce_calls_per_sync", "date", "source",
    "source_summary")
NOMINAL = {"50m": 50e6, "200m": 200e6, "1g": 1e9, "5g": 5e9, "unshaped": None}


def _module(name):
  spec = importlib.util.spec_from_file_location(name, CAL / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _rows(path=CAL / "measured_runs.csv"):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def rows():
  return _rows()


def test_the_runs_csv_has_its_columns_and_one_row_per_run(rows):
  with open(CAL / "measured_runs.csv", newline="") as f:
    assert tuple(next(csv.reader(f))) == COLUMNS
  assert len(rows) == 73
  assert len({r["run_id"] for r in rows}) == 73
  assert os.path.getsize(CAL / "measured_runs.csv") < 100_000
  for r in rows:
    for c in ("compute_s_per_step", "sync_s_mean", "wall_s_per_step", "cu",
              "shaped_bps"):
      assert float(r[c]) > 0, (r["run_id"], c)


def test_methods_h_and_links_are_the_documented_grid(rows):
  by = {}
  for r in rows:
    by.setdefault(r["method"], []).append(r)
  assert set(by) == {"ddp", "localsgd", "diloco"}
  assert {r["H"] for r in by["ddp"]} == {"1"}
  assert {r["link"] for r in by["ddp"]} == set(NOMINAL)
  assert len(by["localsgd"]) == 16 and len(by["diloco"]) == 52
  for method in ("localsgd", "diloco"):
    assert {int(r["H"]) for r in by[method]} == {1, 8, 32, 128}
  # DiLoCo: three repeats of every shaped point, one unshaped run per H.
  shaped = [(r["H"], r["link"], r["repeat"]) for r in by["diloco"]
            if r["link"] != "unshaped"]
  assert sorted(shaped) == sorted((h, b, str(i)) for h in ("1", "8", "32", "128")
                                  for b in ("50m", "200m", "1g", "5g")
                                  for i in range(3))
  for r in rows:
    nominal = NOMINAL[r["link"]]
    assert r["nominal_bps"] == ("" if nominal is None else str(int(nominal)))
    assert (r["workers"], r["params"], r["dtype_bytes"]) == ("4", "30846720",
                                                             "4")


def test_every_cu_is_compute_over_wall_as_recorded(rows):
  """cu comes from the run's summary record, the per-step means from its
  step telemetry: two files that must agree."""
  for r in rows:
    compute, wall = float(r["compute_s_per_step"]), float(r["wall_s_per_step"])
    assert float(r["cu"]) == pytest.approx(compute / wall, rel=1e-6), r["run_id"]
    assert float(r["wall_s_per_round"]) == pytest.approx(
        wall * int(r["H"]), rel=1e-8)
    # The wall time holds the compute, the host time and the syncs.
    syncs = int(r["syncs_in_window"]) * float(r["sync_s_mean"])
    per_step = compute + float(r["host_s_per_step"]) + syncs / int(
        r["window_steps"])
    assert per_step == pytest.approx(wall, rel=0.05), r["run_id"]


def test_link_rates_are_the_verified_shaped_ones(rows):
  with open(CAL / "network.csv", newline="") as f:
    net = list(csv.DictReader(f))
  iperf = [float(n["rate_bps"]) for n in net if n["kind"] == "iperf3_pair"]
  assert len(iperf) == 12
  localsgd = {}
  for r in rows:
    if r["method"] == "localsgd":
      localsgd.setdefault(r["link"], []).append(float(r["shaped_bps"]))
  for r in rows:
    rate, nominal = float(r["shaped_bps"]), NOMINAL[r["link"]]
    if nominal is None:
      assert r["rate_source"] == "iperf3_unshaped"
      assert rate == pytest.approx(sum(iperf) / 12, abs=1)
    elif r["method"] == "ddp":  # its records lost their verification
      assert r["rate_source"] == "localsgd_same_level"
      assert rate == pytest.approx(statistics.median(localsgd[r["link"]]),
                                   abs=1)
    else:
      assert r["rate_source"] == "run"
      assert abs(rate / nominal - 1) < 0.10  # the runs' shaping gate


def test_residuals_sync_time_is_ring_allreduce_by_hand(rows):
  residuals = _module("residuals")
  row = next(r for r in residuals.load_runs()
             if r["run_id"] == "cu_grid-diloco-30m-h8-bw50m-r0")
  W, nbytes, bw = row["workers"], row["params"] * 4, row["shaped_bps"]
  for latency in (0.0, 0.002):
    by_hand = 2 * (W - 1) / W * nbytes * 8 / bw + 2 * (W - 1) * latency
    sync_s, step_s = residuals.clock_of(row, latency)
    assert sync_s == pytest.approx(by_hand, rel=1e-12)
    assert step_s == row["compute_s_per_step"]
  p = residuals.predict(row)
  c, n, k = row["compute_s_per_step"], row["window_steps"], row["syncs_in_window"]
  sync0 = 2 * (W - 1) / W * nbytes * 8 / bw
  assert p["cu"] == pytest.approx(n * c / (n * c + k * sync0), rel=1e-12)
  assert p["sync_err"] == pytest.approx(sync0 / row["sync_s_mean"] - 1)
  assert p["cu_err"] == pytest.approx(p["cu"] / row["cu"] - 1)


def test_residuals_formula_is_the_clock_of_a_real_run():
  residuals = _module("residuals")
  row = next(r for r in residuals.load_runs()
             if r["run_id"] == "cu_grid-ddp-30m-bw1g-r0")
  check = residuals.simulate_check(row)
  assert check["sim_time_s"] == pytest.approx(check["formula_s"], rel=1e-6)


def test_residuals_refuse_a_negative_latency(capsys):
  with pytest.raises(SystemExit):
    _module("residuals").main(["--latency", "-1"])
  assert "--latency=-1.0 is invalid: seconds >= 0" in capsys.readouterr().err


def test_the_committed_residuals_are_the_scripts_output(rows):
  """docs/benchmarks' JSON is residuals.py's output on this CSV."""
  residuals = _module("residuals")
  with open(ROOT / "docs" / "benchmarks" / "calibration_residuals_cpu.json") as f:
    saved = json.load(f)
  fresh = residuals.tables([residuals.predict(r) for r in residuals.load_runs()])
  for table in ("by_method", "by_method_shaped", "by_method_and_link"):
    assert saved[table].keys() == fresh[table].keys()
    for name, got in fresh[table].items():
      for stat in ("sync", "cu", "cu_round"):
        assert saved[table][name][stat] == pytest.approx(got[stat]), name
      assert saved[table][name]["runs"] == got["runs"]


# A clone of two runs written by hand: what extract.py must make of it.
def _step(outer, compute, sync, wall):
  return {"did_outer_step": outer, "compute_time_ms": compute,
          "sync_blocked_ms": sync, "optimizer_time_ms": 1.0,
          "loader_stall_ms": 1.0, "wall_time_ms": wall}


def _write_run(root, folder, run_id, method, nominal, measured, records,
               compute_s):
  tel = {"run_id": run_id, "H": 2, "world_size": 4, "n_params": 1000,
         "steps": len(records), "warmup_steps": 2, "step_records": records}
  summary = {"spec": {"algorithm": method, "bandwidth_requested_bps": nominal},
             "shaping": None if measured is None else {"measured_bps": measured},
             "started_at": "2026-01-02T00:00:00",
             "cu": {"cu_measured": 0.5, "compute_s": compute_s}}
  for path, obj in ((f"experiments/01_cu_grid/{folder}/{run_id}.json", tel),
                    (f"results/raw/{run_id}.json", summary)):
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(json.dumps(obj))


def _clone(root, ddp_link="50m", compute_s=0.03):
  profile = {"iperf_pairs": [{"from_node": "a", "to_node": "b", "gbit_s": 9.0,
                              "duration_s": 60},
                             {"from_node": "b", "to_node": "a", "gbit_s": 11.0,
                              "duration_s": 60}],
             "nccl_curve": [{"msg_bytes": 1024, "achieved_bps": 5e9}],
             "burst_decay_curve": []}
  path = root / "results/network/phase1-us-east-1b-20260814.json"
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps(profile))
  records = [_step(True, 50, 400, 460), _step(False, 10, 0, 12),
             _step(False, 10, 0, 12), _step(True, 20, 100, 130)]
  _write_run(root, "raw_step_telemetry_x", "cu_grid-localsgd-30m-h2-bw50m-r0",
             "localsgd", 50_000_000, 49_000_000, records, compute_s)
  _write_run(root, "raw_step_telemetry_x", f"cu_grid-ddp-30m-bw{ddp_link}-r0",
             "ddp", 50_000_000, None, records, compute_s)


def test_extract_reads_the_window_after_warm_up(tmp_path):
  _clone(tmp_path)
  _module("extract").extract(str(tmp_path), str(tmp_path))
  ddp, local = _rows(tmp_path / "measured_runs.csv")
  assert (ddp["method"], local["method"]) == ("ddp", "localsgd")
  # Steps 2 and 3 (the warm-up is 2): 30 ms compute, 142 ms wall, one sync
  # of 100 ms; the first sync (400 ms) was in the warm-up.
  assert float(local["compute_s_per_step"]) == pytest.approx(0.015)
  assert float(local["wall_s_per_step"]) == pytest.approx(0.071)
  assert float(local["wall_s_per_round"]) == pytest.approx(0.142)
  assert float(local["host_s_per_step"]) == pytest.approx(0.002)
  assert (local["syncs_in_window"], local["window_steps"]) == ("1", "2")
  assert float(local["sync_s_mean"]) == pytest.approx(0.1)
  assert float(local["first_sync_s"]) == pytest.approx(0.4)
  assert local["first_sync_in_window"] == "0"
  assert (local["shaped_bps"], local["rate_source"]) == ("49000000", "run")
  assert (ddp["shaped_bps"], ddp["rate_source"]) == ("49000000",
                                                     "localsgd_same_level")
  with open(tmp_path / "network.csv", newline="") as f:
    net = list(csv.DictReader(f))
  assert [n["kind"] for n in net] == ["iperf3_pair"] * 2 + ["nccl_allreduce_bus"]


def test_extract_errors_name_what_is_wrong(tmp_path):
  extract = _module("extract")
  with pytest.raises(SystemExit, match=r"PATH_TO_CLONE='.*' is invalid: has no "
                     r"experiments/01_cu_grid/raw_step_telemetry"):
    extract.extract(str(tmp_path / "nowhere"), str(tmp_path))
  _clone(tmp_path / "a", compute_s=9.0)
  with pytest.raises(SystemExit, match=r"cu\.compute_s=9\.0 is invalid: must "
                     "equal the compute seconds"):
    extract.extract(str(tmp_path / "a"), str(tmp_path))
  _clone(tmp_path / "b", ddp_link="200m")  # no LocalSGD run at 200m
  with pytest.raises(SystemExit, match=r"shaping=None is invalid: a shaped run "
                     r"\(200m\) needs its verified rate"):
    extract.extract(str(tmp_path / "b"), str(tmp_path))
  (tmp_path / "a" / "results/raw/cu_grid-ddp-30m-bw50m-r0.json").unlink()
  with pytest.raises(SystemExit, match="has no results/raw/cu_grid-ddp"):
    extract.extract(str(tmp_path / "a"), str(tmp_path))
