"""Steps per second of one small run, its programs compiled first: the
digits MLP with W = 8 by default, timed over 3 runs after a warm one.

    python benchmarks/step_rate.py --strategy ddp --steps 3000

Prints ``best median`` steps/s. To compare two commits, run it alternately
from each one's checkout (``PYTHONPATH=<checkout>``), several times, and
compare the medians.
"""

import argparse
import statistics
import time

import lowbw


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--strategy", default="ddp")
  p.add_argument("--steps", type=int, default=3000)
  p.add_argument("--workers", type=int, default=8)
  args = p.parse_args(argv)
  config = lowbw.Config(data="digits", strategy=args.strategy,
                        workers=args.workers, steps=args.steps,
                        eval_every=args.steps, progress=False, devices=1)
  sim = lowbw.build(config)
  sim.run(seed=0)
  times = []
  for seed in range(3):
    start = time.perf_counter()
    sim.run(seed=seed)
    times.append(time.perf_counter() - start)
  print(f"{args.steps / min(times):.0f} "
        f"{args.steps / statistics.median(times):.0f}")


if __name__ == "__main__":
  main()
