"""A study over networks: trained once and re-timed, against training every
point.

A study whose points differ only in the clock's settings (here five links)
trains the first and re-times the others from its ledger when it has an
output folder (docs/studies.md); without one, it trains every point (on one
build: the bandwidth and latency are traced values). Both give the same
histories and simulated times. This script times both, interleaved, and
prints the medians and their ratio. The baseline writes no files (a study
without a folder), which favours it.

  python benchmarks/study_networks.py --repeats 3
"""

import argparse
import statistics
import tempfile
import time

import lowbw

LINKS = [("10Gbps", "1ms"), ("1Gbps", "10ms"), ("100Mbps", "50ms"),
         ("10Mbps", "100ms"), ("1Mbps", "200ms")]


def one(out) -> float:
  base = {"data": "digits", "hidden": "32", "workers": 8, "strategy": "diloco",
          "H": 30, "steps": 3000, "eval_every": 1500, "hardware": "0.05s"}
  grid = [{"bandwidth": [bw], "latency": [lat]} for bw, lat in LINKS]
  start = time.perf_counter()
  s = lowbw.study(base, grid, out=out, progress=False, plots=False)
  elapsed = time.perf_counter() - start
  assert (s.summary.get("retimed") or 0) == (len(LINKS) - 1 if out else 0)
  return elapsed


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args()
  one(None)  # compile once, for both
  retimed, trained = [], []
  for _ in range(args.repeats):
    with tempfile.TemporaryDirectory() as folder:
      retimed.append(one(folder + "/study"))
    trained.append(one(None))
  r, t = statistics.median(retimed), statistics.median(trained)
  print(f"{len(LINKS)} networks, DiLoCo W=8 H=30, 3000 steps of the digits "
        f"MLP: trained once and re-timed {r:.2f} s, every point trained "
        f"{t:.2f} s (medians of {args.repeats}); ratio {t / r:.2f}")


if __name__ == "__main__":
  main()
