"""``lowbw calibrate`` and lowbw.network._calibrate: the fit recovers the terms
of runs synthesized here by a hand-written ring all-reduce formula; the
iperf3 and tc readers on fixtures written here; every error; report.py's
committed files are its output."""

import csv
import importlib.util
import json
import math
import pathlib
import statistics

import pytest

from lowbw import cli
from lowbw import network as net_lib
from lowbw.network import _calibrate, _profile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAL = ROOT / "benchmarks" / "calibration"
W, LATENCY = 4, 0.002
TRUE_EFF = {50e6: 0.8, 200e6: 0.9, 1e9: 1.0, 5e9: 0.95}
PER_CALL = 0.4e-3


def by_hand(params, bw, eff, calls, latency=LATENCY, dtype=4, per_call=PER_CALL):
  """One ring all-reduce: 2(W-1)/W of the bytes over the reached rate, 2(W-1)
  hops of latency, and the calls' fixed cost."""
  return (2 * (W - 1) / W * params * dtype * 8 / (bw * eff)
          + 2 * (W - 1) * latency + calls * per_call)


def synthetic(calls_of, eff=TRUE_EFF):
  """Rows in the CSV's form (text), two models per rate."""
  rows = []
  for i, (bw, e) in enumerate(sorted(eff.items())):
    for j, params in enumerate((1_000_000, 3_000_000)):
      calls = calls_of(i, j)
      rows.append({"method": "diloco" if j else "localsgd", "workers": str(W),
                   "bandwidth_bps": repr(bw * (1 + 0.01 * j)),
                   "parameters": str(params), "dtype_bytes": "4", "H": "8",
                   "compute_s_per_step": "0.02", "latency_s": repr(LATENCY),
                   "sync_s": repr(by_hand(params, bw * (1 + 0.01 * j), e,
                                          calls)),
                   "first_sync_extra_s": repr(0.1 * (i + j)),
                   "host_s_per_step": repr(1e-4 * (1 + i)),
                   "calls_per_sync": str(calls)})
  return rows


def test_fit_separates_per_call_from_efficiency_when_calls_vary():
  rows = synthetic(lambda i, j: 5 if j == 0 else 200)
  p = _calibrate.fit(rows)
  assert p.per_call_s == pytest.approx(PER_CALL, rel=1e-6)
  assert [e for _, e in p.efficiency] == pytest.approx(
      [TRUE_EFF[b] for b in sorted(TRUE_EFF)], rel=1e-6)
  assert [b for b, _ in p.efficiency] == pytest.approx(
      [b * 1.005 for b in sorted(TRUE_EFF)])  # the median of each rate's runs
  assert p.startup_s == pytest.approx(statistics.median(
      0.1 * (i + j) for i in range(4) for j in range(2)))
  assert p.host_s == pytest.approx(statistics.median(
      1e-4 * (1 + i) for i in range(4) for j in range(2)))
  assert p.calls == "fused"


def test_fit_with_one_trainer_takes_the_largest_per_call_below_efficiency_1():
  """57 calls everywhere: per-call cost and efficiency cannot be told apart,
  so the rate that reaches its link (1 Gbit/s) bounds the per-call cost; an
  unshaped rate whose syncs beat its link bounds nothing and is clipped."""
  eff = {**TRUE_EFF, 9.5e9: 1.5}
  p = _calibrate.fit(synthetic(lambda i, j: 57, eff))
  assert p.per_call_s == pytest.approx(PER_CALL, rel=1e-6)
  assert [e for _, e in p.efficiency] == pytest.approx(
      [0.8, 0.9, 1.0, 0.95, 1.0], rel=1e-6)


def test_fit_keeps_the_base_terms_it_is_not_asked_or_given():
  rows = [{k: v for k, v in r.items() if k not in (
      "first_sync_extra_s", "host_s_per_step")}
      for r in synthetic(lambda i, j: 57)]
  base = _profile.CALIBRATED._replace(startup_s=0.7, host_s=0.003)
  p = _calibrate.fit(rows, base=base, calls="per_tensor")
  assert (p.startup_s, p.host_s, p.calls) == (0.7, 0.003, "per_tensor")
  q = _calibrate.fit(synthetic(lambda i, j: 57), fit_terms=("startup_s",),
                     base=base)
  assert (q.efficiency, q.per_call_s, q.host_s) == (
      base.efficiency, base.per_call_s, base.host_s)
  assert q.startup_s != base.startup_s


