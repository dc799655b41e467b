"""The GPU figures of a GPT-2-small-shaped model in one go: one replica's
MFU in bfloat16, DiLoCo at W = 8 against it, W = 64 workers resident on one
device, and the memory plan's estimate against the allocator's peak.

Every figure is a ``lowbw bench`` run (each worker count in a fresh process)
in bfloat16 autocast; on a GPU the GPT block hands attention to cuDNN's fused
kernel under 16-bit autocast (``fused_attention_applies`` of its module), and
the parameters are cast to bfloat16 once per step, outside the micro-batches.

1. **One replica** (DDP at W = 1, whose bench baseline is a plain optax loop
   on one model) at each ``--sizes`` batch:micro-batch size, largest last: a
   size that does not fit fails alone and the others go on. Printed per size:
   tokens/s and MFU of the simulator and of the plain loop.
2. **DiLoCo at W = 8** at the best size that fits (highest plain-loop
   tokens/s among the sizes divisible by 8): b = batch / 8 per worker, the
   same number of micro-batches, so the bench's baseline (one replica at
   batch W*b) is that replica. Its ``efficiency`` is the ratio asked for.
3. **W = 64 resident**: DiLoCo, ``--w64-batch`` sequences per worker,
   ``worker_batch`` chosen by the memory plan (``auto``).
4. **Estimate vs peak** for every run: ``memory_estimate_bytes`` over
   ``device_peak_bytes`` (null on a CPU, whose backend keeps no peak).

Figures: OUT_DIR/*.json (``lowbw bench --json-out``) and
OUT_DIR/summary.json, and a table on stdout.

Usage:
  python benchmarks/round4.py OUT_DIR          # the GPT-2-small shape
  python benchmarks/round4.py OUT_DIR --shape "--layers 1 --d-model 32 \\
      --heads 2 --seq-len 32" --sizes 8:8,16:8  # a quick check on a CPU
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

GPT2 = "--layers 12 --d-model 768 --heads 12 --seq-len 1024"
SIZES = "8:8,16:16,32:16,32:32,64:32,64:64,128:64"


def bench(out: str, name: str, argv: list[str]) -> dict:
  """One ``lowbw bench`` run; its configuration's figures, or
  ``{"failed": <its last error line>}`` (out of memory, refused)."""
  path = os.path.join(out, name + ".json")
  cmd = [sys.executable, "-m", "lowbw", "bench", "--autocast", "bfloat16",
         *argv, "--json-out", path]
  print("$ " + shlex.join(["python", *cmd[1:]]), flush=True)
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if proc.returncode != 0:
    lines = proc.stderr.strip().splitlines() or ["no output"]
    print("  failed: " + lines[-1], flush=True)
    return {"name": name, "failed": lines[-1]}
  with open(path) as f:
    (row,) = json.load(f)["configurations"]
  row["name"] = name
  print("  " + line(row), flush=True)
  return row


def _pct(x):
  return "-" if x is None else f"{100 * x:.1f} %"


def _gb(x):
  return "-" if x is None else f"{x / 1e9:.2f} GB"


def line(r: dict) -> str:
  """A run's figures in one line."""
  if "failed" in r:
    return f"{r['name']}: failed ({r['failed']})"
  ratio = r["estimate_over_device_peak"]
  return (f"{r['name']}: W={r['workers']} b={r['batch_size']} micro-batch "
          f"{r['minibatch_size'] or r['batch_size']}, worker batch "
          f"{r['worker_batch'] or 'all'}: "
          f"{r['tokens_per_s']:,.0f} tok/s (MFU {_pct(r['mfu'])}), one "
          f"replica at W*b {r['baseline_tokens_per_s']:,.0f} tok/s (MFU "
          f"{_pct(r['baseline_mfu'])}), efficiency {r['efficiency']:.3f}; "
          f"peak {_gb(r['device_peak_bytes'])}, estimate "
          f"{_gb(r['memory_estimate_bytes'])}"
          + ("" if ratio is None else f" (x{ratio:.2f} of the peak)"))


