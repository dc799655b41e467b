"""Regenerates the calibration CSVs from a clone of Adnan082/diloco-measured.

Usage:
  git clone https://github.com/Adnan082/diloco-measured /tmp/diloco-measured
  python benchmarks/calibration/extract.py /tmp/diloco-measured

Writes ``measured_runs.csv`` (one row per measured run of the compute-
utilisation grid: DDP, LocalSGD and DiLoCo on 4 nodes) and ``network.csv``
(the network characterization: iperf3 pairs, the NCCL all-reduce curve, the
sustained-transfer probe) next to this file. README.md says where each column
comes from. Only measured figures are read (JSON files); none of that
repository's code is run or copied.
"""

import argparse
import csv
import glob
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TELEMETRY = "experiments/01_cu_grid/raw_step_telemetry*/*.json"
PROFILE = "results/network/phase1-us-east-1b-20260814.json"
DTYPE_BYTES = 4  # every run synchronised float32 tensors
# DiLoCo and LocalSGD all-reduce each parameter tensor on its own (a loop
# over model.parameters()); the 30.8M model (dim 256, 6 layers, no biases)
# has 1 embedding + 6 x (4 attention + 3 MLP + 2 norm) + 1 norm + 1 output
# = 57 tensors. DDP's bucketed all-reduce count was not recorded.
CALLS_PER_SYNC = {"diloco": 57, "localsgd": 57, "ddp": None}

RUN_COLUMNS = (
    "run_id", "method", "H", "link", "nominal_bps", "shaped_bps",
    "rate_source", "workers", "params", "dtype_bytes", "repeat", "steps",
    "warmup_steps", "window_steps", "syncs_in_window", "compute_s_per_step",
    "host_s_per_step", "sync_s_mean", "sync_s_min", "sync_s_max",
    "first_sync_s", "first_sync_in_window", "wall_s_per_step",
    "wall_s_per_round", "cu", "allreduce_calls_per_sync", "date", "source",
    "source_summary")
NETWORK_COLUMNS = ("kind", "from_node", "to_node", "msg_bytes", "rate_bps",
                   "t_s", "duration_s", "source")


def _fail(field: str, value, allowed: str) -> SystemExit:
  """A one-line error in lowbw's form: field=value is invalid: allowed."""
  return SystemExit(f"{field}={value!r} is invalid: {allowed}")


def _read_json(root: str, path: str) -> dict:
  full = os.path.join(root, path)
  if not os.path.isfile(full):
    raise _fail("PATH_TO_CLONE", root, f"has no {path} (expected a clone "
                "of Adnan082/diloco-measured)")
  with open(full) as f:
    return json.load(f)


def _num(x) -> str:
  """Nine significant digits (far below the runs' own spread); rates and
  byte counts as whole numbers."""
  if x is None:
    return ""
  if isinstance(x, (bool, int)) or abs(x) >= 1e6:
    return str(round(x))
  return f"{x:.9g}"


def _window(telemetry: dict) -> tuple[list, list]:
  """The measured steps (after the warm-up the run discarded) and every
  step's sync time of the whole run (warm-up included)."""
  records = telemetry["step_records"]
  syncs = [r["sync_blocked_ms"] / 1e3 for r in records if r["did_outer_step"]]
  return records[telemetry["warmup_steps"]:], syncs


def run_row(root: str, path: str) -> dict:
  """One measured run: per-step telemetry, plus its summary record's CU,
  link settings and shaping verification."""
  tel = _read_json(root, path)
  summary_path = f"results/raw/{tel['run_id']}.json"
  summary = _read_json(root, summary_path)
  spec, shaping = summary["spec"], summary["shaping"]
  kept, all_syncs = _window(tel)
  syncs = [r["sync_blocked_ms"] / 1e3 for r in kept if r["did_outer_step"]]
  n = len(kept)
  compute = sum(r["compute_time_ms"] for r in kept) / 1e3
  host = sum(r["optimizer_time_ms"] + r["loader_stall_ms"] for r in kept) / 1e3
  wall = sum(r["wall_time_ms"] for r in kept) / 1e3
  first_index = next(i for i, r in enumerate(tel["step_records"])
                     if r["did_outer_step"])
  # The summary's totals come from the same window: a mismatch would mean
  # this script reads the window differently from the run's own analysis.
  if abs(compute - summary["cu"]["compute_s"]) > 1e-6 * max(compute, 1.0):
    raise _fail(f"{summary_path}: cu.compute_s", summary["cu"]["compute_s"],
                f"must equal the compute seconds of {path}'s steps after "
                f"its warm-up, {compute!r}")
  method, H = spec["algorithm"], tel["H"]
  link, repeat = tel["run_id"].rsplit("-bw", 1)[1].rsplit("-r", 1)
  return {
      "run_id": tel["run_id"], "method": method, "H": H, "link": link,
      "nominal_bps": spec["bandwidth_requested_bps"],
      "shaped_bps": None if shaping is None else shaping["measured_bps"],
      "rate_source": "run" if shaping is not None else None,
      "workers": tel["world_size"], "params": tel["n_params"],
      # The repeats' records all say spec.repeat_index 0 (the run ids and
      # start dates tell them apart): the run id's -rN is the repeat.
      "dtype_bytes": DTYPE_BYTES, "repeat": int(repeat),
      "steps": tel["steps"], "warmup_steps": tel["warmup_steps"],
      "window_steps": n, "syncs_in_window": len(syncs),
      "compute_s_per_step": compute / n, "host_s_per_step": host / n,
      "sync_s_mean": statistics.fmean(syncs), "sync_s_min": min(syncs),
      "sync_s_max": max(syncs), "first_sync_s": all_syncs[0],
      "first_sync_in_window": first_index >= tel["warmup_steps"],
      "wall_s_per_step": wall / n, "wall_s_per_round": wall / n * H,
      "cu": summary["cu"]["cu_measured"],
      "allreduce_calls_per_sync": CALLS_PER_SYNC[method],
      "date": summary["started_at"][:10], "source": path,
      "source_summary": summary_path}


