"""Seconds to read a fleet trace of N rows and build a run on it.

A trace (``--speeds FILE.csv``, ``--bandwidth-trace FILE.csv``) is looked up
at every time the fleet changes; a linear scan there made the build
quadratic in rows (about half an hour for 200,000 rows). This times reading
the file (``lowbw.network.network``) and building a small DiLoCo run on it
(``lowbw.build``), for traces of random rows written by the script (seeded:
the same arguments write the same files).

Usage:
  python benchmarks/trace_build.py --rows=2000,20000,200000
  python benchmarks/trace_build.py --rows=20000 --kind bandwidth --json out.json
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

import lowbw
from lowbw import data, models, network, strategies

WORKERS = 4


def write_trace(rows: int, kind: str, folder: str) -> str:
  """A trace of ``rows`` rows, one a second, each worker's value drawn from
  three levels."""
  rng = np.random.default_rng(0)
  levels = (["1", "0.5", "0.25"] if kind == "speeds"
            else ["1Gbps", "100Mbps", "10Mbps"])
  picks = rng.integers(0, len(levels), size=(rows, WORKERS))
  path = os.path.join(folder, f"{kind}-{rows}.csv")
  with open(path, "w") as f:
    f.write("time," + ",".join(f"w{i}" for i in range(WORKERS)) + "\n")
    for t, row in enumerate(picks):
      f.write(f"{t}," + ",".join(levels[i] for i in row) + "\n")
  return path


def time_build(path: str, kind: str) -> dict:
  start = time.perf_counter()
  net = network.network(latency="10ms", hardware="1s",
                        **{"speeds" if kind == "speeds"
                           else "bandwidth_trace": path})
  read = time.perf_counter()
  lowbw.build(model=models.mlp(hidden=(8,)), data=data.digits(),
              strategy=strategies.diloco(H=10), workers=WORKERS,
              batch_size=8, steps=20, network=net, log_every=10,
              eval_every=20)
  built = time.perf_counter()
  return {"read_s": read - start, "build_s": built - read}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rows", default="2000,20000,200000",
                 help="trace lengths, comma-separated")
  p.add_argument("--kind", choices=("speeds", "bandwidth", "both"),
                 default="both")
  p.add_argument("--json", help="also write the figures to this file")
  args = p.parse_args()
  kinds = ("speeds", "bandwidth") if args.kind == "both" else (args.kind,)
  out = []
  with tempfile.TemporaryDirectory() as folder:
    for rows in (int(r) for r in args.rows.split(",")):
      for kind in kinds:
        figures = time_build(write_trace(rows, kind, folder), kind)
        out.append({"rows": rows, "kind": kind, **figures})
        print(f"{kind:9s} {rows:>8,} rows: read {figures['read_s']:.2f} s, "
              f"build {figures['build_s']:.2f} s", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
