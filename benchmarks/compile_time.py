"""Compile time of a run's programs against W and H, cold and from the cache.

For each configuration, in one process: ``lowbw.build`` with the persistent
compilation cache in an empty temporary folder (cold: XLA compiles every
program and writes it), then ``lowbw.build`` of the identical configuration
again (warm: what a second ``simulate`` call or a second ``lowbw train`` of
the same run pays, the programs loaded from the folder). The figure is the
build's compile-and-load time as the run reports it (``compile_s``).

The cache folder is set once per process, so each configuration runs in its
own child process.

Usage:
  python benchmarks/compile_time.py                     # MLP and GPT, W x H grid
  python benchmarks/compile_time.py --model mlp --workers 8,1024 --H 10
"""

import os

# Throughput and compile time of XLA's optimised programs (lowbw's default
# compile_effort would compile a small CPU run with XLA's quickest settings).
os.environ.setdefault("LOWBW_COMPILE_EFFORT", "full")

import argparse
import json
import os
import subprocess
import sys
import tempfile

MODELS = ("mlp", "gpt")

_CHILD = """
import json, sys, time
import lowbw
from lowbw import data, models, strategies
model, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if model == "mlp":
  m, d, b = models.mlp(hidden=(256, 256), num_classes=10), data.digits(), 1
else:
  m, d, b = models.gpt(), data.text_bytes(), 1
out = {}
for phase in ("cold", "warm"):
  start = time.perf_counter()
  sim = lowbw.build(m, d, strategies.diloco(H=h), workers=w, batch_size=b,
                    steps=4 * h)
  out[phase] = sim.take_compile_s()
  out[phase + "_build_s"] = time.perf_counter() - start
print(json.dumps(out))
"""


def measure(model: str, w: int, h: int) -> dict:
  with tempfile.TemporaryDirectory() as folder:
    env = {**os.environ, "LOWBW_COMPILE_CACHE": folder}
    out = subprocess.run([sys.executable, "-c", _CHILD, model, str(w), str(h)],
                         env=env, check=True, capture_output=True, text=True)
  return {"model": model, "W": w, "H": h,
          **json.loads(out.stdout.strip().splitlines()[-1])}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="mlp,gpt")
  parser.add_argument("--workers", default="1,8,64,256")
  parser.add_argument("--H", default="10,50")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  bad = sorted(set(args.model.split(",")) - set(MODELS))
  if bad:
    parser.error(f"--model={','.join(bad)}: expected one of "
                 f"{', '.join(MODELS)}")
  rows = []
  print("| model | W | H | cold compile s | warm (cache) s | cold build s | "
        "warm build s |")
  print("| --- | --- | --- | --- | --- | --- | --- |")
  for model in args.model.split(","):
    for w in (int(v) for v in args.workers.split(",")):
      for h in (int(v) for v in args.H.split(",")):
        r = measure(model, w, h)
        rows.append(r)
        print(f"| {model} | {w} | {h} | {r['cold']:.2f} | {r['warm']:.2f} | "
              f"{r['cold_build_s']:.2f} | {r['warm_build_s']:.2f} |",
              flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
