"""How long a new variant takes to its first step, in a process that has
already run one (a notebook composing codecs): the digits MLP under DiLoCo
(W = 8, b = 32, H = 10, one round), one plain run and then three codec
chains, each a new program, with no compilation cache (every program is
compiled). Each line gives the seconds from the call to the run's end and
the run's own start-up breakdown (build, initial state, tracing, compiling
and loading).

Usage:
  python benchmarks/variant_latency.py [--json-out FILE]
"""

import argparse
import json
import os
import time

os.environ["LOWBW_COMPILE_CACHE"] = "0"  # before lowbw is imported

import lowbw  # noqa: E402
from lowbw import strategies  # noqa: E402
from lowbw import transforms as T  # noqa: E402

PARTS = ("build_s", "initial_state_s", "trace_s", "compile_load_s")


def variants():
  return [("plain (first in the process)", {}),
          ("top_k(0.1) | quantize(4)", dict(codec=T.top_k(0.1) | T.quantize(4))),
          ("quantize(2)", dict(codec=T.quantize(2))),
          ("top_k(0.05) | quantize(8), error feedback 0.9",
           dict(codec=T.top_k(0.05) | T.quantize(8), error_feedback=0.9))]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json-out", help="write the figures to this file")
  args = parser.parse_args()
  rows = []
  for name, kw in variants():
    start = time.perf_counter()
    result = lowbw.simulate(data="digits", strategy=strategies.diloco(H=10, **kw),
                            workers=8, batch_size=32, steps=10, progress=False)
    seconds = time.perf_counter() - start
    startup = result.summary["startup"]
    rows.append({"variant": name, "seconds": seconds,
                 **{k: startup[k] for k in PARTS}})
    print(f"{name:48s} {seconds:6.2f} s  " + "  ".join(
        f"{k[:-2]} {startup[k]:.2f}" for k in PARTS), flush=True)
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
