"""Memory against W at large worker counts: the state, the estimate made
before compiling, and the process's measured peak.

Each configuration runs in its own child process (a clean peak): it builds a
DiLoCo run with ``worker_batch="auto"`` (the default; the plan's choice is
reported), runs ``--rounds`` rounds, and reports

- ``state_bytes``: the run's state (parameters, Adam moments, global
  parameters and outer momentum), exact from the abstract state;
- ``estimate_bytes``: the build's estimate (``lowbw.simulation._memory``);
- ``peak_bytes``: the process's peak resident memory (VmHWM) after the run,
  and ``base_bytes``, its resident memory before building (runtime, JAX);
- ``round_s``: seconds per round (median of the rounds after the first).

*Per added worker* is the growth of the peak between consecutive worker
counts over the growth of W, against the state's bytes per worker: the
figure the memory targets of docs/performance.md are about.

The MLP is digits-shaped (64 features, 256-256 hidden, 10 classes, 85,002
parameters) on synthetic data with enough examples for every worker (digits
has 1,438); the GPT is the default one on the standard library's text. No
baseline runs here: one replica at batch W·b would not fit.

Usage:
  python benchmarks/memory_scale.py                       # MLP and GPT grids
  python benchmarks/memory_scale.py --model mlp --workers 1000,10000
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

DEFAULT_WORKERS = {"mlp": "1000,2000,10000", "gpt": "64,128,1024"}

_CHILD = """
import json, sys, time
import numpy as np
import jax
import lowbw
from lowbw import data, models, strategies

from lowbw.bench import _proc_status as rss  # /proc/self/status, bytes

model, w, b, h, rounds = sys.argv[1], *map(int, sys.argv[2:6])
group = sys.argv[6]
base = rss("VmRSS")
if model == "mlp":
  rng = np.random.default_rng(0)
  n = w * b * 2
  m = models.mlp(hidden=(256, 256), num_classes=10)
  d = data.arrays(rng.normal(size=(n, 64)).astype(np.float32),
                  rng.integers(0, 10, n), eval_fraction=0.05)
else:
  m, d = models.gpt(), data.text_bytes()
sim = lowbw.build(m, d, strategies.diloco(H=h), workers=w, batch_size=b,
                  steps=rounds * h, rounds_per_chunk=1, eval_every=None,
                  worker_batch=group, compile=False)
state, sampler, _, _ = sim.initial(0)
exe, state = sim.executables(state, sampler, None)
times = []
for _ in range(rounds):
  start = time.perf_counter()
  state, out = exe.chunk(state, sampler, 1, None)
  jax.block_until_ready(state)
  times.append(time.perf_counter() - start)
st = state.strategy
state_bytes = sum(x.nbytes for x in jax.tree.leaves(st))
print(json.dumps({
    "model": model, "W": w, "batch_size": b, "H": h, "rounds": rounds,
    "num_params": sim.num_params, "worker_batch": sim.config.worker_batch,
    "state_bytes": state_bytes, "state_per_worker": state_bytes / w,
    "estimate_bytes": sim.memory.estimate_bytes,
    "budget_bytes": sim.memory.budget and sim.memory.budget.bytes,
    "base_bytes": base, "peak_bytes": rss("VmHWM"),
    "round_s": sorted(times[1:] or times)[len(times[1:] or times) // 2],
    "train_loss": float(np.asarray(out.steps.loss)[0, -1])}))
"""


def measure(model: str, w: int, b: int, h: int, rounds: int,
            group: str = "auto") -> dict:
  out = subprocess.run(
      [sys.executable, "-c", _CHILD, model, str(w), str(b), str(h),
       str(rounds), group], capture_output=True, text=True,
      env=dict(os.environ))
  if out.returncode:
    err = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"model": model, "W": w, "error": err}
  return json.loads(out.stdout.strip().splitlines()[-1])


def add_marginal(rows: list[dict]) -> None:
  prev = None
  for r in rows:
    if "error" in r:
      continue
    if prev is not None and prev["model"] == r["model"]:
      grow = (r["peak_bytes"] - prev["peak_bytes"]) / (r["W"] - prev["W"])
      r["per_added_worker"] = grow
      r["per_added_ratio"] = grow / r["state_per_worker"]
    prev = r


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="mlp,gpt")
  parser.add_argument("--workers", help="worker counts (default per model: "
                      + "; ".join(f"{k} {v}" for k, v in
                                  DEFAULT_WORKERS.items()) + ")")
  parser.add_argument("--batch-size", type=int, help="default 4 (MLP), "
                      "8 (GPT)")
  parser.add_argument("--H", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--worker-batch", default="auto",
                      help="auto (default), all, or a group size")
  parser.add_argument("--json", help="write the figures here")
  args = parser.parse_args()
  rows = []
  for model in args.model.split(","):
    if model not in DEFAULT_WORKERS:
      parser.error(f"--model {model!r}: expected mlp or gpt")
    b = args.batch_size or {"mlp": 4, "gpt": 8}[model]
    for w in map(int, (args.workers or DEFAULT_WORKERS[model]).split(",")):
      print(f"{model} W={w} ...", file=sys.stderr, flush=True)
      rows.append(measure(model, w, b, args.H, args.rounds,
                          args.worker_batch))
      print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  add_marginal(rows)
  print(" | ".join(["model", "W", "worker batch", "state MB", "estimate MB",
                    "peak MB", "per added worker MB", "ratio to state",
                    "round s"]))
  for r in rows:
    if "error" in r:
      print(f"{r['model']} | {r['W']} | error: {r['error']}")
      continue
    added = r.get("per_added_worker")
    print(" | ".join([
        r["model"], str(r["W"]), str(r["worker_batch"] or "all"),
        f"{r['state_bytes'] / 1e6:,.0f}", f"{r['estimate_bytes'] / 1e6:,.0f}",
        f"{r['peak_bytes'] / 1e6:,.0f}",
        "-" if added is None else f"{added / 1e6:.2f}",
        "-" if added is None else f"{r['per_added_ratio']:.2f}",
        f"{r['round_s']:.2f}"]))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