def ddp_rows(wire: float) -> list[dict]:
  """DDP rows (one fused call a step) whose busiest worker sends ``wire`` x
  the payload, over links at ``TRUE_EFF``'s reach, less 2/3 of the step's
  compute (the backward pass it overlaps), by hand."""
  levels = 2 * math.ceil(math.log2(W))
  rows = []
  for rate, e in sorted(TRUE_EFF.items()):
    bw = rate * 1.005  # where synthetic()'s fit puts each rate's point
    sync = (wire * 2_000_000 * 4 * 8 / (bw * e) + levels * LATENCY
            + PER_CALL) if wire == 2 else by_hand(2_000_000, bw, e, 1)
    sync -= 2 / 3 * 0.02  # what the backward pass hid
    rows.append({"method": "ddp", "workers": str(W), "bandwidth_bps": repr(bw),
                 "parameters": "2000000", "dtype_bytes": "4", "H": "1",
                 "compute_s_per_step": "0.02", "latency_s": repr(LATENCY),
                 "sync_s": repr(sync)})
  return rows


@pytest.mark.parametrize("wire, algorithm", [(2, "tree"), (1.5, "ring")])
def test_fit_takes_the_algorithm_of_ddps_rows_and_the_link_from_the_others(
    wire, algorithm):
  explicit = synthetic(lambda i, j: 5 if j == 0 else 200)
  p = _calibrate.fit(explicit + ddp_rows(wire))
  assert p.bucketed_allreduce == algorithm
  assert p.efficiency == _calibrate.fit(explicit).efficiency
  for row in ddp_rows(wire):  # and it prices them as they were made
    run = _calibrate.run_of(row, "ddp")
    assert _calibrate.predict(p, run)[0] == pytest.approx(run.sync_s)


def test_fit_on_ddp_rows_alone_times_them_as_the_bases_algorithm():
  p = _calibrate.fit(ddp_rows(2), fit_terms=("efficiency",),
                     base=_profile.CALIBRATED._replace(per_call_s=PER_CALL))
  assert p.bucketed_allreduce == "tree"
  assert [e for _, e in p.efficiency] == pytest.approx(
      [TRUE_EFF[b] for b in sorted(TRUE_EFF)], rel=1e-6)


def test_predict_is_the_hand_formula_under_a_profile():
  p = _profile.Profile(efficiency=((1e8, 0.5), (1e10, 1.0)), per_call_s=1e-3,
                       startup_s=0.2, host_s=5e-4)
  run = _calibrate.run_of(synthetic(lambda i, j: 57)[2], "row 2")
  sync_s, step_s = _calibrate.predict(p, run)
  # 200 Mbit/s: log(2e8 / 1e8) / log(1e10 / 1e8) of the way up.
  eff = 0.5 + 0.5 * math.log(2) / math.log(100)
  assert sync_s == pytest.approx(by_hand(1_000_000, 200e6, eff, 57,
                                         per_call=1e-3), rel=1e-12)
  assert step_s == pytest.approx(0.02 + 5e-4)


@pytest.mark.parametrize("line, bps", [
    ("tc qdisc add dev eth0 root tbf rate 50mbit burst 32768 latency 50ms",
     50e6),
    ("qdisc tbf 8001: root refcnt 2 rate 200Mbit burst 32Kb lat 50.0ms", 200e6),
    ("tc qdisc add dev eth0 root netem delay 10ms rate 1gbit", 1e9),
    ("tc qdisc change dev eth0 root tbf rate 125mbps burst 1mb", 1e9),
    ("rate 1mibit", 2 ** 20),
    ("rate 1000 burst 10k", 1000.0),
    ("rate 1.5Gbit", 1.5e9),
])
def test_read_tc(line, bps):
  assert _calibrate.read_tc(line) == pytest.approx(bps)


