"""An 8-point learning-rate sweep: ``lowbw.sweep`` vs 8 sequential runs.

What a researcher does today without sweeps is call ``lowbw.simulate`` once
per learning rate: every call validates, builds, compiles and runs its own
program. ``lowbw.sweep`` builds and compiles once and runs the 8 points as one
more vmapped axis (8 x W workers in one program). Both are timed end to end,
compilation included, in the same process and interleaved: 8 ``simulate``
calls; one ``lowbw.build`` run 8 times; ``lowbw.sweep`` with its default
points_per_batch (1 on a CPU: the points in turn on one program); and
``lowbw.sweep`` with all 8 points in one vmapped program. That separates what
compiling once saves from what batching the points saves. The sweeps' final
losses are checked against the sequential runs'.

Usage:
  python benchmarks/sweep_throughput.py                  # both workloads
  python benchmarks/sweep_throughput.py --workload mlp --repeats 3
  python benchmarks/sweep_throughput.py --json docs/benchmarks/sweep_cpu.json
"""

import argparse
import json
import platform
import statistics
import time

import jax
import numpy as np
import optax

import lowbw
from lowbw import data, models, strategies

LRS = [3e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2]

WORKLOADS = {
    # The digits MLP of `lowbw train --data digits` at W=8.
    "mlp": dict(model=lambda: models.mlp(hidden=(64,), num_classes=10),
                data=lambda: data.digits(), workers=8, batch_size=32,
                steps=300, H=10),
    # The default GPT of `lowbw train` (2 layers, d 128, 128 tokens) at W=4.
    "gpt": dict(model=lambda: models.gpt(layers=2, d_model=128, heads=4,
                                         seq_len=128, vocab=256),
                data=lambda: data.text_bytes(seq_len=128), workers=4,
                batch_size=8, steps=100, H=10),
}


def inner(lr):
  return optax.inject_hyperparams(optax.adamw)(learning_rate=lr,
                                               weight_decay=0.1)


def build_args(w, lr=LRS[0]):
  return dict(model=w["model"](), data=w["data"](),
              strategy=strategies.diloco(inner(lr), H=w["H"]),
              workers=w["num_workers"], batch_size=w["batch_size"],
              steps=w["steps"], eval_examples=64)


def sequential_simulate(w):
  """8 ``lowbw.simulate`` calls, each building and compiling its own run."""
  start = time.perf_counter()
  losses = [lowbw.simulate(**build_args(w, lr), progress=False)
            .summary["final_eval_loss"] for lr in LRS]
  return time.perf_counter() - start, losses


def sequential_runs(w):
  """One ``lowbw.build``, then 8 ``Simulator.run`` with new learning rates."""
  start = time.perf_counter()
  sim = lowbw.build(**build_args(w))
  losses = [sim.run(hparams={"inner_lr": lr}, progress=False)
            .summary["final_eval_loss"] for lr in LRS]
  return time.perf_counter() - start, losses


def swept(w, points_per_batch=None):
  """``lowbw.sweep`` of the 8 learning rates: one build; its default
  points_per_batch (1 on a CPU: one program, points in turn) or 8 (one
  vmapped program of 8 x W workers)."""
  start = time.perf_counter()
  result = lowbw.sweep(build_args(w), grid={"inner_lr": LRS},
                       points_per_batch=points_per_batch, progress=False)
  losses = [p.summary["final_eval_loss"] for p in result.points]
  return time.perf_counter() - start, losses, result.summary["compile_s"]


def measure(name: str, repeats: int) -> dict:
  w = WORKLOADS[name]
  # Warm the process (JAX's one-off start-up costs) before any timing.
  lowbw.simulate(**{**build_args(w), "steps": w["H"]}, progress=False)
  times = {"simulate": [], "build_run": [], "sweep": [], "sweep_vmap": []}
  compile_s = {"sweep": [], "sweep_vmap": []}
  for r in range(repeats):  # interleaved, order alternating
    order = list(times)
    for kind in (order if r % 2 == 0 else order[::-1]):
      if kind == "simulate":
        t, ref = sequential_simulate(w)
      elif kind == "build_run":
        t, runs = sequential_runs(w)
      elif kind == "sweep":
        t, got, c = swept(w)
        compile_s[kind].append(c)
      else:
        t, vgot, c = swept(w, len(LRS))
        compile_s[kind].append(c)
      times[kind].append(t)
  med = {k: statistics.median(v) for k, v in times.items()}
  return {
      "workload": name, "points": len(LRS),
      **{k: v for k, v in w.items() if isinstance(v, int)},
      "seconds": times, "median_s": med,
      "speedup_sweep_vs_simulate": med["simulate"] / med["sweep"],
      "speedup_sweep_vmap_vs_simulate": med["simulate"] / med["sweep_vmap"],
      "speedup_build_run_vs_simulate": med["simulate"] / med["build_run"],
      "sweep_compile_s": {k: statistics.median(v)
                          for k, v in compile_s.items()},
      "max_abs_loss_diff_sweep_vs_simulate": float(np.nanmax(np.abs(
          np.asarray(got) - np.asarray(ref)))),
      "max_abs_loss_diff_sweep_vmap_vs_simulate": float(np.nanmax(np.abs(
          np.asarray(vgot) - np.asarray(ref)))),
      "max_abs_loss_diff_build_run_vs_simulate": float(np.nanmax(np.abs(
          np.asarray(runs) - np.asarray(ref)))),
      "final_eval_losses": ref,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=["all", *WORKLOADS], default="all")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--json", help="write the figures here")
  args = parser.parse_args()
  names = list(WORKLOADS) if args.workload == "all" else [args.workload]
  rows = [measure(n, args.repeats) for n in names]
  machine = {"machine": platform.processor() or platform.machine(),
             "cpus": jax.local_device_count(), "backend": jax.default_backend(),
             "device": jax.devices()[0].device_kind, "jax": jax.__version__}
  for r in rows:
    m = r["median_s"]
    print(f"{r['workload']}: W={r['num_workers']}, {r['steps']} steps, "
          f"{r['points']} learning rates")
    print(f"  8 x simulate        {m['simulate']:8.1f} s")
    print(f"  build + 8 x run     {m['build_run']:8.1f} s  "
          f"({r['speedup_build_run_vs_simulate']:.2f}x)")
    c = r["sweep_compile_s"]
    print(f"  sweep (default)     {m['sweep']:8.1f} s  "
          f"({r['speedup_sweep_vs_simulate']:.2f}x; compile "
          f"{c['sweep']:.1f} s)")
    print(f"  sweep (vmapped x8)  {m['sweep_vmap']:8.1f} s  "
          f"({r['speedup_sweep_vmap_vs_simulate']:.2f}x; compile "
          f"{c['sweep_vmap']:.1f} s)")
    print(f"  max |final loss difference| vs simulate: default "
          f"{r['max_abs_loss_diff_sweep_vs_simulate']:.2e}, vmapped "
          f"{r['max_abs_loss_diff_sweep_vmap_vs_simulate']:.2e}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"machine": machine, "results": rows}, f, indent=2)


if __name__ == "__main__":
  main()
