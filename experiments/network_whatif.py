"""The seed-000 Table 1 story, measured: the same DDP and DiLoCo runs replayed
on a data-centre link, a metro link and an internet link.

EXO Gym's paper (EXO Gym paper, Table 1) motivates low-communication training with
a back-of-the-envelope table: two GPUs in a data centre nearly halve a
single-GPU run, the same two GPUs over the internet take 10x longer than one
GPU, and DiLoCo (H = 500) over the internet is as fast as the data centre.
Here the same question is asked of real runs: lowbw's default GPT (478,976
parameters) on the byte corpus of the Python standard library, W workers, DDP
and DiLoCo, each run on three flat ring networks. The network does not change
the training (same seed, same bits, as tests/test_clock_runs.py checks), only
its simulated clock, so each strategy's loss curve is the same on every link
and moves along the time axis.

Compute: every worker is given the time one worker's step takes on this
machine (measured at the start, or ``--step-time``), so compute and
communication have the proportions of a small model on a slow device, as in
the paper's table, rather than the microseconds an H100 would take.

Usage:
  python experiments/network_whatif.py                # ~10 min on 2 CPU cores
  python experiments/network_whatif.py --steps 100 --out /tmp/net
"""

import argparse
import json
import os

import _report
import lowbw
from lowbw import data, models, network, strategies

OUT = os.path.join(os.path.dirname(__file__), "..", "docs", "experiments")
LINKS = {  # name: (bandwidth, one-way latency per message hop)
    "10 Gbit/s, 0.1 ms (data centre)": ("10Gbps", "0.1ms"),
    "1 Gbit/s, 5 ms (metro)": ("1Gbps", "5ms"),
    "100 Mbit/s, 50 ms (internet)": ("100Mbps", "50ms"),
}


def common(args):
  return dict(model=models.gpt(), data=data.text_bytes(),
              batch_size=args.batch_size, eval_examples=args.eval_examples)


def measure_step_time(args) -> float:
  """Seconds per inner step of one worker on this machine (after compile)."""
  result = lowbw.simulate(strategy=strategies.ddp(), workers=1,
                          steps=args.measure_steps, seed=args.seed,
                          progress=False, eval_every=args.measure_steps,
                          **common(args))
  return result.summary["wall_time_s"] / args.measure_steps


def run_all(args, cache_path):
  results = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      results = json.load(f)
    if results.get("args") != _key(args):
      results = {}
  results["args"] = _key(args)
  if "step_time_s" not in results:
    results["step_time_s"] = args.step_time or measure_step_time(args)
  step_time = results["step_time_s"]
  runs = results.setdefault("runs", {})
  for label, make in (("DDP", strategies.ddp),
                      (f"DiLoCo H={args.H}",
                       lambda: strategies.diloco(H=args.H))):
    todo = [link for link in LINKS if f"{label} | {link}" not in runs]
    if not todo:
      continue
    # One build per strategy: the links are traced values of its network, so
    # the three runs share one compilation.
    first = LINKS[todo[0]]
    sim = lowbw.build(strategy=make(), workers=args.workers,
                      steps=args.steps, eval_every=args.eval_every,
                      network=network.network(*first,
                                              hardware=f"{step_time}s"),
                      **common(args))
    for link in todo:
      bw, lat = LINKS[link]
      name = f"{label} | {link}"
      r = sim.run(seed=args.seed, hparams={"bandwidth": bw, "latency": lat},
                  progress=False)
      h = r.history
      evals = [(float(t), float(l)) for t, l in
               zip(h["sim_time_s"], h["eval_loss"]) if l == l]
      runs[name] = {"strategy": label, "link": link,
                    "sim_time_s": r.summary["sim_time_s"],
                    "eval_loss": r.summary["final_eval_loss"],
                    "wire_bytes": r.summary["wire_bytes"],
                    "curve": evals}
      print(f"{name}: {r.summary['sim_time_s'] / 3600:.4f} h, eval loss "
            f"{r.summary['final_eval_loss']:.4f}", flush=True)
      with open(cache_path, "w") as f:
        json.dump(results, f, indent=1)
  return results


