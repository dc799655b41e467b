"""``lowbw bench --lane`` and ``lowbw.bench.measure_lanes``: a run with 0,
1, ... of its counterfactual lanes timed interleaved, its state's bytes
read from the tuple of states (every lane's counted), and its flags'
errors. (Speed itself is never asserted: docs/lanes.md has the figures.)"""

import json

import jax
import numpy as np
import pytest

import lowbw
from lowbw import bench, cli
from lowbw.cli import _bench

# DiLoCo over 2 workers with faults: the no_faults lane has a cause.
BASE = dict(model="mlp", hidden="8", data="digits", strategy="diloco", H=2,
            workers=2, batch_size=4, drop_prob=0.25, hardware="0.1s")
LANES = ["no_faults", "codec=quant:4"]


def _bytes(tree) -> int:
  return sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def figures():
  return bench.measure_lanes(lowbw.Config(**BASE, lanes=LANES),
                             bench.Timing(rounds=1, repeats=2, warmup=1))


def test_a_row_per_lane_count_timed_interleaved(figures):
  rows = figures["lane_rows"]
  assert [r["lanes"] for r in rows] == [[], LANES[:1], LANES]
  assert figures["workers"] == 2 and figures["steps"] == 2
  assert figures["devices"] == 1 and len(figures["load_average"]) == 2
  for row in rows:
    assert len(row["seconds"]) == len(row["wall_ratios"]) == 2
    assert all(s > 0 for s in row["seconds"])
    assert row["wall_ratio"] == pytest.approx(float(np.median(
        [s / b for s, b in zip(row["seconds"], rows[0]["seconds"])])))
  assert rows[0]["wall_ratios"] == [1.0, 1.0]


def test_the_state_counts_every_lanes_state(figures):
  """The memory figure is the bytes of the tuple of states (the run's and
  each lane's), as the test reads them from the states of a build of the
  same config."""
  rows = figures["lane_rows"]
  for k, row in enumerate(rows):
    config = lowbw.Config(**BASE, devices=1, **(
        {"lanes": LANES[:k]} if k else {}))
    states = lowbw.build(config, compile=False).initial(0)[0]
    parts = states if k else (states,)
    assert isinstance(parts, tuple) and len(parts) == k + 1
    assert row["state_bytes"] == sum(_bytes(p) for p in parts)
    if k:  # the state the row's lane adds: that lane's own
      assert row["lane_state_bytes"] == _bytes(parts[k])
  assert rows[0]["lane_state_bytes"] is None
  # The lanes hold the run's data, not copies: the same bytes of data
  # with and without lanes.
  assert len({r["data_bytes"] for r in rows}) == 1
  assert rows[1]["plan_lane_bytes"] > 0 == rows[0]["plan_lane_bytes"]


def test_measure_lanes_needs_a_config_with_lanes():
  with pytest.raises(ValueError, match="^lanes=.*at least one lane"):
    bench.measure_lanes(lowbw.Config(**BASE))


def _argv(*more):
  return ["bench", "--model", "mlp", "--hidden", "8", "--workers", "2",
          "--H", "2", "--batch-size", "4", "--drop-prob", "0.25",
          "--hardware", "0.1s", *more]


def test_cli_table_and_json(tmp_path, capsys, monkeypatch):
  # In this process (a child process is the same call on the settings
  # written as JSON): the settings survive the trip.
  monkeypatch.setattr(_bench, "_child", lambda s, w: _bench._measure(
      json.loads(json.dumps({**s, "workers": w})), w))
  out = tmp_path / "b.json"
  code = cli.main(_argv("--lane", "no_faults", "--repeats", "1",
                        "--json-out", str(out)))
  captured = capsys.readouterr()
  assert code == 0, captured.err
  assert "x no lanes (median)" in captured.out
  assert "1 (no_faults)" in captured.out
  (row,) = json.loads(out.read_text())["configurations"]
  assert [r["lanes"] for r in row["lane_rows"]] == [[], ["no_faults"]]
  assert row["lanes"] == ["no_faults"]


def test_a_bad_lane_names_the_flag_and_the_lanes(capsys):
  code = cli.main(_argv("--lane", "no_fault"))
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert err.startswith("lowbw: error: --lane='no_fault' is invalid: not a "
                        "lane; expected one of no_faults, no_stragglers, "
                        "no_byzantine, codec=SPEC, SETTING=VALUE, ddp"), err
  assert "did you mean 'no_faults'" in err


def test_a_lane_without_its_cause_is_refused(capsys):
  code = cli.main(_argv("--lane", "no_stragglers"))
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("lowbw: error: --lane="), err
  assert "has no uneven speeds and jitter" in err


@pytest.mark.parametrize("argv, says", [
    (["--model", "mlp", "--drop-prob", "0.2"],
     "--drop-prob=0.2 is invalid: a network setting is measured with "
     "--lane only"),
    (["--model", "mlp", "--drop-prob", "0.2", "--lane", "no_faults",
      "--plot", "b.png"], "--plot='b.png' is invalid: draws worker counts"),
])
def test_flags_that_do_not_go_with_lanes(argv, says, capsys, tmp_path,
                                         monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert cli.main(["bench", *argv]) == 2
  err = capsys.readouterr().err
  assert err.startswith("lowbw: error: " + says), err
  assert not (tmp_path / "b.png").exists()
