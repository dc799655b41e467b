"""Fleet traces: speeds and bandwidths that change over simulated time,
read from CSV files, against clocks worked out by hand."""

import jax
import numpy as np
import pytest

import lowbw
from lowbw import network as net_lib

import ideal
from lowbw import strategies

W, H = 4, 10


def _write(tmp_path, name, rows):
  path = tmp_path / name
  path.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
  return str(path)


def _run(network, strategy=None, steps=40):
  return lowbw.simulate(
      model=lowbw.models.mlp(hidden=(8,), num_classes=10),
      data=lowbw.data.digits(), strategy=strategy or strategies.diloco(H=H),
      workers=W, batch_size=8, steps=steps, network=network,
      log_every=H, eval_every=steps)


def test_a_speed_trace_sets_each_rounds_compute_time(tmp_path):
  """Worker 3 runs at a quarter speed from 20 s to 60 s. A round takes its
  slowest worker's ten 1 s steps at the speeds in force when it starts:
  rounds start at 0, 10 (full speed), 20 (40 s) and 60."""
  trace = _write(tmp_path, "speeds.csv", [
      ("time", "a", "b", "c", "d"), (0, 1, 1, 1, 1), ("20s", 1, 1, 1, 0.25),
      ("1min", 1, 1, 1, 1)])
  net = ideal.network("1000Tbps", "0ms", hardware="1s", speeds=trace)
  sim_time = _run(net).history["sim_time_s"]
  np.testing.assert_allclose(sim_time, [10, 20, 60, 70], atol=1e-3)


def test_a_bandwidth_trace_reprices_each_sync(tmp_path):
  """A ring all-reduce of payload B over W workers takes 2(W-1) hops of
  B/W bytes at the slowest link: worker 2's link drops to 1 Mbps from 15 s
  (the third round starts at 20 s)."""
  trace = _write(tmp_path, "bw.csv", [
      ("time", "w0", "w1", "w2", "w3"), (0, "1Gbps", "1Gbps", "1Gbps", "1Gbps"),
      ("15s", "1Gbps", "1Gbps", "1Mbps", "1Gbps")])
  net = ideal.network(latency="0ms", hardware="1s", bandwidth_trace=trace)
  r = _run(net)
  payload = r.history["payload_bytes"][0]
  hop = lambda bps: 8 * payload / W / bps  # noqa: E731
  fast, slow = 2 * (W - 1) * hop(1e9), 2 * (W - 1) * hop(1e6)
  rounds = np.array([10 + fast, 10 + fast, 10 + slow, 10 + slow])
  np.testing.assert_allclose(r.history["sim_time_s"], np.cumsum(rounds),
                             rtol=1e-5)


def test_a_speed_trace_changes_asynchronous_training(tmp_path):
  """Under async DiLoCo the speeds decide the order of the updates: a slow
  period changes the model, not only the clock."""
  trace = _write(tmp_path, "speeds.csv", [
      ("time", 0, 1, 2, 3), (0, 1, 1, 1, 1), (5, 1, 1, 1, 0.25)])
  model_of = lambda speeds: _run(  # noqa: E731
      ideal.network("1000Tbps", "0ms", hardware="1s", speeds=speeds),
      strategies.async_diloco(H=H), steps=30).params
  equal, traced = model_of(None), model_of(trace)
  assert not np.allclose(jax.tree.leaves(equal)[0],
                         jax.tree.leaves(traced)[0], atol=1e-4)


@pytest.mark.parametrize("rows, match", [
    ([("time", "a", "b"), ("5s", 1, 1)], "does not cover the run's start"),
    ([("time", "a", "b"), (0, 1, 0)], "speed > 0"),
    ([("time", "a", "b"), (0, 1, 1), (0, 1, 1)], "must increase"),
    ([("time", "a", "b"), (0, 1)], "line 2 has 2 columns"),
    ([("time", "a", "b"), (0, 1, "fast")], "speed > 0"),
    ([("time", "a", "b")], "at least one row"),
])
def test_a_bad_speed_trace_is_refused_naming_the_problem(tmp_path, rows,
                                                         match):
  path = _write(tmp_path, "bad.csv", rows)
  with pytest.raises(ValueError, match="speeds") as e:
    ideal.network(hardware="1s", speeds=path)
  assert match in str(e.value)


