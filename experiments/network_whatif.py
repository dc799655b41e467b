"""The seed-000 Table 1 story, measured: the same DDP and DiLoCo runs replayed
on a data-centre link, a metro link and an internet link.

EXO Gym's paper (EXO Gym paper, Table 1) motivates low-communication training with
a back-of-the-envelope table: two GPUs in a data centre nearly halve a
single-GPU run, the same two GPUs over the internet take 10x longer than one
GPU, and DiLoCo (H = 500) over the internet is as fast as the data centre.
Here the same question is asked of real runs: lowbw's default GPT (478,976
parameters) on the byte corpus of the Python standard library, W workers, DDP
and DiLoCo, each on three flat ring networks. The network does not change
the training (same seed, same bits, as tests/test_clock_runs.py checks), only
its simulated clock, so each strategy's loss curve is the same on every link
and moves along the time axis.

The six runs are one ``lowbw.study`` (under ``experiments/studies/``,
resumable) whose points differ in the strategy and the link: the study trains
each strategy once, on the first link, and re-times the other links from that
run's ledger (``lowbw.retime``), as docs/studies.md describes.

Compute: every worker is given the time one worker's step takes on this
machine (measured at the start, or ``--step-time``), so compute and
communication have the proportions of a small model on a slow device, as in
the paper's table, rather than the microseconds an H100 would take.

Usage:
  python experiments/network_whatif.py                # ~6 min on 2 CPU cores
  python experiments/network_whatif.py --report-only
  python experiments/network_whatif.py --steps 100 --out /tmp/net
"""

import argparse
import json
import os

import _report
import lowbw

CACHE = "network_results.json"
LINKS = {  # name: (bandwidth, one-way latency per message hop)
    "10 Gbit/s, 0.1 ms (data centre)": ("10Gbps", "0.1ms"),
    "1 Gbit/s, 5 ms (metro)": ("1Gbps", "5ms"),
    "100 Mbit/s, 50 ms (internet)": ("100Mbps", "50ms"),
}


def common(args) -> dict:
  """What every run shares (``lowbw.Config`` fields)."""
  return dict(data="text", model="gpt", batch_size=args.batch_size,
              eval_examples=args.eval_examples, progress=False)


def measure_step_time(args) -> tuple[float, float]:
  """Seconds per inner step of one worker on this machine (after compile),
  and the seconds the measurement took (compiling and running)."""
  result = lowbw.simulate(lowbw.Config(
      strategy="ddp", workers=1, steps=args.measure_steps, seed=args.seed,
      eval_every=args.measure_steps, **common(args)))
  s = result.summary
  return (s["wall_time_s"] / args.measure_steps,
          (s.get("compile_s") or 0.0) + s["wall_time_s"])


def points(args) -> dict:
  """Label -> the point's values: each strategy on each link."""
  strategies = {"DDP": {"strategy": "ddp"},
                f"DiLoCo H={args.H}": {"strategy": "diloco", "H": args.H}}
  return {f"{label} | {link}": {**values, "bandwidth": bw, "latency": lat}
          for label, values in strategies.items()
          for link, (bw, lat) in LINKS.items()}


def run_all(args, cache_path):
  """The step time (measured once and cached first, so that a killed
  script resumes its study at the same one), then the study: per label its
  run (``_report.point_entry``: with ``retimed``)."""
  results = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      results = json.load(f)
    if results.get("args") != _key(args):
      results = {}
  results["args"] = _key(args)
  if "step_time_s" not in results:
    if args.step_time:
      results["step_time_s"], results["measure_seconds"] = args.step_time, 0.0
    else:
      results["step_time_s"], results["measure_seconds"] = (
          measure_step_time(args))
    _report.save_results(cache_path, results)
  step_time = results["step_time_s"]
  base = {**common(args), "workers": args.workers, "steps": args.steps,
          "eval_every": args.eval_every, "hardware": f"{step_time}s"}
  labelled = points(args)
  grid = [{k: [v] for k, v in values.items()} for values in labelled.values()]
  name = "network_whatif/" + "_".join(
      f"{k}{v}" for k, v in {**_key(args), "step": step_time}.items())
  study, seconds = _report.timed_study(name, base, grid, [args.seed],
                                       _report.STUDIES)
  results["runs"] = {label: _report.point_entry(next(
      p for p in study.points if p.values == values))
      for label, values in labelled.items()}
  results["compute_seconds"] = seconds + results["measure_seconds"]
  return _report.save_results(cache_path, results)


def _key(args):
  return {k: getattr(args, k) for k in ("workers", "batch_size", "steps", "H",
                                        "seed", "eval_every", "step_time")}


def check_same_training(runs):
  """The link must not change the training: same losses on every link."""
  for label in {name.split(" | ")[0] for name in runs}:
    curves = [r["curve"]["eval_loss"] for name, r in runs.items()
              if name.split(" | ")[0] == label]
    assert all(c == curves[0] for c in curves), f"{label}: losses differ"


