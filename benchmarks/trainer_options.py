"""What the trainer options (worker_dtype, worker_batch, minibatch_size,
autocast) cost in speed and memory, with
``lowbw.bench.measure``: every configuration is timed against its own
one-replica float32 baseline in the same process, interleaved (efficiency =
baseline time / simulator time, the median of ``repeats`` ratios), so rows
compare through their efficiencies even when the machine's speed drifts.

Rows: DiLoCo as is; with per-worker clipping (max_norm 1); with the workers'
correlation every round; in micro-batches; under bf16 autocast; MuLoCo with
its payloads all-gathered and reduce-scattered; DeMo summing and averaging
over senders; SPARTA every step and every 10 steps.

Usage:
  python benchmarks/trainer_options.py                  # the default GPT, W = 8
  python benchmarks/trainer_options.py --json docs/benchmarks/trainer_options_cpu.json
"""

import argparse
import json
import platform

import jax

from lowbw import bench, data, models, strategies

H = 10


def configurations():
  inner = strategies.inner_optimizer("adamw", 4e-4, weight_decay=0.1)
  clipped = strategies.inner_optimizer("adamw", 4e-4, weight_decay=0.1,
                                       max_norm=1.0)
  diloco = strategies.diloco(inner, H=H)
  return [
      ("diloco", diloco, inner, {}),
      ("diloco, max_norm 1", strategies.diloco(clipped, H=H), clipped, {}),
      ("diloco, correlation every round", diloco, inner,
       {"correlation_every": H}),
      ("diloco, minibatch_size 2 (4 micro-batches)", diloco, inner,
       {"minibatch_size": 2}),
      ("diloco, autocast bfloat16", diloco, inner, {"autocast": "bfloat16"}),
      ("muloco (2-bit, all-gather)", strategies.muloco(H=H),
       strategies.muon_inner(), {}),
      ("muloco, aggregation reduce_scatter",
       strategies.muloco(H=H, aggregation="reduce_scatter"),
       strategies.muon_inner(), {}),
      ("demo (sum)", strategies.demo(),
       strategies.inner_optimizer("sgd", 4e-4), {}),
      ("demo, combine mean", strategies.demo(combine="mean"),
       strategies.inner_optimizer("sgd", 4e-4), {}),
      ("sparta p 0.005", strategies.sparta(inner), inner, {}),
      ("sparta, sparta_interval 10", strategies.sparta(inner,
                                                       sparta_interval=10),
       inner, {}),
  ]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workers", type=int, default=8)
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--json", help="write the figures here")
  args = p.parse_args()
  model, source = models.gpt(), data.text_bytes(seq_len=128)
  rows = []
  for name, strategy, inner, extra in configurations():
    rounds = 1 if strategy.period > 1 else H
    r = bench.measure(model, source, strategy, inner, args.workers,
                      args.batch_size,
                      bench.Timing(rounds=rounds, repeats=args.repeats),
                      worker_batch="all", **extra)
    rows.append({"name": name, **r})
    print(f"{name:45s} {r['tokens_per_s']:9,.0f} tok/s  efficiency "
          f"{r['efficiency']:.3f} ({min(r['efficiencies']):.3f}-"
          f"{max(r['efficiencies']):.3f})  temp "
          f"{(r['xla_temp_bytes'] or 0) / 1e6:7.1f} MB  wire/round "
          f"{r['wire_bytes_per_round'] / 1e6:.3f} MB", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"machine": platform.processor() or platform.machine(),
                 "backend": jax.default_backend(),
                 "jax": jax.__version__, "rows": rows}, f, indent=2,
                default=str)


if __name__ == "__main__":
  main()