def test_traces_must_fit_the_fleet(tmp_path):
  three = _write(tmp_path, "three.csv", [("time", 0, 1, 2), (0, 1, 1, 1)])
  with pytest.raises(ValueError, match="expected 4, one per worker"):
    _run(ideal.network(hardware="1s", speeds=three))
  with pytest.raises(ValueError, match="bandwidth_trace.*expected 4"):
    _run(ideal.network(hardware="1s", bandwidth_trace=_write(
        tmp_path, "bw.csv", [("time", 0, 1, 2), (0, "1Gbps", "1Gbps",
                                                  "1Gbps")])))
  with pytest.raises(ValueError, match="needs hardware"):
    _run(ideal.network(hardware=None, speeds=_write(
        tmp_path, "four.csv", [("time", 0, 1, 2, 3), (0, 1, 1, 1, 1)])))
  with pytest.raises(ValueError, match="cannot read the trace file"):
    ideal.network(hardware="1s", speeds=str(tmp_path / "missing.csv"))
  with pytest.raises(ValueError, match="speeds"):
    ideal.network(hardware="1s", speeds=[1, 0, 1, 1])


@pytest.mark.parametrize("ending", ["plain", "bom_crlf"])
def test_a_one_row_speed_trace_is_a_constant_fleet(tmp_path, ending):
  """One row (worker 1 at half speed from 0) holds for the whole run, as
  ``speeds=[1, 0.5, 1, 1]`` does: every round takes 20 one-second steps'
  worth. A spreadsheet's byte-order mark and CRLF line ends read the same."""
  path = tmp_path / "one.csv"
  text = "time,a,b,c,d\n0,1,0.5,1,1\n"
  if ending == "bom_crlf":
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
  else:
    path.write_text(text)
  net = ideal.network("1000Tbps", "0ms", hardware="1s", speeds=str(path))
  assert net.speed_trace.values == ((1.0, 0.5, 1.0, 1.0),)
  sim_time = _run(net).history["sim_time_s"]
  np.testing.assert_allclose(sim_time, [20, 40, 60, 80], atol=1e-3)


def test_a_trace_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
  path = tmp_path / "latin.csv"
  path.write_bytes("time,a\xe9\n0,1\n".encode("latin-1"))
  with pytest.raises(ValueError, match="speeds.*latin.csv.*not UTF-8"):
    ideal.network(hardware="1s", speeds=str(path))


def test_a_long_trace_is_looked_up_by_binary_search():
  """``Trace.at`` against a plain scan of the rows, on a trace with
  repeated look-ups between, at and past its change times."""
  times = tuple(float(t) for t in range(0, 300, 3))
  values = tuple((float(i),) for i in range(len(times)))
  t = net_lib.Trace(times, values)

  def scan(x):
    row = 0
    for i, start in enumerate(times):
      if start <= x:
        row = i
    return values[row]

  for x in np.linspace(0, 320, 641):
    assert t.at(float(x)) == scan(x)


def test_a_bad_row_of_a_trace_is_named_by_its_flag_and_line(tmp_path,
                                                            capsys):
  # The API names the setting ("speeds (line 2 of f.csv)"); the command line
  # names its flag and keeps the line, as for any other setting.
  from lowbw import cli
  path = tmp_path / "speeds.csv"
  path.write_text("time,w0,w1\n0,1,nan\n")
  assert cli.main(["train", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--steps", "10", "--H", "5", "--hardware", "0.1s",
                   "--speeds", str(path), "--no-progress"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"lowbw: error: --speeds (line 2 of {path})='nan' is invalid: expected "
      "a speed > 0 (a worker of speed 0 never finishes a step)"]
