"""Tokens/s of ``lowbw.simulate`` (DiLoCo, W workers) vs a single-replica loop.

Both train the same GPT on the same stdlib byte corpus, in one process, on the
same machine. The baseline is the machine's best case for the same FLOPs: one
model, batch W*b, a plain jitted optax AdamW step scanned over many steps per
call (no per-step dispatch), data sampled inside jit. The simulator does
everything a real run does: per-worker sampling without replacement, W inner
optimizer states, DiLoCo's outer step every H, loss and byte bookkeeping, eval
at the end. Compilation is excluded from both.

Usage:
  python benchmarks/engine_throughput.py            # defaults below
  python benchmarks/engine_throughput.py --workers 8 --steps 200 --repeats 5
"""

import os

# Throughput and compile time of XLA's optimised programs (lowbw's default
# compile_effort would compile a small CPU run with XLA's quickest settings).
os.environ.setdefault("LOWBW_COMPILE_EFFORT", "full")

import argparse
import json
import platform
import statistics

import jax
import optax

import lowbw
from lowbw import bench, data, models, network, strategies, transforms

# --network: what the run carries besides training. "clock": a simulated clock
# only (no masks). "faults": the clock plus stragglers (jitter, threshold) and
# faults (dropouts, lost messages), whose masks are compiled into the round.
NETWORKS = {
    "none": None,
    "clock": network.network("100Mbps", "100ms"),
    "faults": network.network(
        "100Mbps", "100ms",
        stragglers=network.Stragglers(jitter=0.3, mitigation="threshold",
                                      fraction=0.75),
        faults=network.Faults(drop_prob=0.1, message_loss=0.05)),
}


def make_baseline(model, corpus, batch, seq_len, steps):
  """A plain single-replica loop: AdamW on batch ``batch`` (= W*b), the same
  one ``lowbw bench`` uses. Returns a function that runs ``steps`` steps and
  returns their tokens/s."""
  run = bench.baseline(model, corpus.build(1, 1, 0), optax.adamw(1e-3), batch,
                       steps, seed=1)
  return lambda: steps * batch * seq_len / run()


def simulator_run(model, corpus, workers, batch_size, steps, H, seed,
                  codec=None, ef=None, net="none"):
  """One ``lowbw.simulate`` run; its tokens/s exclude compilation."""
  codec = None if codec is None else transforms.parse_codec(codec)
  result = lowbw.simulate(
      model=model, data=corpus,
      strategy=strategies.diloco(optax.adamw(1e-3), H=H, codec=codec,
                                 error_feedback=ef),
      workers=workers, batch_size=batch_size, steps=steps, seed=seed,
      network=NETWORKS[net], progress=False, eval_examples=64)
  return result.summary


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--batch-size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--H", type=int, default=50)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--codec", default=None,
                      help="codec spec of the pseudo-gradients, e.g. quant:2")
  parser.add_argument("--ef", type=float, default=None,
                      help="error-feedback beta (with --codec)")
  parser.add_argument("--network", default="none", choices=sorted(NETWORKS),
                      help="none | clock (simulated clock only) | faults "
                      "(clock + straggler and fault masks)")
  parser.add_argument("--json", default=None, help="also write figures here")
  args = parser.parse_args()

  model = models.gpt()
  corpus = data.text_bytes(seq_len=model.config["seq_len"])
  seq_len = corpus.seq_len
  baseline = make_baseline(model, corpus, args.workers * args.batch_size,
                           seq_len, args.steps)
  # Warm-up of both, then alternate them so that load on a shared machine
  # affects both alike; the figure is the median of the per-pair ratios.
  simulator_run(model, corpus, args.workers, args.batch_size, args.steps,
                args.H, seed=0, codec=args.codec, ef=args.ef, net=args.network)
  baseline()
  sims, bases = [], []
  for r in range(args.repeats):
    summary = simulator_run(model, corpus, args.workers, args.batch_size,
                            args.steps, args.H, seed=1 + r, codec=args.codec,
                            ef=args.ef, net=args.network)
    sims.append(summary["tokens_per_s"])
    bases.append(baseline())
  ratios = [s_ / b_ for s_, b_ in zip(sims, bases)]
  sim, base = statistics.median(sims), statistics.median(bases)
  ratio = statistics.median(ratios)
  figures = {
      "machine": f"{platform.processor() or platform.machine()}, "
                 f"{jax.device_count()} x {jax.devices()[0].device_kind}",
      "jax": jax.__version__,
      "model": model.config, "num_params": summary["num_params"],
      "workers": args.workers, "batch_size": args.batch_size,
      "steps": args.steps, "H": args.H, "codec": args.codec, "ef": args.ef,
      "network": args.network,
      "simulator_tokens_per_s": sim, "baseline_tokens_per_s": base,
      "ratio": ratio, "ratios": ratios,
      "simulator_compile_s": summary["compile_s"],
  }
  print(f"simulator (DiLoCo, W={args.workers}, b={args.batch_size}, "
        f"H={args.H}, codec={args.codec}, ef={args.ef}, "
        f"network={args.network}): {sim:,.0f} tokens/s")
  print(f"baseline  (1 replica, batch {args.workers * args.batch_size}):"
        f"      {base:,.0f} tokens/s")
  print(f"ratio: {ratio:.3f}  (median of {len(ratios)} interleaved pairs: "
        f"{', '.join(f'{r:.3f}' for r in ratios)}; target >= 0.9)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(figures, f, indent=2)


if __name__ == "__main__":
  main()
