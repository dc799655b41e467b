"""The performance issue's 1,000-point study: strategy in {DiLoCo,
SparseLoCo, MuLoCo, FedAdam} x H in 5 values x top-k density in 5 x outer
learning rate in 5 x 2 seeds, digits MLP at W = 8, run as one ``lowbw.study``
in this process; prints the builds, compile seconds, wall seconds and the
runs' own seconds (the sum of the points' ``wall_time_s``: each run's loop,
not its build or compiling), the figure the target's "within 1.3x of its
runs' own time" compares the wall time with.

``--check N`` then runs N of the points (spread evenly over the grid) as
their own single runs (``lowbw.simulate(point.config)``, each its own
build) and compares: steps, bytes and simulated time exactly, losses to
float32 rounding (relative 2e-5: a traced build's program is not the
single run's); it prints how many agreed and exits 1 on a mismatch.

Usage:
  LOWBW_COMPILE_CACHE=$(mktemp -d) python benchmarks/study_1000.py [--steps 100] [--check 20] [--json-out FILE]
"""

import argparse
import json
import sys
import time

import numpy as np

import lowbw

GRID = [{"strategy": ["diloco", "sparseloco", "muloco", "fedadam"],
         "H": [5, 10, 20, 25, 50],
         "codec": ["topk:0.01", "topk:0.02", "topk:0.05", "topk:0.1",
                   "topk:0.2"],
         "outer_lr": [0.1, 0.3, 0.5, 0.7, 0.9]}]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--check", type=int, default=0,
                      help="points to compare with their single runs")
  parser.add_argument("--json-out")
  args = parser.parse_args()
  base = lowbw.Config(data="digits", workers=8, steps=args.steps,
                      progress=False)
  start = time.perf_counter()
  study = lowbw.study(base, grid=GRID, seeds=[0, 1], plots=False)
  wall = time.perf_counter() - start
  runs = sum(p.summary.get("wall_time_s") or 0.0 for p in study.points)
  figures = {"points": len(study.points), "wall_s": wall,
             **{k: study.summary.get(k) for k in ("builds", "compile_s")},
             "runs_s": runs, "wall_over_runs": wall / runs if runs else None}
  if args.check:
    figures["checked"], figures["mismatches"] = check(study, args.check)
  print(json.dumps(figures))
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(figures, f, indent=1)
  if figures.get("mismatches"):
    sys.exit(1)


EXACT = ("payload_bytes", "wire_bytes", "sent_bytes", "received_bytes",
         "sim_time_s", "step", "examples")


def check(study, n: int) -> tuple[int, list]:
  """``(points checked, [what differed])``: ``n`` points of ``study``
  against their own single runs."""
  points = study.points[::max(1, len(study.points) // n)][:n]
  mismatches = []
  for point in points:
    ref = lowbw.simulate(point.config.replace(progress=False))
    for name, want in ref.history.items():
      got, want = np.asarray(point.history.get(name)), np.asarray(want)
      if name == "wall_time_s":
        continue
      same = (got.shape == want.shape and (
          np.array_equal(got, want, equal_nan=True) if name in EXACT else
          np.allclose(got, want, rtol=2e-5, atol=1e-6, equal_nan=True)))
      if not same:
        mismatches.append(f"point {point.index} ({point.values}, seed "
                          f"{point.seed}): {name}")
  return len(points), mismatches


if __name__ == "__main__":
  main()
