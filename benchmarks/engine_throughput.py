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
  python benchmarks/engine_throughput.py --workers 8 --steps 200 --repeats 3
"""

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import lowbw
from lowbw import data, models, strategies


def baseline_tokens_per_s(model, corpus, batch, seq_len, steps, repeats):
  """A plain single-replica loop: AdamW on batch ``batch`` (= W*b)."""
  tokens = jnp.asarray(corpus.train["tokens"])
  n_windows = (tokens.shape[0] - 1) // seq_len
  params = model.init(jax.random.PRNGKey(0), corpus.example_batch(batch))
  tx = optax.adamw(1e-3)

  def sample(key):
    starts = jax.random.randint(key, (batch,), 0, n_windows) * seq_len
    rows = jax.vmap(lambda s: jax.lax.dynamic_slice(tokens, (s,), (seq_len + 1,)))(starts)
    return {"tokens": rows.astype(jnp.int32)}

  def step(carry, key):
    params, opt_state = carry
    (loss, _), g = jax.value_and_grad(model.loss, has_aux=True)(
        params, sample(key), key)
    updates, opt_state = tx.update(g, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  @jax.jit
  def run(carry, key):
    return jax.lax.scan(step, carry, jax.random.split(key, steps))

  carry = (params, tx.init(params))
  jax.block_until_ready(run(carry, jax.random.PRNGKey(1)))  # compile + warm up
  times = []
  for r in range(repeats):
    start = time.perf_counter()
    carry, losses = run(carry, jax.random.PRNGKey(2 + r))
    jax.block_until_ready(losses)
    times.append(time.perf_counter() - start)
  return steps * batch * seq_len / statistics.median(times)


def simulator_tokens_per_s(model, corpus, workers, batch_size, steps, H,
                           repeats):
  rates = []
  for r in range(repeats + 1):  # the first run warms caches; not counted
    result = lowbw.simulate(
        model=model, data=corpus,
        strategy=strategies.diloco(optax.adamw(1e-3), H=H),
        num_workers=workers, batch_size=batch_size, steps=steps, seed=r,
        progress=False, eval_examples=64)
    if r:
      rates.append(result.summary["tokens_per_s"])
  return statistics.median(rates), result.summary


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--batch-size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--H", type=int, default=50)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default=None, help="also write figures here")
  args = parser.parse_args()

  model = models.gpt()
  corpus = data.text_bytes(seq_len=model.config["seq_len"])
  seq_len = corpus.seq_len
  sim, summary = simulator_tokens_per_s(model, corpus, args.workers,
                                        args.batch_size, args.steps, args.H,
                                        args.repeats)
  base = baseline_tokens_per_s(model, corpus, args.workers * args.batch_size,
                               seq_len, args.steps, args.repeats)
  figures = {
      "machine": f"{platform.processor() or platform.machine()}, "
                 f"{jax.device_count()} x {jax.devices()[0].device_kind}",
      "jax": jax.__version__,
      "model": model.config, "num_params": summary["num_params"],
      "workers": args.workers, "batch_size": args.batch_size,
      "steps": args.steps, "H": args.H,
      "simulator_tokens_per_s": sim, "baseline_tokens_per_s": base,
      "ratio": sim / base, "simulator_compile_s": summary["compile_s"],
  }
  print(f"simulator (DiLoCo, W={args.workers}, b={args.batch_size}, "
        f"H={args.H}): {sim:,.0f} tokens/s")
  print(f"baseline  (1 replica, batch {args.workers * args.batch_size}):"
        f"      {base:,.0f} tokens/s")
  print(f"ratio: {sim / base:.3f}  (target >= 0.9)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(figures, f, indent=2)


if __name__ == "__main__":
  main()