def rows(runs) -> list[dict]:
  """Each run as a table row: strategy, link, time, loss, bytes, curve."""
  out = []
  for name, r in runs.items():
    strategy, link = name.split(" | ")
    out.append({"strategy": strategy, "link": link,
                "sim_time_s": r["sim_time_s"],
                "eval_loss": r["final_eval_loss"],
                "wire_bytes": r["wire_bytes"], "retimed": r["retimed"],
                "curve": list(zip(r["curve"]["sim_time_s"],
                                  r["curve"]["eval_loss"]))})
  return out


def single_worker(runs, args, step_time):
  """One worker doing all W workers' examples: DDP with W workers of batch b
  equals one model with batch W*b (a tested equivalence), so its losses are
  DDP's; its compute is W times one worker's step, with no network."""
  ddp = next(r for name, r in runs.items() if name.startswith("DDP |"))
  per_step = args.workers * step_time
  return {"strategy": "1 worker, batch W*b", "link": "no network",
          "sim_time_s": args.steps * per_step,
          "eval_loss": ddp["final_eval_loss"], "wire_bytes": 0.0,
          "retimed": False,
          "curve": [(s * per_step, loss) for s, loss in zip(
              ddp["curve"]["step"], ddp["curve"]["eval_loss"])]}


def write_report(results, args, out):
  runs = results["runs"]
  check_same_training(runs)
  step_time = results["step_time_s"]
  single = single_worker(runs, args, step_time)
  table = [single] + rows(runs)
  retimed = sum(r["retimed"] for r in table)
  lines = [
      "# What the network costs: DDP and DiLoCo on three links", "",
      "Generated by `python experiments/network_whatif.py --workers "
      f"{args.workers} --steps {args.steps} --H {args.H}` (seed {args.seed}). "
      f"The default GPT (478,976 parameters), {args.workers} workers of batch "
      f"{args.batch_size} x 128 tokens, {args.steps} inner steps, flat ring "
      "all-reduce, fp32 messages. Every worker's step takes "
      f"{step_time * 1e3:.1f} ms, the time one worker's step took on this "
      "machine (2-core CPU), so compute and communication have the "
      "proportions of a small model on a slow device. Simulated time is "
      "the clock's, with its default calibrated network profile "
      "([calibration.md](../calibration.md): what real links and "
      "collectives cost beyond latency + bytes / bandwidth). The network "
      "does not change the training, so each strategy has the same losses "
      f"on every link: the study trained each strategy once and re-timed "
      f"the other {retimed} runs from its ledger "
      f"({results['compute_seconds'] / 60:.1f} min of compute, the step "
      "time's measurement included).", "",
      "| strategy | link | simulated time | vs 1 worker | final eval loss "
      "| sent per worker | trained or re-timed |",
      "| --- | --- | --- | --- | --- | --- | --- |"]
  for r in table:
    how = ("derived" if r["link"] == "no network" else
           "re-timed" if r["retimed"] else "trained")
    lines.append(
        f"| {r['strategy']} | {r['link']} | {_hms(r['sim_time_s'])} | "
        f"{r['sim_time_s'] / single['sim_time_s']:.2f}x | "
        f"{r['eval_loss']:.4f} | {r['wire_bytes'] / 1e6:,.1f} MB | {how} |")
  lines += ["", "![eval loss vs simulated hours](network.png)", "",
            "The 1-worker row is derived, not run: DDP with W workers of "
            "batch b equals one model with batch W*b (tests/test_simulate.py), "
            "so it has DDP's losses at W times one worker's compute per step.",
            ""]
  _report.write_report(os.path.join(out, "network.md"), "\n".join(lines))
  plot(table, os.path.join(out, "network.png"))


def _hms(seconds):
  if seconds >= 3600:
    return f"{seconds / 3600:.2f} h"
  if seconds >= 60:
    return f"{seconds / 60:.1f} min"
  return f"{seconds:.1f} s"


def plot(table, path):
  colors = {"no network": "black", **dict(zip(
      LINKS, ("tab:green", "tab:blue", "tab:red")))}
  fig, ax = _report.axes(figsize=(7.5, 4.5))
  for r in table:
    style = "--" if r["strategy"] == "DDP" else (
        ":" if r["link"] == "no network" else "-")
    t, loss = zip(*r["curve"])
    ax.plot([x / 3600 for x in t], loss, style, color=colors[r["link"]],
            marker="o", markersize=3,
            label=f"{r['strategy']}, {r['link'].split(' (')[0]}")
  _report.save_plot(fig, ax, path, "simulated hours (compute + communication)",
                    "eval loss", legend_size=7)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--batch-size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--H", type=int, default=50)
  parser.add_argument("--eval-every", type=int, default=50)
  parser.add_argument("--eval-examples", type=int, default=128)
  parser.add_argument("--step-time", type=float, default=None,
                      help="seconds per worker step (default: measured)")
  parser.add_argument("--measure-steps", type=int, default=50)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=_report.DOCS)
  parser.add_argument("--report-only", action="store_true",
                      help="rebuild the report from the cached runs")
  args = parser.parse_args()
  results = _report.results_for(args, CACHE, run_all)
  write_report(results, args, args.out)


if __name__ == "__main__":
  main()