def sizes(text: str) -> list[tuple[int, int]]:
  """``B:m,...`` -> [(batch, micro-batch size)], each m dividing B."""
  out = []
  for part in text.split(","):
    b, m = (int(x) for x in part.split(":"))
    if b < 1 or m < 1 or b % m:
      raise SystemExit(f"--sizes: {part!r} is invalid: expected B:m, "
                       "positive, m dividing B")
    out.append((b, m))
  return out


def micro_flags(b: int, m: int) -> list[str]:
  return ["--batch-size", str(b)] + (
      ["--minibatch-size", str(m)] if m < b else [])


def replicas(a, shape: list[str]) -> list[dict]:
  rows = []
  for b, m in sizes(a.sizes):
    rows.append(bench(a.out, f"replica_b{b}_m{m}", [
        "--strategy", "ddp", "--workers", "1", "--rounds", str(a.rounds),
        "--repeats", str(a.repeats), *micro_flags(b, m), *shape]))
  return rows


def best(rows: list[dict]) -> dict | None:
  """The replica size with the highest plain-loop tokens/s whose batch and
  micro-batch split over 8 workers."""
  fits = [r for r in rows if "failed" not in r and r["batch_size"] % 8 == 0
          and (r["minibatch_size"] or r["batch_size"]) % 8 == 0]
  return max(fits, key=lambda r: r["baseline_tokens_per_s"], default=None)


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("out", help="folder for the figures")
  p.add_argument("--shape", default=GPT2, help=f"model flags ({GPT2})")
  p.add_argument("--sizes", default=SIZES,
                 help=f"one replica's batch:micro-batch sizes ({SIZES})")
  p.add_argument("--rounds", type=int, default=5,
                 help="DDP steps per timed call of the replica runs (5)")
  p.add_argument("--H", type=int, default=10, help="DiLoCo's H (10)")
  p.add_argument("--repeats", type=int, default=3, help="timed pairs (3)")
  p.add_argument("--w64", type=int, default=64, help="workers resident (64)")
  p.add_argument("--w64-batch", type=int, default=1,
                 help="sequences per worker at --w64 (1)")
  a = p.parse_args()
  os.makedirs(a.out, exist_ok=True)
  shape = shlex.split(a.shape)
  rows = replicas(a, shape)
  top = best(rows)
  if top is None:
    print("no replica size divisible by 8 fitted: DiLoCo at W = 8 skipped")
  else:
    b, m = top["batch_size"], top["minibatch_size"] or top["batch_size"]
    rows.append(bench(a.out, f"diloco_w8_b{b // 8}_m{m // 8}", [
        "--strategy", "diloco", "--H", str(a.H), "--workers", "8",
        "--repeats", str(a.repeats), *micro_flags(b // 8, m // 8), *shape]))
  rows.append(bench(a.out, f"diloco_w{a.w64}_b{a.w64_batch}", [
      "--strategy", "diloco", "--H", str(a.H), "--workers", str(a.w64),
      "--batch-size", str(a.w64_batch), "--repeats", str(a.repeats),
      *shape]))
  summary(a.out, rows, top)
  return 0


def summary(out: str, rows: list[dict], top: dict | None) -> None:
  from lowbw.models._blocks import fused_attention_applies
  import jax
  fused = fused_attention_applies("bfloat16")
  print(f"\nsummary ({jax.devices()[0].device_kind}; fused attention "
        f"{'on' if fused else 'off (einsums: not a GPU)'}):")
  for r in rows:
    print("  " + line(r))
  if top is not None:
    print(f"  best replica: {top['name']}, MFU {_pct(top['baseline_mfu'])}"
          " (the plain loop's)")
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"fused_attention": fused, "best_replica": top and top["name"],
               "runs": rows}, f, indent=2)


if __name__ == "__main__":
  sys.exit(main())
