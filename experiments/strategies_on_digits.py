"""Loss against bytes for every strategy, at small scale, on the embedded digits.

The question of the DiLoCo and SPARTA papers, asked on a laptop: at the same
number of inner steps, how close does each low-communication strategy get to
data-parallel training, and for how many bytes? An MLP on scikit-learn's 8x8
digits, 8 workers, IID shards, mean and spread over seeds. Every strategy is
a point of one ``lowbw.study`` (an irregular grid over the strategy and its
parameters) under ``experiments/studies/strategies_on_digits/``: a killed
script started again skips the points that finished. Writes a Markdown table
and a plot to docs/experiments/, and the runs to strategies_results.json.

Usage:
  python experiments/strategies_on_digits.py            # about 2 minutes on 2 CPU cores
  python experiments/strategies_on_digits.py --report-only
  python experiments/strategies_on_digits.py --seeds 0 --steps 200 --out /tmp/s
"""

import os

import numpy as np

import _report

CACHE = "strategies_results.json"
COMMAND = "python experiments/strategies_on_digits.py"
DEFAULTS = {"workers": 8, "batch_size": 16, "steps": 600, "seeds": [0, 1, 2]}
POINTS = {  # label -> the strategy and its parameters
    "DDP": {"strategy": "ddp"},
    "FedAvg H=20": {"strategy": "fedavg", "H": 20},
    "DiLoCo H=20": {"strategy": "diloco", "H": 20},
    "DiLoCo H=100": {"strategy": "diloco", "H": 100},
    "SPARTA p=0.005": {"strategy": "sparta", "p": 0.005},
    "SPARTA p=0.05": {"strategy": "sparta", "p": 0.05},
    "SPARTA-DiLoCo H=100 p=0.005": {"strategy": "sparta_diloco", "H": 100,
                                    "p": 0.005},
}


def base(settings: dict) -> dict:
  """What every point shares (``lowbw.Config`` fields): the MLP on the
  digits, AdamW at 1e-3 (optax's default weight decay, 1e-4) and, where a
  strategy has one, DiLoCo's outer SGD (0.7, Nesterov 0.9)."""
  return {"data": "digits", "model": "mlp", "hidden": "64",
          "workers": settings["workers"],
          "batch_size": settings["batch_size"], "steps": settings["steps"],
          "inner": "adamw", "inner_lr": 1e-3, "weight_decay": 1e-4,
          "outer_lr": 0.7, "outer_momentum": 0.9, "progress": False}


def run_all(args, cache_path: str) -> dict:
  """Every strategy at every seed through one ``lowbw.study``; the runs and
  the compute they took, saved to ``cache_path``."""
  settings = {k: getattr(args, k) for k in DEFAULTS}
  name = "strategies_on_digits/" + "_".join(
      f"{k}{'-'.join(map(str, v)) if isinstance(v, list) else v}"
      for k, v in settings.items())
  runs, seconds = _report.labelled_study(name, base(settings), POINTS,
                                         args.seeds)
  return _report.save_results(cache_path, {
      "settings": settings, "runs": runs, "compute_seconds": seconds})


def reproduce(settings: dict) -> str:
  """The command that makes these runs (the defaults left out)."""
  flags = "".join(
      f" --{k.replace('_', '-')} "
      + (",".join(map(str, v)) if isinstance(v, list) else str(v))
      for k, v in settings.items() if v != DEFAULTS[k])
  return COMMAND + flags


def report(results: dict) -> str:
  s, runs = results["settings"], results["runs"]
  ddp = runs["DDP"][0]["payload_bytes"]
  lines = [
      "# Strategies on digits: loss against bytes",
      "",
      f"MLP (64 hidden units, {runs['DDP'][0]['num_params']:,} parameters) "
      f"on scikit-learn's digits; {s['workers']} workers, batch "
      f"{s['batch_size']} per worker, {s['steps']} inner steps, IID shards, "
      "inner AdamW lr 1e-3 (weight decay 1e-4), DiLoCo outer SGD lr 0.7 "
      f"Nesterov 0.9; mean ± std over {len(s['seeds'])} seeds "
      f"({results['compute_seconds'] / 60:.1f} min of compute on a 2-core "
      "CPU). Bytes are per worker, exact (float32 values; ring all-reduce "
      "for the wire).",
      "",
      f"Reproduce: `{reproduce(s)}`",
      "",
      "| strategy | eval loss | eval accuracy | payload bytes | wire bytes "
      "| bytes vs DDP |",
      "| --- | --- | --- | --- | --- | --- |",
  ]
  for name, r in runs.items():
    acc = _report.mean_std(_report.losses(r, "final_eval_accuracy"))[0]
    lines.append(
        f"| {name} | {_report.pm(_report.losses(r))} | {acc:.3f} | "
        f"{r[0]['payload_bytes']:,.0f} | {r[0]['wire_bytes']:,.0f} | "
        f"{r[0]['payload_bytes'] / ddp:.4f} |")
  return "\n".join(lines + [
      "", "![eval loss against payload bytes](strategies.png)", ""])


def plot(results: dict, path: str) -> None:
  fig, ax = _report.axes(figsize=(6, 4))
  for name, r in results["runs"].items():
    mean, std = _report.mean_std(_report.losses(r))
    ax.errorbar(r[0]["payload_bytes"], mean, yerr=std, fmt="o", capsize=3,
                label=name)
  _report.save_plot(fig, ax, path, "payload bytes per worker (log scale)",
                    f"eval loss after {results['settings']['steps']} steps",
                    legend_size=7)


def main():
  parser = _report.parser(__doc__)
  parser.add_argument("--workers", type=int, default=DEFAULTS["workers"])
  parser.add_argument("--batch-size", type=int,
                      default=DEFAULTS["batch_size"])
  parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
  args = parser.parse_args()
  results = _report.results_for(args, CACHE, run_all)
  _report.write_report(os.path.join(args.out, "strategies.md"),
                       report(results))
  plot(results, os.path.join(args.out, "strategies.png"))
  for name, r in results["runs"].items():
    print(f"{name:30s} eval loss "
          f"{np.mean(_report.losses(r)):.4f}  payload "
          f"{r[0]['payload_bytes']:,.0f} B")


if __name__ == "__main__":
  main()