def _key(args):
  return {k: getattr(args, k) for k in ("workers", "batch_size", "steps", "H",
                                        "seed", "eval_every", "step_time")}


def check_same_training(runs):
  """The link must not change the training: same losses on every link."""
  for label in {r["strategy"] for r in runs.values()}:
    curves = [[l for _, l in r["curve"]] for r in runs.values()
              if r["strategy"] == label]
    assert all(c == curves[0] for c in curves), f"{label}: losses differ"


def single_worker(runs, args, step_time):
  """One worker doing all W workers' examples: DDP with W workers of batch b
  equals one model with batch W*b (a tested equivalence), so its losses are
  DDP's; its compute is W times one worker's step, with no network."""
  ddp = next(r for r in runs.values() if r["strategy"] == "DDP")
  per_step = args.workers * step_time
  steps = [args.eval_every * (i + 1) for i in range(len(ddp["curve"]))]
  steps[-1] = args.steps
  return {"strategy": "1 worker, batch W*b", "link": "no network",
          "sim_time_s": args.steps * per_step, "eval_loss": ddp["eval_loss"],
          "wire_bytes": 0.0,
          "curve": [(s * per_step, l) for s, (_, l) in zip(steps, ddp["curve"])]}


def write_report(results, args, out):
  runs = results["runs"]
  check_same_training(runs)
  step_time = results["step_time_s"]
  single = single_worker(runs, args, step_time)
  rows = [single] + list(runs.values())
  lines = [
      "# What the network costs: DDP and DiLoCo on three links", "",
      "Generated by `python experiments/network_whatif.py --workers "
      f"{args.workers} --steps {args.steps} --H {args.H}` (seed {args.seed}). "
      f"The default GPT (478,976 parameters), {args.workers} workers of batch "
      f"{args.batch_size} x 128 tokens, {args.steps} inner steps, flat ring "
      "all-reduce, fp32 messages. Every worker's step takes "
      f"{step_time * 1e3:.1f} ms, the time one worker's step takes on this "
      "machine (2-core CPU), so compute and communication have the "
      "proportions of a small model on a slow device. Simulated time is "
      "compute plus communication; the network does not change the training, "
      "so each strategy has the same losses on every link.", "",
      "| strategy | link | simulated time | vs 1 worker | final eval loss "
      "| sent per worker |", "| --- | --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(
        f"| {r['strategy']} | {r['link']} | {_hms(r['sim_time_s'])} | "
        f"{r['sim_time_s'] / single['sim_time_s']:.2f}x | "
        f"{r['eval_loss']:.4f} | {r['wire_bytes'] / 1e6:,.1f} MB |")
  lines += ["", "![eval loss vs simulated hours](network.png)", "",
            "The 1-worker row is derived, not run: DDP with W workers of "
            "batch b equals one model with batch W*b (tests/test_simulate.py), "
            "so it has DDP's losses at W times one worker's compute per step.",
            ""]
  _report.write_report(os.path.join(out, "network.md"), "\n".join(lines))
  plot(rows, os.path.join(out, "network.png"))


def _hms(seconds):
  if seconds >= 3600:
    return f"{seconds / 3600:.2f} h"
  if seconds >= 60:
    return f"{seconds / 60:.1f} min"
  return f"{seconds:.1f} s"


def plot(rows, path):
  colors = {"no network": "black", **dict(zip(
      LINKS, ("tab:green", "tab:blue", "tab:red")))}
  fig, ax = _report.axes(figsize=(7.5, 4.5))
  for r in rows:
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
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  results = run_all(args, os.path.join(args.out, "network_results.json"))
  write_report(results, args, args.out)


if __name__ == "__main__":
  main()
