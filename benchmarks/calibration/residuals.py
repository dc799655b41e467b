"""How far lowbw's simulated clock is from 73 measured runs.

For each run of ``measured_runs.csv`` (DDP, LocalSGD and DiLoCo on 4 NVIDIA
L40S nodes over tc-shaped TCP links; README.md), lowbw's clock is configured
as a user would configure it:

  lowbw.network.network(bandwidth=<the verified link rate>, latency=0,
                        topology="ring", hardware="<measured compute s>s",
                        profile="ideal")

and asked, through ``lowbw.network.price`` (what a run's clock reads), for
the seconds of one all-reduce of params x 4 bytes (float32) among the 4
workers: DDP's gradients every step, LocalSGD's parameters and DiLoCo's
pseudo-gradient every H steps. The measured compute per step is the hardware
time, so only the network part is judged. The profile is "ideal" (latency +
bytes / bandwidth: the clock before its measured terms; report.py scores
those). Latency is 0: the runs' tc rule (``tbf ... latency 50ms``) bounds the
queue and adds no delay, and the network characterization recorded no
round-trip time.

Relative error = predicted / measured - 1 (negative: the clock is too fast):

- sync: seconds of one sync against the run's mean sync seconds;
- CU (compute utilisation, compute / wall): over the run's own measured
  window (its steps after warm-up, with the syncs that fell in it), the
  clock's ``steps x c / (steps x c + syncs x sync)``. The clock has no host
  time, so the measured wall's optimizer and data-loader time (column
  host_s_per_step) counts against it.

Usage:
  python benchmarks/calibration/residuals.py
  python benchmarks/calibration/residuals.py --simulate   # also check one
      # DDP and one DiLoCo row against a real lowbw.simulate run
  python benchmarks/calibration/residuals.py \\
      --json docs/benchmarks/calibration_residuals_cpu.json --simulate
"""

import argparse
import csv
import json
import os
import statistics

from lowbw import network as net_lib

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "measured_runs.csv")
LATENCY_S = 0.0
METHODS = ("ddp", "localsgd", "diloco")
INTS = ("H", "workers", "params", "dtype_bytes", "repeat", "steps",
        "warmup_steps", "window_steps", "syncs_in_window")


def load_runs(path: str = RUNS) -> list[dict]:
  """The CSV's rows, with numbers as numbers (empty cells: None)."""
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    for k, v in r.items():
      if k in INTS:
        r[k] = int(v)
      elif k not in ("run_id", "method", "link", "rate_source", "date",
                     "source", "source_summary"):
        r[k] = None if v == "" else float(v)
  return rows


def clock_of(row: dict, latency_s: float = LATENCY_S) -> tuple:
  """lowbw's ``(seconds of one sync, seconds of one step)`` for ``row``."""
  net = net_lib.network(row["shaped_bps"], latency_s, topology="ring",
                        hardware=f"{row['compute_s_per_step']!r}s",
                        profile="ideal")
  payload = row["params"] * row["dtype_bytes"]
  sync = {"sync": net_lib.ring_allreduce(payload, row["workers"])}
  pricing = net_lib.price(net, sync, row["workers"], row["params"],
                          flops_per_step=1.0)
  return pricing.clock_costs["sync"].seconds, pricing.step_s


def predict(row: dict, latency_s: float = LATENCY_S) -> dict:
  """The clock's sync seconds and CU for ``row``, and their relative
  errors against what was measured."""
  sync_s, step_s = clock_of(row, latency_s)
  work = row["window_steps"] * step_s
  cu = work / (work + row["syncs_in_window"] * sync_s)
  cu_round = row["H"] * step_s / (row["H"] * step_s + sync_s)
  return {"run_id": row["run_id"], "method": row["method"], "H": row["H"],
          "link": row["link"], "bandwidth_bps": row["shaped_bps"],
          "rate_source": row["rate_source"],
          "sync_s": sync_s, "sync_s_measured": row["sync_s_mean"],
          "sync_err": sync_s / row["sync_s_mean"] - 1,
          "cu": cu, "cu_measured": row["cu"], "cu_err": cu / row["cu"] - 1,
          "cu_round": cu_round, "cu_round_err": cu_round / row["cu"] - 1}


def summarize(preds: list[dict]) -> dict:
  """Median and max |relative error| of sync seconds and CU, and the share
  of runs the clock times too fast."""
  out = {"runs": len(preds)}
  for key in ("sync_err", "cu_err", "cu_round_err"):
    errs = [abs(p[key]) for p in preds]
    out[key.replace("_err", "")] = {"median": statistics.median(errs),
                                    "max": max(errs)}
  out["too_fast"] = sum(p["sync_err"] < 0 for p in preds) / len(preds)
  return out


def tables(preds: list[dict]) -> dict:
  """Per method (all runs, and the tc-shaped ones only: an unshaped run's
  rate is one iperf3 TCP flow's, below what the ring achieved), and per
  method and link level."""
  def per_method(ps):
    return {m: summarize([p for p in ps if p["method"] == m])
            for m in METHODS}
  by_link = {}
  for p in preds:
    by_link.setdefault(f"{p['method']} {p['link']}", []).append(p)
  return {"by_method": per_method(preds),
          "by_method_shaped": per_method(
              [p for p in preds if p["link"] != "unshaped"]),
          "by_method_and_link": {k: summarize(v) for k, v in by_link.items()}}


