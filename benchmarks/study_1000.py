"""The performance issue's 1,000-point study: strategy in {DiLoCo,
SparseLoCo, MuLoCo, FedAdam} x H in 5 values x top-k density in 5 x outer
learning rate in 5 x 2 seeds, digits MLP at W = 8, run as one ``lowbw.study``
in this process; prints the builds, compile seconds, wall seconds and the
runs' own seconds (the sum of the points' ``wall_time_s``: each run's loop,
not its build or compiling), the figure the target's "within 1.3x of its
runs' own time" compares the wall time with.

Usage:
  LOWBW_COMPILE_CACHE=$(mktemp -d) python benchmarks/study_1000.py [--steps 100] [--json-out FILE]
"""

import argparse
import json
import time

import lowbw

GRID = [{"strategy": ["diloco", "sparseloco", "muloco", "fedadam"],
         "H": [5, 10, 20, 25, 50],
         "codec": ["topk:0.01", "topk:0.02", "topk:0.05", "topk:0.1",
                   "topk:0.2"],
         "outer_lr": [0.1, 0.3, 0.5, 0.7, 0.9]}]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=100)
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
  print(json.dumps(figures))
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(figures, f, indent=1)


if __name__ == "__main__":
  main()
