"""lowbw against the hand-written minimal vmap+scan loop of the same method.

For DDP and DiLoCo, in one process and interleaved (each repeat times every
contender once; figures are medians of per-repeat ratios):

- ``lowbw``: the compiled chunk of a real ``lowbw`` run (``Simulator``:
  per-worker sampling without replacement, loss, metrics and byte counts,
  the strategy's sync), as ``lowbw bench`` times it;
- ``minimal``: the shortest loop that simulates the same method, written
  here by hand: ``jax.vmap`` over workers of value_and_grad + the optax
  update, ``lax.scan`` over steps, data drawn uniformly inside jit, the
  worker mean as a contraction with a ones vector (the fastest form on CPU,
  benchmarks/reductions.py). DDP: one parameter copy, the mean of the W
  workers' gradients; DiLoCo: W copies, H inner steps, then the outer
  Nesterov step on the mean;
- ``replica``: ONE model at batch W*b (``lowbw.bench.baseline``), the same
  FLOPs without any per-worker structure: the machine's limit;
- DDP also ``lowbw per-worker``: lowbw's DDP forced onto the per-worker path
  (W copies and W gradients, as it runs with a codec or masks);
- DiLoCo also ``adamw x W`` and ``adamw x 1``: AdamW updates alone on W
  stacked copies of the parameters and on one, for the bound in the last
  column (``bound``).

lowbw runs as a user's run does: with ``devices`` left to lowbw, so on a CPU
its DiLoCo spreads the workers over one device per core; the minimal loop
and the replica run on JAX's default device.

Every contender uses AdamW (lr 1e-3) as its (inner) optimizer; DiLoCo's outer
step is SGD 0.7 with Nesterov momentum 0.9, H = 10. Compilation is excluded.

Usage:
  python benchmarks/limit.py                        # MLP W=8,64,256; CNN W=8,64; GPT W=8,32
  python benchmarks/limit.py --workload mlp --strategy ddp --repeats 7
  python benchmarks/limit.py --json docs/benchmarks/limit_cpu.json
"""

import os

# Throughput and compile time of XLA's optimised programs (lowbw's default
# compile_effort would compile a small CPU run with XLA's quickest settings).
os.environ.setdefault("LOWBW_COMPILE_EFFORT", "full")

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lowbw import bench, data, models, strategies
from lowbw.simulation import build

