"""GB/s of every form of the worker reduction vs a plain memory copy.

Every mean or sum over the whole worker axis in lowbw (means, masked means
under faults, sums, divergence norms; not yet ``group_mean``) ends in
``lowbw.transforms._leading_sum.leading_sum``, which picks a form per backend
and dtype. This measures each form on a (W, P) array next to two copies of the
same bytes, in one process, interleaved (each repeat times every form once):

- ``copy (XLA)``: ``x * s`` compiled by XLA (reads and writes the bytes, its
  output freshly allocated as every program's is);
- ``copy (memcpy)``: ``np.copyto`` into a preallocated buffer, the machine's
  raw copy.

GB/s is the input's bytes over the median time, for the copies too (a copy
moves twice that: it writes as much as it reads). ``lowbw`` is what
``worker_mean`` compiles to on this backend.

Usage:
  python benchmarks/reductions.py                       # W = 8, 128, 1024
  python benchmarks/reductions.py --params 478976 --dtype bfloat16
  python benchmarks/reductions.py --json docs/benchmarks/reductions_cpu.json
"""

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import transforms
from lowbw.transforms import _leading_sum


def _timer(fn, x):
  out = fn(x)
  jax.block_until_ready(out)

  def once():
    start = time.perf_counter()
    jax.block_until_ready(fn(x))
    return time.perf_counter() - start

  return once


def _memcpy_timer(x):
  src = np.asarray(x)
  dst = np.empty_like(src)

  def once():
    start = time.perf_counter()
    np.copyto(dst, src)
    return time.perf_counter() - start

  return once


def _forms(w: int, masked: bool):
  mask = jnp.asarray(np.arange(w) % 4 != 3) if masked else None
  fns = {name: jax.jit(lambda x, f=f: f(x, mask))
         for name, f in _leading_sum.FORMS.items()}
  fns["lowbw"] = jax.jit(lambda x: transforms.worker_mean(x, mask))
  return fns


def measure(w: int, params: int, dtype, repeats: int, masked: bool) -> dict:
  x = jax.random.normal(jax.random.key(0), (w, params), jnp.float32)
  x = x.astype(dtype)
  scale = jnp.asarray(1.5, dtype)
  timers = {"copy (XLA)": _timer(jax.jit(lambda x: x * scale), x),
            "copy (memcpy)": _memcpy_timer(x)}
  timers.update({k: _timer(f, x) for k, f in _forms(w, masked).items()})
  times = {k: [] for k in timers}
  for _ in range(repeats):
    for k, once in timers.items():
      times[k].append(once())
  med = {k: statistics.median(v) for k, v in times.items()}
  spread = {k: (max(v) - min(v)) / med[k] for k, v in times.items()}
  gbs = {k: x.nbytes / t / 1e9 for k, t in med.items()}
  return {"W": w, "params": params, "dtype": jnp.dtype(dtype).name,
          "masked": masked, "bytes": x.nbytes,
          "chosen_form": _leading_sum.chosen_form(x),
          "ms": {k: t * 1e3 for k, t in med.items()},
          "relative_spread": spread, "GB/s": gbs}


def _row(r: dict) -> str:
  g = r["GB/s"]
  copy = g["copy (XLA)"]
  cells = [f"{r['W']}", r["dtype"] + (" masked" if r["masked"] else "")]
  for k in ("copy (memcpy)", "copy (XLA)", "native", "dot", "fold_dot",
            "lowbw"):
    cells.append(f"{g[k]:.2f}" + ("" if k.startswith("copy")
                                  else f" ({g[k] / copy:.2f}x)"))
  return "| " + " | ".join(cells) + " |"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", default="8,128,1024")
  parser.add_argument("--params", type=int, default=85_002,
                      help="parameters per worker (default: the digits MLP "
                      "64-256-256-10)")
  parser.add_argument("--dtype", default="float32,bfloat16")
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  rows = []
  print("| W | dtype | memcpy GB/s | XLA copy GB/s | native (x copy) | dot | "
        "fold_dot | lowbw |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for w in (int(v) for v in args.workers.split(",")):
    for dtype in args.dtype.split(","):
      for masked in (False, True):
        r = measure(w, args.params, jnp.dtype(dtype), args.repeats, masked)
        rows.append(r)
        print(_row(r), flush=True)
  meta = {"backend": jax.default_backend(),
          "device": str(jax.devices()[0].device_kind),
          "machine": platform.processor() or platform.machine(),
          "jax": jax.__version__, "repeats": args.repeats}
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
