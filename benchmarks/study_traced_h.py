"""A study over H: its builds, compile seconds and wall seconds.

The grid is (diloco, sparseloco) x H in 5 values x outer lr in 5 x 2 seeds
(100 points) of the digits MLP at W=8. Since H is traced in a study
(``lowbw.build(config, traced=("H",))``), the points of each strategy share
one build; run the same script with an older lowbw on ``PYTHONPATH`` to get
one build per (strategy, H). Give each run an empty compilation cache:

  LOWBW_COMPILE_CACHE=$(mktemp -d) python benchmarks/study_traced_h.py

Prints one JSON line: points, builds, compile seconds (the points' sum),
wall seconds, and every point's final train loss (to compare two runs).
"""

import argparse
import json
import time

import lowbw


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--json", help="also write the line to this file")
  args = parser.parse_args()
  base = dict(data="digits", workers=args.workers, steps=args.steps,
              eval_every=args.steps, progress=False)
  grid = {"strategy": ["diloco", "sparseloco"], "H": [5, 10, 20, 25, 50],
          "outer_lr": [0.3, 0.5, 0.7, 0.9, 1.0]}
  start = time.perf_counter()
  study = lowbw.study(base, grid, seeds=[0, 1], plots=False)
  wall = time.perf_counter() - start
  line = {"lowbw": lowbw.__file__, "points": study.summary["points"],
          "builds": study.summary["builds"],
          "compile_s": round(study.summary["compile_s"], 2),
          "wall_s": round(wall, 2),
          "final_train_loss": [p.summary["final_train_loss"]
                               for p in study.points]}
  text = json.dumps(line)
  print(text)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