@pytest.mark.parametrize("line, allowed", [
    ("tc qdisc add dev eth0 root netem delay 10ms", "has no 'rate"),
    ("tc qdisc add dev eth0 root tbf rate 50% burst 1k", "gives the rate as a share"),
    ("tc qdisc add dev eth0 root tbf rate 0mbit", "has a rate of 0"),
    ("rate 50furlongs", "has no 'rate"),
])
def test_read_tc_errors(line, allowed):
  with pytest.raises(ValueError, match=rf"^tc='.*' is invalid: {allowed}"):
    _calibrate.read_tc(line)


def _json(path, obj):
  path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
  return path


def test_read_iperf3_tcp_and_udp(tmp_path):
  tcp = _json(tmp_path / "tcp.json", {"start": {}, "end": {
      "sum_sent": {"bits_per_second": 9.6e8},
      "sum_received": {"bits_per_second": 9.4e8}}})
  udp = _json(tmp_path / "udp.json", {"end": {"sum": {
      "bits_per_second": 1.0e8}}})
  assert _calibrate.read_iperf3(tcp) == 9.4e8
  assert _calibrate.read_iperf3(udp) == 1.0e8


@pytest.mark.parametrize("content, allowed", [
    ("{not json", "is not JSON"),
    ({"error": "unable to connect to server"}, r"records a failed test "
     r"\(unable to connect to server\)"),
    ({"start": {}}, "has no end.sum_received.bits_per_second"),
    ({"end": {"sum_received": {"bits_per_second": 0}}}, "has no end"),
    ([1, 2], "has no end"),
])
def test_read_iperf3_errors(tmp_path, content, allowed):
  path = _json(tmp_path / "x.json", content)
  with pytest.raises(ValueError, match=rf"^iperf3='.*x\.json' is invalid: "
                     rf"{allowed}"):
    _calibrate.read_iperf3(path)
  with pytest.raises(ValueError, match="iperf3=.* is invalid: no such file"):
    _calibrate.read_iperf3(tmp_path / "missing.json")
  with pytest.raises(ValueError, match="iperf3=.* is invalid: is a folder"):
    _calibrate.read_iperf3(tmp_path)


def _csv(path, rows, columns=None):
  columns = columns or list(rows[0])
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  return path


def test_read_rows_reads_rates_from_files_tc_lines_and_units(tmp_path):
  rows = synthetic(lambda i, j: 57)[:4]
  _json(tmp_path / "link.json", {"end": {"sum_received": {
      "bits_per_second": 4.9e7}}})
  pair = [_json(tmp_path / f"pair{i}.json", {"end": {"sum_received": {
      "bits_per_second": v}}}) for i, v in enumerate((9e9, 10e9))]
  rows[0]["bandwidth_bps"] = "link.json"
  rows[1]["bandwidth_bps"] = "tc qdisc add dev eth0 root tbf rate 50mbit"
  rows[2]["bandwidth_bps"] = "200Mbps"
  rows[3]["bandwidth_bps"] = ""
  path = _csv(tmp_path / "runs.csv", rows)
  runs = _calibrate.read_rows(path, iperf3=pair)
  assert [r.bandwidth_bps for r in runs] == [4.9e7, 50e6, 200e6, 9.5e9]
  assert runs[0].calls_per_sync == 57 and runs[0].latency_s == LATENCY
  with pytest.raises(ValueError, match=r"^bandwidth_bps \(line 5 of .*runs"
                     r"\.csv\)='' is invalid: is empty \(an unshaped link\)"):
    _calibrate.read_rows(path)


@pytest.mark.parametrize("column, value, allowed", [
    ("workers", "1", "expected an integer >= 2"),
    ("parameters", "1.5", "expected an integer >= 1"),
    ("H", "0", "expected an integer >= 1"),
    ("sync_s", "-1", "expected a number > 0"),
    ("compute_s_per_step", "fast", "expected a number > 0"),
    ("dtype_bytes", "0", "expected a number > 0"),
    ("latency_s", "-0.1", "expected a number >= 0"),
    ("host_s_per_step", "nan", "expected a number >= 0"),
    ("calls_per_sync", "0", "expected an integer >= 1"),
    ("first_sync_extra_s", "x", "expected a number$"),
    ("bandwidth_bps", "fast", "expected a bandwidth > 0"),
    ("method", " ", "expected the method's name"),
])
def test_read_rows_errors_name_the_line_and_column(tmp_path, column, value,
                                                   allowed):
  rows = synthetic(lambda i, j: 57)[:3]
  rows[1][column] = value
  path = _csv(tmp_path / "runs.csv", rows)
  with pytest.raises(ValueError, match=rf"^{column} \(line 3 of .*runs\.csv\)"
                     rf"='{value}' is invalid: {allowed}"):
    _calibrate.read_rows(path)


