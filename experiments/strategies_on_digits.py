"""Loss against bytes for every strategy, at small scale, on the embedded digits.

The question of the DiLoCo and SPARTA papers, asked on a laptop: at the same
number of inner steps, how close does each low-communication strategy get to
data-parallel training, and for how many bytes? An MLP on scikit-learn's 8x8
digits, 8 workers, IID shards, mean and spread over seeds. Writes a Markdown
table and a plot to docs/experiments/.

Usage:
  python experiments/strategies_on_digits.py            # about 2 minutes on 2 CPU cores
  python experiments/strategies_on_digits.py --seeds 1 --steps 200
"""

import argparse
import os

import numpy as np
import optax

import lowbw
from lowbw import data, models, strategies

OUT = os.path.join(os.path.dirname(__file__), "..", "docs", "experiments")


def configurations():
  inner = lambda: optax.adamw(1e-3)  # noqa: E731  (a fresh transform per run)
  outer = lambda: optax.sgd(0.7, momentum=0.9, nesterov=True)  # noqa: E731
  return {
      "DDP": lambda: strategies.ddp(inner()),
      "FedAvg H=20": lambda: strategies.fedavg(inner(), H=20),
      "DiLoCo H=20": lambda: strategies.diloco(inner(), outer(), H=20),
      "DiLoCo H=100": lambda: strategies.diloco(inner(), outer(), H=100),
      "SPARTA p=0.005": lambda: strategies.sparta(inner(), p=0.005),
      "SPARTA p=0.05": lambda: strategies.sparta(inner(), p=0.05),
      "SPARTA-DiLoCo H=100 p=0.005": lambda: strategies.sparta_diloco(
          inner(), outer(), H=100, p=0.005),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--batch-size", type=int, default=16)
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--seeds", type=int, default=3)
  args = parser.parse_args()

  results = {}
  for name, make in configurations().items():
    runs = [lowbw.simulate(
        model=models.mlp(hidden=(64,), num_classes=10), data=data.digits(),
        strategy=make(), workers=args.workers, batch_size=args.batch_size,
        steps=args.steps, seed=seed, progress=False) for seed in range(args.seeds)]
    summary = runs[0].summary
    results[name] = {
        "loss": [r.summary["final_eval_loss"] for r in runs],
        "acc": [r.summary["final_eval_accuracy"] for r in runs],
        "payload": summary["payload_bytes"], "wire": summary["wire_bytes"],
    }
    print(f"{name:30s} eval loss {np.mean(results[name]['loss']):.4f}  "
          f"payload {summary['payload_bytes']:,} B")
  write_report(results, args)


def write_report(results, args):
  os.makedirs(OUT, exist_ok=True)
  ddp = results["DDP"]["payload"]
  lines = [
      "# Strategies on digits: loss against bytes",
      "",
      f"MLP (64 hidden units, 4,810 parameters) on scikit-learn's digits; "
      f"{args.workers} workers, batch {args.batch_size} per worker, "
      f"{args.steps} inner steps, IID shards, inner AdamW lr 1e-3, DiLoCo outer "
      f"SGD lr 0.7 Nesterov 0.9; mean ± std over {args.seeds} seeds. Bytes are "
      "per worker, exact (float32 values; ring all-reduce for the wire).",
      "",
      "Reproduce: `python experiments/strategies_on_digits.py"
      + (f" --steps {args.steps}" if args.steps != 600 else "")
      + (f" --seeds {args.seeds}" if args.seeds != 3 else "") + "`",
      "",
      "| strategy | eval loss | eval accuracy | payload bytes | wire bytes | bytes vs DDP |",
      "| --- | --- | --- | --- | --- | --- |",
  ]
  for name, r in results.items():
    lines.append(
        f"| {name} | {np.mean(r['loss']):.4f} ± {np.std(r['loss']):.4f} | "
        f"{np.mean(r['acc']):.3f} | {r['payload']:,} | {r['wire']:,.0f} | "
        f"{r['payload'] / ddp:.4f} |")
  lines += ["", "![eval loss against payload bytes](strategies.png)", ""]
  with open(os.path.join(OUT, "strategies.md"), "w") as f:
    f.write("\n".join(lines))
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, r in results.items():
    ax.errorbar(r["payload"], np.mean(r["loss"]), yerr=np.std(r["loss"]),
                fmt="o", capsize=3, label=name)
  ax.set_xscale("log")
  ax.set_xlabel("payload bytes per worker (log scale)")
  ax.set_ylabel(f"eval loss after {args.steps} steps")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(OUT, "strategies.png"), dpi=120)


if __name__ == "__main__":
  main()
