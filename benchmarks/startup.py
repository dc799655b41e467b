"""Seconds from a fresh ``lowbw train`` process to its first logged row.

Each measurement starts a new process, as a user's command does, and
records, from the moment it is started:

- ``import``: ``python -c "import lowbw"`` alone (its own process);
- ``first step``: the process's age when training started, from the
  run's summary (``startup.first_step_after_start_s``; Linux);
- ``first row``: the run's ``metrics.csv`` holds its first logged row (the
  file is polled every 10 ms);
- ``exit``: the process ended (the run, its evaluation and its files);
- ``compile``: the run's own ``compile_s`` (compiling or loading its
  programs), from its ``summary.json``;
- the run's own breakdown (``summary.json``'s ``startup``): building the
  simulator, the initial state, tracing, compiling or loading, and the
  first chunk (training until the first row).

*Cold*: the persistent compilation cache (``LOWBW_COMPILE_CACHE``) is an
empty folder; *warm*: the same command again on the folder the cold run
filled. Each configuration runs with lowbw's default devices (one CPU
device per core) and with ``LOWBW_CPU_DEVICES=1``; repeats are
interleaved, figures are medians.

Usage:
  python benchmarks/startup.py                    # digits MLP and the default GPT
  python benchmarks/startup.py --runs mlp --repeats 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from lowbw.telemetry import STARTUP_PHASES

RUNS = {
    # The digits MLP (64-256-256-10) under DiLoCo, W = 8.
    "mlp": ["--data", "digits", "--model", "mlp", "--hidden", "256,256",
            "--strategy", "diloco", "--H", "10", "--steps", "200"],
    # The default run (the default GPT on the embedded text), one round.
    "gpt": ["--steps", "100"],
}
DEVICES = {"cores": None, "one": "1"}
# The run's own breakdown (summary.json's ``startup``), in the order spent;
# the import is measured here, in a process of its own.
PHASES = tuple(key for key, _ in STARTUP_PHASES if key != "import_s")


def _env(cache: str, devices: str | None) -> dict:
  env = dict(os.environ, LOWBW_COMPILE_CACHE=cache)
  env.pop("LOWBW_CPU_DEVICES", None)
  if devices is not None:
    env["LOWBW_CPU_DEVICES"] = devices
  return env


def import_s(devices: str | None) -> float:
  start = time.perf_counter()
  subprocess.run([sys.executable, "-c", "import lowbw"], check=True,
                 env=_env(tempfile.gettempdir(), devices))
  return time.perf_counter() - start


def one(args: list, cache: str, devices: str | None) -> dict:
  """A ``lowbw train`` process: seconds to its first row and to its exit."""
  with tempfile.TemporaryDirectory() as out:
    csv = os.path.join(out, "metrics.csv")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lowbw", "train", *args, "--no-progress",
         "--out", out], env=_env(cache, devices),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
      if first is None and os.path.exists(csv):
        with open(csv) as f:
          if len(f.read().splitlines()) >= 2:
            first = time.perf_counter() - start
      time.sleep(0.01)
    end = time.perf_counter() - start
    if proc.returncode:
      raise RuntimeError(proc.stderr.read())
    with open(os.path.join(out, "summary.json")) as f:
      summary = json.load(f)
  startup = summary["startup"]
  return {"first_step_s": startup.get("first_step_after_start_s"),
          "first_row_s": first if first is not None else end, "exit_s": end,
          "compile_s": summary["compile_s"],
          **{"run_" + k: startup[k] for k in PHASES},
          "devices": summary.get("config", {}).get("devices")}


def _seconds(value) -> str:
  return "–" if value is None else f"{value:.2f}"


def measure(name: str, repeats: int) -> list[dict]:
  times = {(d, phase): [] for d in DEVICES for phase in ("cold", "warm")}
  imports = {d: [] for d in DEVICES}
  for _ in range(repeats):
    for d, value in DEVICES.items():
      imports[d].append(import_s(value))
      with tempfile.TemporaryDirectory() as cache:
        for phase in ("cold", "warm"):
          times[(d, phase)].append(one(RUNS[name], cache, value))
  rows = []
  for (d, phase), runs in times.items():
    row = {"run": name, "devices": d, "cache": phase,
           "import_s": statistics.median(imports[d])}
    for key in ("first_step_s", "first_row_s", "exit_s", "compile_s",
                *("run_" + k for k in PHASES)):
      values = [r[key] for r in runs if r[key] is not None]
      row[key] = statistics.median(values) if values else None
    row["all"] = runs
    rows.append(row)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--runs", default=",".join(RUNS),
                      help=f"{' and/or '.join(RUNS)}, comma-separated")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  bad = sorted(set(args.runs.split(",")) - set(RUNS))
  if bad:
    parser.error(f"--runs={','.join(bad)}: expected one of {', '.join(RUNS)}")
  print("| run | devices | cache | import s | first step s | first row s | "
        "exit s | "
        "compile s | " + " | ".join(
            name for key, name in STARTUP_PHASES if key in PHASES) + " |")
  print("| --- " * 13 + "|")
  rows = []
  for name in args.runs.split(","):
    for r in measure(name, args.repeats):
      rows.append(r)
      print(f"| {r['run']} | {r['devices']} | {r['cache']} | "
            f"{r['import_s']:.2f} | {_seconds(r['first_step_s'])} | "
            f"{r['first_row_s']:.2f} | "
            f"{r['exit_s']:.2f} | {r['compile_s']:.2f} | "
            + " | ".join(f"{r['run_' + k]:.2f}" for k in PHASES) + " |",
            flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"repeats": args.repeats, "cpus": os.cpu_count(),
                 "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
