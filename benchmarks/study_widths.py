"""A study over a linear quantizer's bit width: DiLoCo with quant:B for B in
1, 2, 4, 8 x H in 5, 10 x outer learning rate in 0.3, 0.7 x 2 seeds (32
points, digits MLP, W = 8, 100 steps) as one ``lowbw.study``; prints its
builds, compiling, the runs' own seconds and the wall time. With the bit
width traced (``lowbw.build(config, traced=("bits",))``), one build serves
the four widths.

Usage:
  LOWBW_COMPILE_CACHE=$(mktemp -d) python benchmarks/study_widths.py
"""

import json
import time

import lowbw

GRID = [{"strategy": ["diloco"], "H": [5, 10],
         "codec": ["quant:1", "quant:2", "quant:4", "quant:8"],
         "outer_lr": [0.3, 0.7]}]


def main():
  base = lowbw.Config(data="digits", workers=8, steps=100, progress=False)
  start = time.perf_counter()
  study = lowbw.study(base, grid=GRID, seeds=[0, 1], plots=False,
                      progress=False)
  wall = time.perf_counter() - start
  runs = sum(p.summary.get("wall_time_s") or 0.0 for p in study.points)
  print(json.dumps({
      "points": len(study.points), "builds": study.summary["builds"],
      "compile_s": study.summary["compile_s"], "runs_s": runs,
      "wall_s": wall, "final_train_loss": [p.summary["final_train_loss"]
                                           for p in study.points]}))


if __name__ == "__main__":
  main()