def test_read_rows_and_fit_refuse_missing_columns_and_empty_input(tmp_path):
  rows = synthetic(lambda i, j: 57)[:2]
  path = _csv(tmp_path / "a.csv", rows, [c for c in rows[0] if c != "sync_s"])
  with pytest.raises(ValueError, match=r"^measurements='.*a\.csv' is invalid: "
                     r"has no column 'sync_s'; expected the columns method"):
    _calibrate.read_rows(path)
  empty = _csv(tmp_path / "b.csv", [], list(rows[0]))
  with pytest.raises(ValueError, match="is invalid: has no rows"):
    _calibrate.read_rows(empty)
  with pytest.raises(ValueError, match="no such file"):
    _calibrate.read_rows(tmp_path / "c.csv")
  with pytest.raises(ValueError, match=r"^rows=\[\] is invalid: expected at "
                     "least one"):
    _calibrate.fit([])
  with pytest.raises(ValueError, match=r"^fit_terms='latency' is invalid"):
    _calibrate.fit(rows, fit_terms=("latency",))
  del rows[1]["H"]
  with pytest.raises(ValueError, match=r"^H \(row 1\)=None is invalid: is "
                     "required"):
    _calibrate.fit(rows)


def test_cli_writes_a_profile_that_network_loads(tmp_path, capsys):
  rows = synthetic(lambda i, j: 5 if j == 0 else 200)
  path = _csv(tmp_path / "runs.csv", rows)
  out = tmp_path / "profile.yaml"
  assert cli.main(["calibrate", str(path), "--out", str(out),
                   "--calls", "per_tensor"]) == 0
  printed = capsys.readouterr().out
  assert "per_call_s   0.0004" in printed
  assert "localsgd" in printed and "diloco" in printed
  loaded = net_lib.profile(str(out))
  assert loaded == _calibrate.fit(rows, calls="per_tensor")
  assert loaded.per_call_s == pytest.approx(PER_CALL, rel=1e-6)
  assert net_lib.network("1Gbps", profile=str(out)).profile == loaded
  # A fit whose terms are the runs' own prices them right; not exactly,
  # since a rate's point sits at its runs' median rate (1 % apart here).
  for method, s in _calibrate.residuals(
      _calibrate.read_rows(path), loaded).items():
    assert s["sync"]["max"] < 1e-3, method