def fill_rates(rows: list, iperf_bps: float) -> None:
  """Gives every row a link rate. Unshaped runs: the iperf3 mean of the
  network characterization. DDP's shaped runs carry no verification in
  their records (the grid's resumed pass dropped it): they take the median
  of the LocalSGD verifications at the same level, measured on the same
  cluster launch the same day."""
  same_level = {}
  for r in rows:
    if r["method"] == "localsgd" and r["shaped_bps"] is not None:
      same_level.setdefault(r["link"], []).append(r["shaped_bps"])
  for r in rows:
    if r["shaped_bps"] is not None:
      continue
    if r["nominal_bps"] is None:
      r["shaped_bps"], r["rate_source"] = iperf_bps, "iperf3_unshaped"
    elif r["method"] == "ddp" and r["link"] in same_level:
      r["shaped_bps"] = statistics.median(same_level[r["link"]])
      r["rate_source"] = "localsgd_same_level"
    else:
      raise _fail(f"{r['source_summary']}: shaping", None,
                  f"a shaped run ({r['link']}) needs its verified rate; "
                  "only DDP runs may borrow LocalSGD's at the same level")


def network_rows(profile: dict) -> list:
  rows = [{"kind": "iperf3_pair", "from_node": p["from_node"],
           "to_node": p["to_node"], "rate_bps": p["gbit_s"] * 1e9,
           "duration_s": p["duration_s"]} for p in profile["iperf_pairs"]]
  rows += [{"kind": "nccl_allreduce_bus", "msg_bytes": p["msg_bytes"],
            "rate_bps": p["achieved_bps"]} for p in profile["nccl_curve"]]
  rows += [{"kind": "sustained_transfer", "t_s": p["t_s"],
            "rate_bps": p["bps"]} for p in profile["burst_decay_curve"]]
  for r in rows:
    r["source"] = PROFILE
  return rows


def iperf_mean_bps(profile: dict) -> float:
  return statistics.fmean(p["gbit_s"] for p in profile["iperf_pairs"]) * 1e9


def write_csv(path: str, rows: list, columns: tuple) -> None:
  with open(path, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
      w.writerow([_num(r.get(c)) if not isinstance(r.get(c), str) else r[c]
                  for c in columns])


def commit_of(root: str) -> str:
  try:
    out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"],
                         capture_output=True, text=True, check=True)
  except (OSError, subprocess.CalledProcessError):
    return "unknown (not a git checkout)"
  return out.stdout.strip()


def extract(root: str, out_dir: str = HERE) -> tuple[list, list]:
  paths = sorted(os.path.relpath(p, root)
                 for p in glob.glob(os.path.join(root, TELEMETRY)))
  if not paths:
    raise _fail("PATH_TO_CLONE", root, f"has no {TELEMETRY} (expected a "
                "clone of Adnan082/diloco-measured)")
  profile = _read_json(root, PROFILE)
  order = {"ddp": 0, "localsgd": 1, "diloco": 2}
  rows = sorted((run_row(root, p) for p in paths), key=lambda r: (
      order[r["method"]], r["H"], r["nominal_bps"] or float("inf"),
      r["repeat"]))
  fill_rates(rows, iperf_mean_bps(profile))
  net = network_rows(profile)
  write_csv(os.path.join(out_dir, "measured_runs.csv"), rows, RUN_COLUMNS)
  write_csv(os.path.join(out_dir, "network.csv"), net, NETWORK_COLUMNS)
  return rows, net


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("clone", metavar="PATH_TO_CLONE",
                      help="a local clone of Adnan082/diloco-measured")
  parser.add_argument("--out", default=HERE, help="folder for the CSVs")
  args = parser.parse_args(argv)
  rows, net = extract(args.clone, args.out)
  print(f"{len(rows)} runs, {len(net)} network rows from commit "
        f"{commit_of(args.clone)} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
  main()
