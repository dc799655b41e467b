"""What ``lowbw plot`` and a study's plots draw: the data
functions behind the figures, and that a PNG is written."""

import math
import os

import numpy as np
import pytest

from lowbw import cli
from lowbw.cli import _plot
from lowbw.studies._plots import pareto
from lowbw.studies._plots import swept_lines

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


@pytest.mark.parametrize("text", ["", "step,train_loss,eval_loss\n"])
def test_cli_plot_says_a_run_without_rows_has_none_yet(tmp_path, capsys,
                                                       text):
  run = tmp_path / "run"
  run.mkdir()
  (run / "metrics.csv").write_text(text)
  assert cli.main(["plot", str(run)]) == 2
  err = capsys.readouterr().err
  assert err == (f"lowbw: error: runs={str(run)!r} is invalid: "
                 f"{run / 'metrics.csv'} has no rows yet (plot the run once "
                 "it has logged a step)\n")


def test_read_metrics_takes_the_columns_from_the_header(tmp_path):
  csv_path = tmp_path / "metrics.csv"
  csv_path.write_text("step,train_loss\n1,2.5,extra\n2,2.0\n")
  assert _plot.read_metrics(str(csv_path)) == {"step": [1.0, 2.0],
                                                "train_loss": [2.5, 2.0]}


@pytest.mark.parametrize("name", ["p.txt", "p"])
def test_cli_plot_refuses_an_extension_matplotlib_cannot_write(
    tmp_path, capsys, name):
  run = tmp_path / "run"
  _write_run(str(run))
  out = tmp_path / name
  assert cli.main(["plot", str(run), "--out", str(out)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"lowbw: error: --out={str(out)!r} is invalid: "
                        "expected an image file ending in .png, .pdf, .svg, ")
  assert err.count("\n") == 1 and not out.exists()
  assert ".txt" not in err.partition("is invalid:")[2]


def _rows(lrs, means, **others):
  return [{"inner_lr": lr, "final_eval_loss_mean": m,
           "final_eval_loss_std": 0.1, **{k: v[i] for k, v in others.items()}}
          for i, (lr, m) in enumerate(zip(lrs, means))]


def test_study_learning_rates_go_on_a_log_axis():
  # numpy floats, as a grid built with np.logspace gives them
  rows = _rows(np.array([3e-3, 1e-3, 1e-2]), [2.0, 3.0, 4.0])
  lines, numeric, log = swept_lines(rows, ["inner_lr"], "inner_lr",
                                    "final_eval_loss")
  assert numeric and log
  assert lines == [("base", [1e-3, 3e-3, 1e-2], [3.0, 2.0, 4.0],
                    [0.1, 0.1, 0.1])]
  _, _, log = swept_lines(_rows([1e-3, 2e-3], [1.0, 2.0]), ["inner_lr"],
                          "inner_lr", "final_eval_loss")
  assert not log  # less than a decade apart


def test_study_lines_per_other_value_and_categories():
  rows = _rows([1e-3, 1e-2, 1e-3, 1e-2], [3.0, 2.0, 2.5, 1.5],
               bandwidth=["10Mbps", "10Mbps", "1Gbps", "1Gbps"])
  names = ["inner_lr", "bandwidth"]
  lines, _, log = swept_lines(rows, names, "inner_lr", "final_eval_loss")
  assert log and [l[0] for l in lines] == ["bandwidth=10Mbps",
                                           "bandwidth=1Gbps"]
  lines, numeric, log = swept_lines(rows, names, "bandwidth",
                                    "final_eval_loss")
  assert not numeric and not log and lines[0][1] == [0, 1]


def test_the_pareto_front_keeps_what_nothing_beats_on_both():
  xs = [10.0, 1.0, 5.0, 5.0, 20.0, math.nan]
  ys = [1.0, 3.0, 2.0, 2.5, 0.5, 0.1]
  assert pareto(xs, ys) == [1, 2, 0, 4]


def test_infinite_values_are_not_drawn_and_are_said(tmp_path, capsys):
  # matplotlib draws an infinite loss as nothing: a run whose every row is
  # infinite wrote an empty plot with exit 0.
  (tmp_path / "metrics.csv").write_text("step,train_loss\n1,2.0\n2,inf\n"
                                        "3,1.5\n")
  assert cli.main(["plot", str(tmp_path), "--y", "train_loss"]) == 0
  err = capsys.readouterr().err
  assert f"run {tmp_path}: 1 row(s) of train_loss are infinite" in err
  (tmp_path / "metrics.csv").write_text("step,train_loss\n1,inf\n2,-inf\n")
  assert cli.main(["plot", str(tmp_path), "--y", "train_loss"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"lowbw: error: --y='train_loss' is invalid: run {tmp_path} has no "
      "rows with both step and train_loss finite"]
