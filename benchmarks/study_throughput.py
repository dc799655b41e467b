"""A study against the same points run one by one, and against its bound.

Two workloads:

* ``mlp``: 12 points, 3 H x 2 codecs x 2 seeds, the digits MLP at W=8
  (6 compiled shapes: H and the codec are shapes, seeds are not);
* ``gpt``: 4 points, 2 outer learning rates x 2 seeds, the default GPT of
  ``lowbw train`` (one compiled shape: the outer learning rate is traced).

Each arm runs in its own process with an empty persistent compilation cache
(nothing compiled by another arm is reused), in alternating order over
repeats:

* ``study``: ``lowbw.study(base, grid, seeds, out=...)`` (tables written, plots
  not drawn), end to end;
* ``separate``: one ``lowbw.simulate(point_config)`` per point, what a script
  with its own loop does (the persistent cache on, as by default: a second
  seed of a shape loads its programs instead of compiling them);
* ``separate_nocache``: the same with the cache off (mlp only).

The bound is the study's own *one compile per shape + each point's run
time*: the sum over its points of their summaries' ``compile_s`` (non-zero
for the first point of each build) and ``wall_time_s`` (the training loop).
The target is the study within 1.2x of the bound. Every arm's final losses
are compared with the study's.

Usage:
  python benchmarks/study_throughput.py                 # both workloads
  python benchmarks/study_throughput.py --workload mlp --repeats 3
  python benchmarks/study_throughput.py --json docs/benchmarks/study_throughput_cpu.json
  LOWBW_COMPILE_CACHE=$(mktemp -d) python benchmarks/study_throughput.py --workload mlp --phases
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = {
    "mlp": {"base": dict(data="digits", hidden="64", workers=8,
                         batch_size=32, steps=300, H=10, eval_examples=256),
            "grid": {"H": [10, 30, 100], "codec": ["float32", "quant:4"]},
            "seeds": [0, 1]},
    "gpt": {"base": dict(workers=8, H=50),
            "grid": {"outer_lr": [0.5, 0.7]}, "seeds": [0, 1]},
}
ARMS = {"mlp": ("study", "separate", "separate_nocache"),
        "gpt": ("study", "separate")}


def child(workload: str, arm: str) -> dict:
  """One arm, in this process: seconds, final losses, the bound's parts."""
  import lowbw
  w = WORKLOADS[workload]
  base = lowbw.Config(**w["base"], progress=False)
  start = time.perf_counter()
  if arm == "study":
    with tempfile.TemporaryDirectory() as out:
      result = lowbw.study(base, w["grid"], w["seeds"], out=out,
                           progress=False, plots=False)
    seconds = time.perf_counter() - start
    summaries = [p.summary for p in result.points]
    return {"seconds": seconds, "builds": result.summary["builds"],
            "losses": [s["final_eval_loss"] for s in summaries],
            "compile_s": sum(s["compile_s"] for s in summaries),
            "run_s": sum(s["wall_time_s"] for s in summaries)}
  points = lowbw.studies.expand(base, w["grid"], w["seeds"])
  losses = [lowbw.simulate(p.config).summary["final_eval_loss"]
            for p in points]
  return {"seconds": time.perf_counter() - start, "losses": losses}


def phases(workload: str) -> dict:
  """The study once, in this process, with its time split into compiling,
  running, the first and later initial states and builds, and the rest.
  (A compiled initial state's program is compiled in the run's
  ``compile_s``; the initial states' seconds here include it.)"""
  import collections
  import lowbw
  from lowbw.simulation import Simulator
  from lowbw.studies import _run
  seconds = collections.defaultdict(list)

  def timed(owner, name, key):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
      start = time.perf_counter()
      try:
        return original(*args, **kwargs)
      finally:
        seconds[key].append(time.perf_counter() - start)
    setattr(owner, name, wrapper)

  timed(_run, "build_config", "builds")
  timed(Simulator, "initial", "initial states")
  w = WORKLOADS[workload]
  base = lowbw.Config(**w["base"], progress=False)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as out:
    result = lowbw.study(base, w["grid"], w["seeds"], out=out,
                         progress=False, plots=False)
  total = time.perf_counter() - start
  compile_s = sum(p.summary["compile_s"] for p in result.points)
  run_s = sum(p.summary["wall_time_s"] for p in result.points)
  out = {"total_s": total, "compile_s": compile_s, "run_s": run_s,
         "other_s": total - compile_s - run_s}
  for key, values in seconds.items():
    out[f"first of the {key}_s"] = values[0]
    out[f"other {key}_s"] = sum(values[1:])
  return out


