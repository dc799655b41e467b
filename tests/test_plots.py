"""What ``lowbw plot`` and ``lowbw sweep``'s ``sweep.png`` draw: the data
functions behind the figures, and that a PNG is written."""

import math
import os

import numpy as np
import pytest

from lowbw import cli
from lowbw.cli import _plot, _sweep

# A DiLoCo-like log: H = 4, so the bytes stay flat for 4 steps, then grow.
STEPS = list(range(1, 13))
WIRE = [0, 0, 0, 100, 100, 100, 100, 200, 200, 200, 200, 300]
LOSS = [2.3, 2.1, 2.0, 1.9, 1.8, 1.75, 1.7, 1.6, 1.55, 1.5, 1.45, 1.4]
NAN = math.nan
EVAL = [NAN, NAN, NAN, 1.95, NAN, NAN, NAN, 1.65, NAN, NAN, NAN, 1.45]


def _table():
  return {"step": [float(s) for s in STEPS],
          "wire_bytes": [float(b) for b in WIRE],
          "train_loss": LOSS, "eval_loss": EVAL,
          "sim_time_s": [0.5 * s for s in STEPS]}


def test_loss_against_bytes_is_drawn_at_sync_points_only():
  xs, ys = _plot.series(_table(), "wire_bytes", "train_loss")
  # reference: the last row before the bytes change, and the last row
  want = [(WIRE[i], LOSS[i]) for i in range(len(WIRE))
          if i == len(WIRE) - 1 or WIRE[i + 1] != WIRE[i]]
  assert list(zip(xs, ys)) == want
  assert len(set(xs)) == len(xs)  # no vertical stacks


def test_loss_against_steps_keeps_every_row_and_drops_empty_ones():
  xs, ys = _plot.series(_table(), "step", "train_loss")
  assert xs == [float(s) for s in STEPS] and ys == LOSS
  xs, ys = _plot.series(_table(), "step", "eval_loss")
  assert xs == [4.0, 8.0, 12.0] and ys == [1.95, 1.65, 1.45]


@pytest.mark.parametrize("n", [1, 3, 5])
def test_smoothing_is_a_trailing_moving_average(n):
  _, ys = _plot.series(_table(), "step", "train_loss", smooth=n)
  want = [np.mean(LOSS[max(0, i - n + 1):i + 1]) for i in range(len(LOSS))]
  np.testing.assert_allclose(ys, want)


def test_smoothing_happens_before_picking_sync_points():
  _, ys = _plot.series(_table(), "wire_bytes", "train_loss", smooth=2)
  smoothed = [np.mean(LOSS[max(0, i - 1):i + 1]) for i in range(len(LOSS))]
  np.testing.assert_allclose(ys, [smoothed[i] for i in (2, 6, 10, 11)])


def test_axes_have_units_and_log_where_values_span_decades():
  a = _plot.axis("wire_bytes", [2e3, 5e6])
  assert (a.label, a.scale, a.log) == ("wire bytes per worker (MB)", 1e-6, True)
  a = _plot.axis("sim_time_s", [0.0, 40.0])
  assert (a.label, a.log) == ("simulated time (s)", False)  # 0: no log
  a = _plot.axis("train_loss", [2.3, 1.9])
  assert (a.label, a.scale, a.log) == ("train loss", 1.0, False)
  assert _plot.axis("train_loss", [2.3, 0.1]).log  # 23x
  assert not _plot.axis("train_loss", [2.3, 0.1], log=False).log
  assert _plot.axis("train_loss", [2.3, 1.9], log=True).log
  assert _plot.axis("tier_dc_wire_bytes", [1e9]).label == (
      "tier dc wire bytes (GB)")


def _write_run(folder):
  os.makedirs(folder)
  table = _table()
  with open(os.path.join(folder, "metrics.csv"), "w") as f:
    f.write(",".join(table) + "\n")
    for row in zip(*table.values()):
      f.write(",".join("" if math.isnan(v) else repr(v) for v in row) + "\n")


def test_cli_plot_writes_a_png_with_log_y_and_smoothing(tmp_path, capsys):
  run = tmp_path / "run"
  _write_run(str(run))
  out = tmp_path / "p.png"
  assert cli.main(["plot", str(run), "--x", "wire_bytes", "--y",
                   "train_loss", "--log-y", "--smooth", "3", "--out",
                   str(out)]) == 0
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "train loss against wire bytes per worker (B)" in (
      capsys.readouterr().out)


def test_cli_plot_refuses_a_smoothing_window_below_one(tmp_path, capsys):
  run = tmp_path / "run"
  _write_run(str(run))
  assert cli.main(["plot", str(run), "--smooth", "0"]) == 2
  err = capsys.readouterr().err
  assert "--smooth=0" in err and "expected an integer >= 1" in err


class _FakeSweep:
  """What ``plot`` reads of a ``SweepResult``: names, seeds, aggregate."""

  def __init__(self, names, rows, seeds=(0, 1)):
    self.names, self.seeds, self._rows = names, list(seeds), rows

  def aggregate(self, metric):
    assert metric == "final_eval_loss"
    return self._rows


def _lr_rows(values):
  return [{"inner_lr": v, "mean": 2.0 + i, "std": 0.1, "n": 2, "failed": 0}
          for i, v in enumerate(values)]


def test_sweep_learning_rates_go_on_a_log_axis():
  # numpy floats, as a grid built with np.logspace gives them
  result = _FakeSweep(["inner_lr"], _lr_rows(np.array([3e-3, 1e-3, 1e-2])))
  lines, log = _plot.sweep_lines(result, "inner_lr")
  assert log
  assert lines == [(None, [1e-3, 3e-3, 1e-2], [3.0, 2.0, 4.0],
                    [0.1, 0.1, 0.1])]
  lines, log = _plot.sweep_lines(
      _FakeSweep(["inner_lr"], _lr_rows([1e-3, 2e-3])), "inner_lr")
  assert not log  # less than a decade apart


def test_sweep_lines_per_other_value_and_categories():
  rows = [{"inner_lr": lr, "bandwidth": bw, "mean": m, "std": 0.0}
          for lr, bw, m in [(1e-3, "10Mbps", 3.0), (1e-2, "10Mbps", 2.0),
                            (1e-3, "1Gbps", 2.5), (1e-2, "1Gbps", 1.5)]]
  result = _FakeSweep(["inner_lr", "bandwidth"], rows)
  lines, log = _plot.sweep_lines(result, "inner_lr")
  assert log and [l[0] for l in lines] == ["bandwidth=10Mbps",
                                           "bandwidth=1Gbps"]
  lines, log = _plot.sweep_lines(result, "bandwidth")
  assert not log and lines[0][1] == ["10Mbps", "1Gbps"]


def test_sweep_png_is_written(tmp_path):
  result = _FakeSweep(["inner_lr"], _lr_rows([1e-3, 1e-2, 1e-1]))
  path = tmp_path / "sweep.png"
  assert _sweep.plot(result, str(path))
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
