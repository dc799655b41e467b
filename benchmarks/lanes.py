"""What counterfactual lanes cost: wall time and the memory estimate of one
run with 0, 1 and 2 lanes.

The run: DiLoCo (H=10) on the digits MLP, 8 workers of batch 32, with
faults (drop_prob 0.1) and stragglers (jitter 0.3); the lanes no_faults,
then no_faults and no_stragglers. Each configuration is built (compiled)
once; then ``--repeats`` runs of each, interleaved (0, 1, 2 lanes, 0, 1,
2, ...) so that a busy machine slows them alike, and the median wall
seconds of the runs (compiling excluded) is reported with the memory
estimate's state and lane bytes.

    python benchmarks/lanes.py                 # 7 repeats, 3000 steps
    python benchmarks/lanes.py --repeats 3 --steps 200 --json out.json
"""

import argparse
import json
import statistics
import time

import lowbw

BASE = dict(data="digits", strategy="diloco", H=10, workers=8,
            batch_size=32, hidden="64", drop_prob=0.1, jitter=0.3,
            hardware="0.1s", devices=1, progress=False)
LANES = ([], ["no_faults"], ["no_faults", "no_stragglers"])


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--steps", type=int, default=3000)
  p.add_argument("--json", help="write the figures here too")
  args = p.parse_args()
  sims = []
  for lanes in LANES:
    config = lowbw.Config(**BASE, steps=args.steps,
                          **({"lanes": lanes} if lanes else {}))
    start = time.perf_counter()
    sims.append(lowbw.build(config))
    print(f"{len(lanes)} lane(s): built and compiled in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
  walls = [[] for _ in LANES]
  for r in range(args.repeats):
    for i, sim in enumerate(sims):
      summary = sim.run(seed=r).summary
      walls[i].append(summary["wall_time_s"])
  rows = []
  for lanes, sim, wall in zip(LANES, sims, walls):
    m = sim.memory
    rows.append({"lanes": lanes, "median_wall_s": statistics.median(wall),
                 "wall_s": wall, "state_bytes": m.state_bytes,
                 "lane_bytes": m.lane_bytes,
                 "estimate_bytes": m.estimate_bytes})
  base = rows[0]["median_wall_s"]
  print("lanes | median wall s | x of none | state bytes | lane bytes | "
        "estimate bytes")
  for row in rows:
    print(f"{len(row['lanes'])} | {row['median_wall_s']:.2f} | "
          f"{row['median_wall_s'] / base:.2f} | {row['state_bytes']:,.0f} | "
          f"{row['lane_bytes']:,.0f} | {row['estimate_bytes']:,.0f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