@pytest.mark.parametrize("args, message", [
    (["calibrate", "{d}/none.csv", "--out", "{d}/p.yaml"],
     "lowbw: error: measurements='{d}/none.csv' is invalid: no such file"),
    (["calibrate", "{d}/runs.csv", "--out", "{d}/no/p.yaml"],
     "lowbw: error: --out='{d}/no/p.yaml' is invalid: its folder"),
    (["calibrate", "{d}/runs.csv", "--out", "{d}/p.yaml", "--calls", "all"],
     "lowbw: error: --calls='all' is invalid: expected 'fused', 'per_tensor'"),
    (["calibrate", "{d}/runs.csv", "--out", "{d}/p.yaml", "--iperf3",
      "{d}/bad.json"], "lowbw: error: --iperf3='{d}/bad.json' is invalid: is "
     "not JSON"),
    (["calibrate", "{d}/bad.csv", "--out", "{d}/p.yaml"],
     "lowbw: error: workers (line 2 of {d}/bad.csv)='one' is invalid: "
     "expected an integer >= 2"),
    (["calibrate", "{d}/runs.csv"], "lowbw calibrate: error: the following "
     "arguments are required: --out"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, args, message):
  rows = synthetic(lambda i, j: 57)
  _csv(tmp_path / "runs.csv", rows)
  _csv(tmp_path / "bad.csv", [{**rows[0], "workers": "one"}])
  (tmp_path / "bad.json").write_text("{")
  d = str(tmp_path)
  assert cli.main([a.format(d=d) for a in args]) == 2
  err = capsys.readouterr().err
  assert err.startswith(message.format(d=d)), err
  assert err.count("\n") == 1
  assert not (tmp_path / "p.yaml").exists()


def _report():
  spec = importlib.util.spec_from_file_location("report", CAL / "report.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _close(a, b, path="$"):
  """Equal JSON values, floats to 1e-9 relative."""
  if isinstance(a, dict):
    assert a.keys() == b.keys(), path
    for k in a:
      _close(a[k], b[k], f"{path}.{k}")
  elif isinstance(a, list):
    assert len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _close(x, y, f"{path}[{i}]")
  elif isinstance(a, float):
    assert a == pytest.approx(b, rel=1e-9, abs=1e-15), path
  else:
    assert a == b, path


@pytest.fixture(scope="module")
def report():
  mod = _report()
  return mod, mod.report(mod.residuals.load_runs())


def test_the_committed_report_is_the_scripts_output(report):
  mod, fresh = report
  saved = json.loads((ROOT / "docs/benchmarks/calibration_cpu.json").read_text())
  _close(saved, json.loads(json.dumps(
      {k: v for k, v in fresh.items() if not k.startswith("_")})))
  doc = (ROOT / "docs/calibration.md").read_text()
  assert mod.rewrite_doc(doc, fresh["_markdown"]) == doc
  with open(CAL / "measurements.csv", newline="") as f:
    committed = list(csv.DictReader(f))
  assert len(committed) == len(fresh["_rows"]) == 52  # 48 + DDP's 4
  for got, want in zip(committed, fresh["_rows"]):
    assert got["run_id"] == want["run_id"]
    _close([float(got[k]) for k in ("sync_s", "bandwidth_bps",
                                    "first_sync_extra_s")],
           [want[k] for k in ("sync_s", "bandwidth_bps", "first_sync_extra_s")])
  # lowbw calibrate on the committed CSV is the report's "fit", and so is
  # the committed profile.yaml.
  fitted = _calibrate.fit(_calibrate.read_rows(CAL / "measurements.csv"))
  assert fitted == fresh["_profiles"]["fit"]
  assert net_lib.profile(str(CAL / "profile.yaml")) == fitted


def test_the_report_prices_the_ideal_clock_as_residuals_does(report):
  """Under the ideal profile, the report's errors are residuals.py's (the
  earlier script, written without profiles)."""
  mod, fresh = report
  runs = mod.residuals.load_runs()
  for run, row in zip(runs, fresh["rows"]):
    old = mod.residuals.predict(run)
    assert row["ideal"]["sync_err"] == pytest.approx(old["sync_err"], rel=1e-9)
    assert row["ideal"]["cu_err"] == pytest.approx(old["cu_err"], rel=1e-9)


def test_the_reports_window_price_by_hand(report):
  """One DiLoCo run whose first sync is in its window, under the default
  profile: 57 calls, the start-up once, compute over the window's wall."""
  mod, _ = report
  run = next(r for r in mod.residuals.load_runs()
             if r["run_id"] == "cu_grid-diloco-30m-h32-bw1g-r0")
  p = _profile.CALIBRATED
  W_, P, bw = run["workers"], run["params"], run["shaped_bps"]
  # The verified rate is just below 1 Gbit/s: between 200 Mbit/s (0.907)
  # and 1 Gbit/s (1.0), in log-bandwidth.
  eff = 0.907 + 0.093 * math.log(bw / 200e6) / math.log(1e9 / 200e6)
  sync = 2 * (W_ - 1) / W_ * P * 4 * 8 / (bw * eff) + 57 * p.per_call_s
  n, k, c = run["window_steps"], run["syncs_in_window"], run["compute_s_per_step"]
  assert run["first_sync_in_window"] == 1
  got = mod.predict(p, run)
  assert got["sync_s"] == pytest.approx(sync + p.startup_s / k, rel=1e-12)
  assert got["cu"] == pytest.approx(n * c / (n * c + k * sync + p.startup_s),
                                    rel=1e-12)