def run_arm(workload: str, arm: str) -> dict:
  with tempfile.TemporaryDirectory() as cache:
    env = {**os.environ, "LOWBW_COMPILE_CACHE":
           "0" if arm == "separate_nocache" else cache}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", workload, arm],
        capture_output=True, text=True, env=env, check=False)
  if proc.returncode:
    raise SystemExit(proc.stderr[-3000:])
  return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, repeats: int) -> dict:
  arms = ARMS[workload]
  runs = {a: [] for a in arms}
  for r in range(repeats):
    for arm in (arms if r % 2 == 0 else arms[::-1]):
      runs[arm].append(run_arm(workload, arm))
      print(f"  {workload} {arm}: {runs[arm][-1]['seconds']:.1f} s",
            file=sys.stderr, flush=True)
  med = {a: statistics.median(x["seconds"] for x in v)
         for a, v in runs.items()}
  study = runs["study"]
  bound = statistics.median(x["compile_s"] + x["run_s"] for x in study)
  ref = study[0]["losses"]
  diffs = {a: max(abs(x - y) for x, y in zip(v[0]["losses"], ref))
           for a, v in runs.items()}
  w = WORKLOADS[workload]
  return {"workload": workload, **w, "points": len(ref), "repeats": repeats,
          "builds": study[0]["builds"], "seconds": {
              a: [x["seconds"] for x in v] for a, v in runs.items()},
          "median_s": med, "bound_s": bound,
          "bound_compile_s": statistics.median(x["compile_s"] for x in study),
          "bound_run_s": statistics.median(x["run_s"] for x in study),
          "study_over_bound": med["study"] / bound,
          "speedup_vs_separate": {a: med[a] / med["study"] for a in arms
                                  if a != "study"},
          "max_abs_loss_diff_vs_study": diffs, "final_eval_losses": ref}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=["all", *WORKLOADS],
                      default="all")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--json", help="write the figures here")
  parser.add_argument("--phases", action="store_true", help="run the "
                      "study once in this process and split its time "
                      "(compiling, running, first and later builds and "
                      "initial states); start with LOWBW_COMPILE_CACHE "
                      "set to an empty folder")
  parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(child(*args.child)))
    return
  if args.phases:
    for name in (list(WORKLOADS) if args.workload == "all"
                 else [args.workload]):
      print(name, {k: round(v, 2) for k, v in phases(name).items()})
    return
  import jax
  names = list(WORKLOADS) if args.workload == "all" else [args.workload]
  rows = [measure(n, args.repeats) for n in names]
  for r in rows:
    m = r["median_s"]
    print(f"{r['workload']}: {r['points']} points, {r['builds']} builds; "
          f"bound {r['bound_s']:.1f} s (compile {r['bound_compile_s']:.1f} "
          f"s + runs {r['bound_run_s']:.1f} s)")
    print(f"  study               {m['study']:8.1f} s  "
          f"({r['study_over_bound']:.2f}x the bound)")
    for arm, speedup in r["speedup_vs_separate"].items():
      print(f"  {arm:<19} {m[arm]:8.1f} s  (the study is {speedup:.2f}x "
            f"faster; max |loss diff| {r['max_abs_loss_diff_vs_study'][arm]:.1e})")
  if args.json:
    machine = {"machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "backend": jax.default_backend(),
               "device": jax.devices()[0].device_kind, "jax": jax.__version__}
    with open(args.json, "w") as f:
      json.dump({"machine": machine, "results": rows}, f, indent=2)


if __name__ == "__main__":
  main()