def link_findings(rows: list[dict]) -> dict:
  """Per method and link, over the runs whose first sync fell in the
  warm-up (so their mean sync time holds no start-up): the rate the ring
  achieved as a share of the verified link rate (2(W-1)/W x bytes x 8 /
  mean sync seconds / rate), and how much longer the run's first sync took
  than its mean sync (the first collective's start-up)."""
  groups = {}
  for r in rows:
    if not r["first_sync_in_window"]:
      groups.setdefault(f"{r['method']} {r['link']}", []).append(r)
  out = {}
  for name, rs in sorted(groups.items()):
    shares = [2 * (r["workers"] - 1) / r["workers"] * r["params"]
              * r["dtype_bytes"] * 8 / r["sync_s_mean"] / r["shaped_bps"]
              for r in rs]
    extra = [r["first_sync_s"] - r["sync_s_mean"] for r in rs]
    out[name] = {"runs": len(rs),
                 "achieved_share_median": statistics.median(shares),
                 "first_sync_extra_s_median": statistics.median(extra)}
  return out


def simulate_check(row: dict, latency_s: float = LATENCY_S) -> dict:
  """A real ``lowbw.simulate`` run timed as ``row``'s model (a tiny MLP
  with clock_params = the measured model's parameters): its simulated time
  against the formula this script uses."""
  import lowbw
  from lowbw import data, models, strategies
  H = row["H"]
  strategy = (strategies.ddp() if row["method"] == "ddp"
              else strategies.diloco(H=H))
  steps = 2 * H
  net = net_lib.network(row["shaped_bps"], latency_s, topology="ring",
                        hardware=f"{row['compute_s_per_step']!r}s",
                        clock_params=row["params"], profile="ideal")
  result = lowbw.simulate(model=models.mlp(hidden=(8,)), data=data.digits(),
                          strategy=strategy, workers=row["workers"],
                          batch_size=4, steps=steps, network=net,
                          progress=False)
  sync_s, step_s = clock_of(row, latency_s)
  formula = steps * step_s + steps // H * sync_s
  simulated = float(result.summary["sim_time_s"])
  return {"run_id": row["run_id"], "steps": steps, "H": H,
          "sim_time_s": simulated, "formula_s": formula,
          "rel_diff": simulated / formula - 1,
          "comm_s_per_event": result.config["network"]["comm_s_per_event"]}


def _line(name: str, s: dict) -> str:
  return (f"{name:<16}{s['runs']:>5}  {100 * s['sync']['median']:7.1f}"
          f"{100 * s['sync']['max']:7.1f}  {100 * s['cu']['median']:7.1f}"
          f"{100 * s['cu']['max']:7.1f}  {100 * s['cu_round']['median']:7.1f}"
          f"{100 * s['cu_round']['max']:7.1f}  {100 * s['too_fast']:5.0f}%")


def print_tables(t: dict) -> None:
  head = (f"{'':<16}{'runs':>5}  {'sync |err| %':>14}  {'CU |err| %':>14}  "
          f"{'CU/round %':>14}  too fast\n{'':<16}{'':>5}  {'median':>7}"
          f"{'max':>7}  {'median':>7}{'max':>7}  {'median':>7}{'max':>7}")
  print(head)
  for name, s in t["by_method"].items():
    print(_line(name, s))
  for name, s in t["by_method_shaped"].items():
    print(_line(name + " shaped", s))
  print()
  for name, s in sorted(t["by_method_and_link"].items()):
    print(_line(name, s))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", default=RUNS, help="the measured runs' CSV")
  parser.add_argument("--latency", type=float, default=LATENCY_S,
                      help="one-way latency per hop, seconds (default 0)")
  parser.add_argument("--simulate", action="store_true",
                      help="check one DDP and one DiLoCo row with a real "
                      "lowbw.simulate run")
  parser.add_argument("--json", help="write the tables and rows here")
  args = parser.parse_args(argv)
  if args.latency < 0:
    parser.error(f"--latency={args.latency} is invalid: seconds >= 0")
  rows = load_runs(args.runs)
  preds = [predict(r, args.latency) for r in rows]
  t = tables(preds)
  print_tables(t)
  findings = link_findings(rows)
  print(f"\n{'runs with the first sync in warm-up':<36}{'achieved/rate':>14}"
        f"{'first sync extra s':>20}")
  for name, f in findings.items():
    print(f"{name + ' (' + str(f['runs']) + ')':<36}"
          f"{f['achieved_share_median']:>14.3f}"
          f"{f['first_sync_extra_s_median']:>20.3f}")
  out = {"latency_s": args.latency, "source": os.path.relpath(args.runs),
         **t, "links": findings, "rows": preds}
  if args.simulate:
    picks = [next(r for r in rows if r["run_id"] == rid) for rid in (
        "cu_grid-ddp-30m-bw1g-r0", "cu_grid-diloco-30m-h8-bw1g-r0")]
    out["simulate_check"] = [simulate_check(r, args.latency) for r in picks]
    for c in out["simulate_check"]:
      print(f"\n{c['run_id']}: lowbw.simulate {c['sim_time_s']:.6f} s, "
            f"formula {c['formula_s']:.6f} s ({100 * c['rel_diff']:+.2e} %)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