def tiled_digits(examples: int):
  """The digits images repeated to at least ``examples`` training examples,
  so that W workers of batch b each have a shard of b (sampling without
  replacement needs it); the arrays' content does not change the cost."""
  source = data.digits()
  x, y = np.asarray(source.train["x"]), np.asarray(source.train["y"])
  reps = -(-examples // len(y))
  return data.arrays(np.tile(x, (reps, 1, 1, 1)), np.tile(y, reps),
                     eval=(np.asarray(source.eval["x"]),
                           np.asarray(source.eval["y"])))


WORKLOADS = {
    # The digits MLP 64-256-256-10 (85,002 parameters), b = 32.
    "mlp": dict(model=lambda: models.mlp(hidden=(256, 256), num_classes=10),
                data=lambda w, b: tiled_digits(w * b), batch_size=32,
                workers=(8, 64, 256), steps=40),
    # The digits CNN (3x3 convs of 16 and 32 channels, dense 64; 13,706
    # parameters), b = 32.
    "cnn": dict(model=lambda: models.cnn(),
                data=lambda w, b: tiled_digits(w * b), batch_size=32,
                workers=(8, 64), steps=40),
    # The default GPT (478,976 parameters, context 128), b = 8 sequences.
    "gpt": dict(model=lambda: models.gpt(), data=lambda w, b: data.text_bytes(),
                batch_size=8, workers=(8, 32), steps=10),
}
H = 10
STRATEGIES = ("ddp", "diloco")


def _inner():
  return optax.adamw(1e-3)


def _outer():
  return optax.sgd(0.7, momentum=0.9, nesterov=True)


def _timed(fn):
  def run() -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start
  run()  # compile and warm
  return run


def _worker_mean(tree_W, w: int):
  return jax.tree.map(
      lambda x: jnp.tensordot(jnp.full((w,), 1.0 / w, x.dtype), x, axes=1),
      tree_W)


def minimal(strategy: str, model, sampler, w: int, b: int, steps: int,
            seed: int = 0):
  """The hand-written loop: ``run() -> seconds`` for ``steps`` steps."""
  sample = bench.uniform_sample(sampler, b)
  inner, outer = _inner(), _outer()
  key = jax.random.PRNGKey(seed)
  params = model.init(key, jax.tree.map(lambda x: x[:1], sample(key)))
  grad = jax.value_and_grad(model.loss, has_aux=True)

  def ddp_step(carry, key):
    params, opt = carry
    keys = jax.random.split(key, w)
    (loss_W, _), g_W = jax.vmap(grad, in_axes=(None, 0, 0))(
        params, jax.vmap(sample)(keys), keys)
    updates, opt = inner.update(_worker_mean(g_W, w), opt, params)
    return (optax.apply_updates(params, updates), opt), jnp.mean(loss_W)

  def inner_step(carry, key):
    def one(p, s, k):
      (loss, _), g = grad(p, sample(k), k)
      u, s = inner.update(g, s, p)
      return optax.apply_updates(p, u), s, loss
    params_W, opt_W = carry
    params_W, opt_W, loss_W = jax.vmap(one)(params_W, opt_W,
                                            jax.random.split(key, w))
    return (params_W, opt_W), jnp.mean(loss_W)

  def diloco_round(carry, key):
    glob, outer_state, params_W, opt_W = carry
    (params_W, opt_W), losses = jax.lax.scan(
        inner_step, (params_W, opt_W), jax.random.split(key, H))
    delta = jax.tree.map(jnp.subtract, glob, _worker_mean(params_W, w))
    updates, outer_state = outer.update(delta, outer_state, glob)
    glob = optax.apply_updates(glob, updates)
    params_W = jax.tree.map(lambda x: jnp.broadcast_to(x, (w,) + x.shape), glob)
    return (glob, outer_state, params_W, opt_W), losses

  if strategy == "ddp":
    body, n, carry = ddp_step, steps, (params, inner.init(params))
  else:
    params_W = jax.tree.map(lambda x: jnp.broadcast_to(x, (w,) + x.shape),
                            params)
    body, n = diloco_round, steps // H
    carry = (params, outer.init(params), params_W, jax.vmap(inner.init)(params_W))
  loop = jax.jit(lambda c, k: jax.lax.scan(body, c, jax.random.split(k, n)),
                 donate_argnums=0)
  state = {"carry": carry, "calls": 0}

  def call():
    state["calls"] += 1
    state["carry"], losses = loop(state["carry"],
                                  jax.random.PRNGKey(seed + state["calls"]))
    return losses
  return _timed(call)


def optimizer_only(model, sampler, copies: int, steps: int):
  """``run() -> seconds`` of ``steps`` AdamW updates of ``copies`` stacked
  copies of the model's parameters (a fixed gradient, no forward or
  backward pass): the optimizer's share of a step. DiLoCo's workers each
  keep their own optimizer state, so a step updates W copies where one
  replica updates one; the difference bounds DiLoCo's speed against one
  replica even if its matmuls ran at one replica's speed."""
  key = jax.random.PRNGKey(0)
  params = model.init(key, jax.tree.map(lambda x: x[:1],
                                        bench.uniform_sample(sampler, 1)(key)))
  params_C = jax.tree.map(lambda x: jnp.stack([x] * copies), params)
  grads_C = jax.tree.map(lambda x: x * 1e-3, params_C)
  inner = _inner()
  update = jax.vmap(inner.update)

  def step(carry, _):
    p, s = carry
    u, s = update(grads_C, s, p)
    return (optax.apply_updates(p, u), s), None

  loop = jax.jit(lambda c: jax.lax.scan(step, c, length=steps)[0],
                 donate_argnums=0)
  state = {"carry": (params_C, jax.vmap(inner.init)(params_C))}

  def call():
    state["carry"] = loop(state["carry"])
    return state["carry"]
  return _timed(call)


def lowbw_chunk(strategy, model, source, w: int, b: int, steps: int):
  """``run() -> seconds`` of a lowbw run's compiled chunk of ``steps``."""
  rounds = steps // strategy.period
  sim = build(model, source, strategy, workers=w, batch_size=b,
              steps=steps, rounds_per_chunk=rounds, compile=False)
  st, sampler, _, _ = sim.initial(0)
  exe, st = sim.executables(st, sampler, None)
  state = {"st": st}

  def call():
    state["st"], out = exe.chunk(state["st"], sampler, rounds, None)
    return out
  return _timed(call), sampler


def contenders(strategy: str, wl: dict, w: int) -> dict:
  b, steps = wl["batch_size"], wl["steps"]
  model, source = wl["model"](), wl["data"](w, b)
  s = (strategies.ddp(_inner()) if strategy == "ddp"
       else strategies.diloco(_inner(), _outer(), H=H))
  runs = {}
  runs["lowbw"], sampler = lowbw_chunk(s, model, source, w, b, steps)
  if strategy == "ddp":
    runs["lowbw per-worker"], _ = lowbw_chunk(s._replace(replicated=False),
                                              model, source, w, b, steps)
  runs["minimal"] = minimal(strategy, model, sampler, w, b, steps)
  runs["replica"] = bench.baseline(model, sampler, _inner(), w * b, steps)
  if strategy == "diloco":
    runs["adamw x W"] = optimizer_only(model, sampler, w, steps)
    runs["adamw x 1"] = optimizer_only(model, sampler, 1, steps)
  return runs


def measure(strategy: str, workload: str, w: int, repeats: int) -> dict:
  wl = WORKLOADS[workload]
  runs = contenders(strategy, wl, w)
  times = {k: [] for k in runs}
  for _ in range(repeats):
    for k, run in runs.items():
      times[k].append(run())
  med = {k: statistics.median(v) for k, v in times.items()}

  def ratio(a, b):  # a's speed over b's, per repeat, median
    return statistics.median(tb / ta for ta, tb in zip(times[a], times[b]))

  examples = w * wl["batch_size"] * wl["steps"]
  return {"strategy": strategy, "workload": workload, "W": w,
          "batch_size": wl["batch_size"], "steps": wl["steps"],
          "examples_per_s": {k: examples / t for k, t in med.items()},
          "lowbw_vs_minimal": ratio("lowbw", "minimal"),
          "lowbw_vs_replica": ratio("lowbw", "replica"),
          "minimal_vs_replica": ratio("minimal", "replica"),
          "per_worker_vs_minimal": (ratio("lowbw per-worker", "minimal")
                                    if "lowbw per-worker" in runs else None),
          "bound_vs_replica": (bound(times) if "adamw x W" in runs
                               else None),
          "times_s": times}


def bound(times: dict) -> float:
  """One replica's step time over (that time + the optimizer time W copies
  add over one), per repeat, median: the most of one replica's speed
  DiLoCo can reach if its W workers' matmuls ran at one replica's speed."""
  return statistics.median(
      rep / (rep + opt_w - opt_1) for rep, opt_w, opt_1 in zip(
          times["replica"], times["adamw x W"], times["adamw x 1"]))


def _row(r: dict) -> str:
  pw, bd = r["per_worker_vs_minimal"], r["bound_vs_replica"]
  return (f"| {r['strategy']} | {r['workload']} | {r['W']} | "
          f"{r['examples_per_s']['lowbw']:,.0f} | "
          f"{r['examples_per_s']['minimal']:,.0f} | "
          f"{r['examples_per_s']['replica']:,.0f} | "
          f"**{r['lowbw_vs_minimal']:.2f}** | {r['lowbw_vs_replica']:.2f} | "
          f"{r['minimal_vs_replica']:.2f} | "
          f"{'' if pw is None else f'{pw:.2f}'} | "
          f"{'' if bd is None else f'{bd:.2f}'} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--strategy", default="ddp,diloco",
                      help="ddp and/or diloco, comma-separated")
  parser.add_argument("--workload", default="mlp,cnn,gpt",
                      help=f"{' and/or '.join(WORKLOADS)}, comma-separated")
  parser.add_argument("--workers", default=None,
                      help="worker counts (default: the workload's)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  for flag, given, allowed in (("--strategy", args.strategy, STRATEGIES),
                               ("--workload", args.workload, WORKLOADS)):
    bad = sorted(set(given.split(",")) - set(allowed))
    if bad:
      parser.error(f"{flag}={','.join(bad)}: expected one of "
                   f"{', '.join(allowed)}")
  print("| strategy | model | W | lowbw ex/s | minimal ex/s | replica ex/s | "
        "lowbw / minimal | lowbw / replica | minimal / replica | "
        "per-worker / minimal | optimizer bound / replica |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  rows = []
  for workload in args.workload.split(","):
    ws = (WORKLOADS[workload]["workers"] if args.workers is None
          else [int(v) for v in args.workers.split(",")])
    for strategy in args.strategy.split(","):
      for w in ws:
        rows.append(measure(strategy, workload, w, args.repeats))
        print(_row(rows[-1]), flush=True)
  meta = {"device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
          "machine": platform.processor() or platform.machine(),
          "jax": jax.__version__, "repeats": args.repeats, "H": H}
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  main()
