"""A study interrupted and resumed writes the same table bytes as one that
ran straight through: ``study.csv``, ``final.csv`` and ``points.csv`` are
built from the points' folders however the points ran, so only the
wall-clock columns (``wall_time_s``, and its ``_mean``/``_std`` in
``final.csv``) may differ."""

import csv
import io

import pytest

import lowbw

BASE = dict(data="digits", hidden="8", workers=2, batch_size=4, steps=8,
            eval_examples=32, eval_every=4, devices=1, H=2)
GRID = {"outer_lr": [0.5, 0.7], "H": [2, 4]}  # fields out of alphabetical order
SEEDS = [0, 1]
TABLES = ("study.csv", "final.csv", "points.csv")
WALL = ("wall_time_s", "wall_time_s_mean", "wall_time_s_std")


def without_wall_clock(path, drop=WALL) -> str:
  """The table's text with its columns ``drop`` left out, every other
  byte as written (the tables are written by Python's csv module with
  "\n" line ends, which this rewrites identically)."""
  with open(path, newline="") as f:
    rows = list(csv.reader(f))
  keep = [i for i, name in enumerate(rows[0]) if name not in drop]
  out = io.StringIO(newline="")
  writer = csv.writer(out, lineterminator="\n")
  for row in rows:
    writer.writerow([row[i] for i in keep])
  return out.getvalue()


def test_an_interrupted_study_writes_the_same_table_bytes(tmp_path):
  base = lowbw.Config(**BASE)
  lowbw.study(base, GRID, seeds=SEEDS, out=str(tmp_path / "whole"),
              progress=False)

  finished = []

  def stop(point):
    finished.append(point.index)
    if len(finished) == 3:   # three points finished: Ctrl-C
      raise KeyboardInterrupt

  cut = tmp_path / "cut"
  with pytest.raises(KeyboardInterrupt):
    lowbw.study(base, GRID, seeds=SEEDS, out=str(cut), progress=False,
                on_point=stop)
  assert not (cut / "study.csv").exists()
  resumed = lowbw.study(base, GRID, seeds=SEEDS, out=str(cut),
                        progress=False)
  assert resumed.summary["resumed"] == 3
  for name in TABLES:
    whole, resumed_table = tmp_path / "whole" / name, cut / name
    # Rewriting a table keeps its bytes: what is compared is what is on disk.
    assert without_wall_clock(whole, drop=()) == whole.read_bytes().decode()
    header = whole.read_text().splitlines()[0].split(",")
    assert any(c in WALL for c in header), header
    assert without_wall_clock(resumed_table) == without_wall_clock(whole), (
        name)
