"""DDP, DiLoCo and SPARTA on digits: eval loss against bytes and simulated time.

  python examples/compare_strategies.py --out comparison.png

Same model, data, seed and inner steps for each; the papers' optimizers
(inner AdamW lr 4e-4; DiLoCo's outer Nesterov SGD lr 0.7), a small H.
"""

import argparse

import lowbw
from lowbw import data, models, network, strategies

STEPS, WORKERS, H, P = 400, 4, 50, 0.005
NETWORK = network.network("100Mbps", "50ms")  # each worker's link; H100 compute


def compare(runs=None, steps=STEPS, workers=WORKERS, seed=0):
  """Runs each strategy of {name: strategy}; returns {name: lowbw.Result}."""
  runs = runs or {"DDP": strategies.ddp(),             # gradients, every step
                  "DiLoCo": strategies.diloco(H=H),    # pseudo-gradients, every H
                  "SPARTA": strategies.sparta(p=P)}    # a fraction p, every step
  return {name: lowbw.simulate(
      model=models.mlp(hidden=(64,), num_classes=10), data=data.digits(),
      strategy=strategy, workers=workers, batch_size=32, steps=steps,
      eval_every=H, seed=seed, network=NETWORK, progress=False)
          for name, strategy in runs.items()}


def plot(results):
  """One figure: eval loss against bytes sent per worker and simulated time."""
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for name, result in results.items():
    evals = result.evals()
    for ax, x in zip(axes, ["wire_bytes", "sim_time_s"]):
      ax.plot(evals[x], evals["eval_loss"], marker="o", label=name)
  axes[0].set(xscale="log", xlabel="bytes sent per worker", ylabel="eval loss")
  axes[1].set(xscale="log", xlabel="simulated time (s) on 100 Mbit/s, 50 ms")
  axes[0].legend()
  fig.tight_layout()
  return fig


def table(results):
  """Each run's final eval loss, bytes sent per worker and simulated time."""
  rows = [f"{'strategy':<8} {'eval loss':>9} {'bytes/worker':>12} {'sim time (s)':>12}"]
  for name, result in results.items():
    s = result.summary
    rows.append(f"{name:<8} {s['final_eval_loss']:>9.4f} {s['wire_bytes']:>12,.0f}"
                f" {s['sim_time_s']:>12.2f}")
  return "\n".join(rows)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="comparison.png", help="the figure (PNG)")
  args = parser.parse_args()
  import matplotlib
  matplotlib.use("Agg")  # a file, no window
  results = compare()
  print(table(results))
  plot(results).savefig(args.out, dpi=120)
  print(f"figure: {args.out}")
