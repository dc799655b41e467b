"""DiLoCo against DDP across workers W and sync interval H at one token
budget (row 1 of the findings table in experiments/README.md).

The claim (EXO Gym paper §2, from the DiLoCo paper): 8 DiLoCo workers match
data-parallel training while communicating 500x less (H = 500). Here: lowbw's
default GPT (478,976 parameters) on the Python standard library's bytes, a
global batch of 16 windows of 128 tokens split over W workers (16 / W each),
the same steps and tokens for every run, the same inner AdamW (warm-up then
cosine), DiLoCo's outer SGD (lr 0.7, Nesterov 0.9), W in {1, 2, 4, 8, 16},
H in {10, 50, 100, 500}, 3 seeds each, every label a ``lowbw.study`` under
``experiments/studies/diloco_scaling/`` (resumable; the cached runs were made
with ``lowbw.sweep``, and ``--verify`` reruns some through the study and
compares). Bytes are per worker (float32); simulated time is the clock on
H100s over a 1 Gbit/s, 50 ms ring, with the ideal network profile (the
cached runs predate the calibrated one). Token efficiency is the share of DDP's tokens that DDP needed to
reach DiLoCo's final loss (the planner's eta, row 6 reads it). The paper's
outer step was tuned at H = 500 and 150M parameters; at W = 8 the outer lr
and Nesterov momentum are also tuned per H (``TUNE_GRID`` at seed 0, then the
best at every seed), and the verdict reads those runs.

Usage:
  python experiments/diloco_scaling.py              # 140 min on 2 CPU cores
  python experiments/diloco_scaling.py --report-only
  python experiments/diloco_scaling.py --verify 2   # 2 cached runs again
  python experiments/diloco_scaling.py --steps 100 --workers 1,2 --H 10,50 \
      --out /tmp/d                                  # a quick check
"""

import argparse
import json
import os
import re
import shutil

import numpy as np

import _report
from lowbw import strategies

CACHE = "diloco_scaling_results.json"
COMMAND = "python experiments/diloco_scaling.py"
WORKERS, HS = (1, 2, 4, 8, 16), (10, 50, 100, 500)
TOLERANCE = 0.01  # DiLoCo "matches" DDP within 1% of DDP's eval loss


def point(kind: str, W: int, H: int, args) -> dict:
  """One run's settings (``lowbw.Config`` fields): the default GPT on the
  byte corpus, the global batch split over W, AdamW with warm-up and
  cosine. The clock is the ideal profile (latency + bytes / bandwidth), the
  one the cached runs were timed with before the calibrated profile became
  the default."""
  values = dict(
      strategy=kind, data="text", model="gpt", workers=W,
      batch_size=args.global_batch // W, steps=args.steps, inner="adamw",
      inner_lr=args.lr, weight_decay=0.1, schedule="cosine",
      warmup_steps=args.warmup, min_lr_ratio=0.0,
      eval_every=_report.every(args.eval_every, H),
      eval_examples=args.eval_examples, bandwidth=args.bandwidth,
      latency=args.latency, hardware="h100", network_profile="ideal",
      progress=False)
  return {**values, "H": H} if kind == "diloco" else values


def study_runs(name: str, kind: str, W: int, H: int, args, grid=None,
               seeds=None) -> dict:
  """One label's runs through ``lowbw.study`` (resumable, in
  ``experiments/studies/NAME``) and the compute seconds they took."""
  runs, seconds = _report.studied(name, point(kind, W, H, args), grid or {},
                                  seeds or args.seeds)
  return {"runs": runs, "seconds": seconds}


def folder(label: str) -> str:
  """A label's study folder under ``experiments/studies/``."""
  return "diloco_scaling/" + re.sub(r"[^a-z0-9]+", "_", label.lower()).strip(
      "_")


def configurations(args):
  for W in args.workers:
    yield f"DDP W={W}", "ddp", W, 1
    for H in args.H:
      yield f"DiLoCo W={W} H={H}", "diloco", W, H


# A diagnostic, one seed: is DiLoCo's loss at H=10 the outer optimizer's
# (the paper's lr 0.7 and Nesterov 0.9 were tuned at H=500)?
CHECK = "outer optimizer check W=1 H=10 (seed 0)"
OUTER_GRID = {"outer_lr": [0.1, 0.3, 0.7], "outer_momentum": [0.0, 0.9]}


# The claim's W with the outer step tuned per H: the grid at seed 0, then the
# best point at every seed (the paper tuned its outer step too).
TUNED_W = 8
TUNE_GRID = {"outer_lr": [0.5, 1.0], "outer_momentum": [0.0, 0.5, 0.9]}


def tune_label(H: int) -> str:
  return f"outer grid W={TUNED_W} H={H} (seed 0)"


def tuned_label(H: int) -> str:
  return f"DiLoCo W={TUNED_W} H={H} tuned outer"


def all_configs(args) -> list[tuple]:
  """Every label before tuning: (label, kind, W, H[, grid, seeds])."""
  configs = list(configurations(args)) + [(CHECK, "diloco", 1, 10,
                                           OUTER_GRID, [0])]
  if TUNED_W in args.workers:
    configs += [(tune_label(H), "diloco", TUNED_W, H, TUNE_GRID, [0])
                for H in args.H]
  return configs


def tuned_configs(results: dict, args) -> list[tuple]:
  """The tuned labels: each H's best point of its grid, at every seed."""
  return [(tuned_label(H), "diloco", TUNED_W, H,
           {k: [v] for k, v in _report.best_run(
               results[tune_label(H)]["runs"])["values"].items()})
          for H in args.H]


def run_all(args, cache_path):
  """Every label not in the cache, each a ``lowbw.study`` (its points
  resumable), the cache saved after each label."""
  def run(label, kind, W, H, grid=None, seeds=None):
    return study_runs(folder(label), kind, W, H, args, grid, seeds)
  # (label, *args) -> run(label, *args): the label names the study folder.
  labelled = lambda configs: [(c[0], *c) for c in configs]  # noqa: E731
  results = _report.run_resumable(cache_path, labelled(all_configs(args)),
                                  run, "final_eval_loss")
  if TUNED_W not in args.workers:
    return results
  return _report.run_resumable(cache_path,
                               labelled(tuned_configs(results, args)), run,
                               "final_eval_loss")


def verify(args, n: int) -> float:
  """Reruns one seed of each of the ``n`` cheapest cached labels (by the
  seconds per run the cache recorded) through ``study_runs`` in
  ``experiments/studies/diloco_scaling_verify/`` and compares them with
  the cache: prints each point's final eval loss, simulated time and
  payload bytes both ways and returns the largest relative difference of
  the final eval losses."""
  with open(os.path.join(args.out, CACHE)) as f:
    results = json.load(f)
  specs = {c[0]: c[1:] for c in all_configs(args)}
  specs.update({c[0]: c[1:] for c in tuned_configs(results, args)})
  cost = lambda label: (results[label]["seconds"]  # noqa: E731
                        / len(results[label]["runs"]))
  chosen = sorted((label for label in specs if label in results), key=cost)
  worst = 0.0
  for label in chosen[:n]:
    cached = results[label]["runs"][0]
    kind, W, H = specs[label][:3]
    name = "diloco_scaling_verify/" + folder(label).split("/")[1]
    shutil.rmtree(os.path.join(_report.STUDIES, name), ignore_errors=True)
    grid = {k: [v] for k, v in cached["values"].items()}
    new = study_runs(name, kind, W, H, args, grid, [cached["seed"]])["runs"][0]
    rel = abs(new["final_eval_loss"] / cached["final_eval_loss"] - 1)
    worst = max(worst, rel)
    print(f"{label}, seed {cached['seed']} ({cost(label):.0f} s a run when "
          "cached):")
    for key in ("final_eval_loss", "sim_time_s", "payload_bytes"):
      print(f"  {key}: cached {cached[key]!r}, now {new[key]!r}")
  print(f"largest relative difference of the final eval loss over {n} "
        f"points: {worst:.3g}")
  return worst


def ddp_tokens_to(ddp_runs, loss: float):
  """Tokens DDP (its mean curve over seeds) needed to reach ``loss``; None
  if it never did."""
  curves = [r["curve"] for r in ddp_runs]
  mean = {"tokens": curves[0]["tokens"],
          "eval_loss": list(np.mean([c["eval_loss"] for c in curves], 0))}
  return _report.reach(mean, loss, "tokens")


def finished_table() -> dict:
  """The summary of the cached runs (docs/experiments) for every default W
  whose runs are all there, keyed by (W, H) for DiLoCo: what row 6 reads.
  {} without a cache."""
  path = os.path.join(_report.DOCS, CACHE)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    results = json.load(f)
  done = [W for W in WORKERS if all(
      c[0] in results for c in configurations(
          argparse.Namespace(workers=[W], H=list(HS))))]
  table = summarize(results, argparse.Namespace(workers=done, H=list(HS)))
  return {(t["W"], t["H"]): t for t in table.values() if t["H"] > 1}


def summarize(results, args):
  """Per (W, H): loss mean/std, gap to DDP at the same W, efficiency."""
  table = {}
  for W in args.workers:
    ddp = results[f"DDP W={W}"]["runs"]
    ddp_loss = _report.mean_std(r["final_eval_loss"] for r in ddp)[0]
    total = ddp[0]["curve"]["tokens"][-1]
    for label, H in [(f"DDP W={W}", 1)] + [
        (f"DiLoCo W={W} H={H}", H) for H in args.H]:
      runs = results[label]["runs"]
      loss, std = _report.mean_std(r["final_eval_loss"] for r in runs)
      need = ddp_tokens_to(ddp, loss) if H > 1 else total
      if need is None:  # below DDP's final loss: at least as efficient
        need = total
      table[label] = {
          "W": W, "H": H, "loss": loss, "std": std,
          "gap": (loss - ddp_loss) / ddp_loss,
          "eta": min(need / total, 1.0),
          "payload": runs[0]["payload_bytes"], "wire": runs[0]["wire_bytes"],
          "sim_time": _report.mean_std(r["sim_time_s"] for r in runs)[0]}
  return table


def report(results, table, args):
  lines = [
      "# DiLoCo against DDP across W and H", "",
      f"Generated by `{COMMAND}`. Default GPT, {args.steps} steps of a "
      f"global batch of {args.global_batch} windows ({table_tokens(results)}"
      " tokens per run), split over W workers; inner AdamW lr "
      f"{args.lr} (warm-up {args.warmup}, cosine, wd 0.1), DiLoCo's outer "
      f"SGD 0.7 Nesterov 0.9; seeds {args.seeds}; eval on "
      f"{args.eval_examples} held-out windows. Gap: (DiLoCo - DDP) / DDP at "
      f"the same W; eta: DDP's tokens to DiLoCo's final loss over all "
      f"tokens. Clock: H100 compute model, {args.bandwidth} / {args.latency} "
      "ring.", "",
      "| run | eval loss | gap vs DDP | eta | payload MB / worker | wire MB "
      "/ worker | simulated s |", "| --- | --- | --- | --- | --- | --- | --- |"]
  for label, t in table.items():
    eta = f"{t['eta']:.2f}"
    lines.append(
        f"| {label} | {t['loss']:.4f} ± {t['std']:.4f} | {t['gap']:+.2%} | "
        f"{eta} | {t['payload'] / 1e6:.2f} | {t['wire'] / 1e6:.2f} | "
        f"{t['sim_time']:.3g} |")
  lines += ["", "![eval loss against H](diloco_scaling.png)", ""]
  if CHECK in results:
    lines += [f"## {CHECK}", "", "The same W=1, H=10 run with other outer "
              "optimizers (one `lowbw.sweep` grid, one seed):", "",
              "| outer lr | outer momentum (Nesterov) | eval loss |",
              "| --- | --- | --- |"]
    lines += [f"| {r['values']['outer_lr']:g} | "
              f"{r['values']['outer_momentum']:g} | "
              f"{r['final_eval_loss']:.4f} |" for r in results[CHECK]["runs"]]
    lines.append("")
  lines += tuned_lines(results, table, args)
  _report.write_report(os.path.join(args.out, "diloco_scaling.md"),
                       "\n".join(lines))
  fig, ax = _report.axes()
  for W in args.workers:
    rows = [t for t in table.values() if t["W"] == W]
    ax.errorbar([t["H"] for t in rows], [t["loss"] for t in rows],
                yerr=[t["std"] for t in rows], marker="o", capsize=3,
                label=f"W={W} (H=1: DDP)")
  _report.save_plot(fig, ax, os.path.join(args.out, "diloco_scaling.png"),
                    "H, inner steps between syncs (1 = DDP)",
                    f"eval loss after {args.steps} steps")


def tuned(results, table, args) -> dict:
  """Per H at W = TUNED_W: the chosen outer values, loss mean/std over the
  seeds and gap to DDP; {} before the tuned runs exist."""
  ddp = table.get(f"DDP W={TUNED_W}")
  out = {}
  for H in args.H:
    if ddp is None or tuned_label(H) not in results:
      continue
    runs = results[tuned_label(H)]["runs"]
    loss, std = _report.mean_std(r["final_eval_loss"] for r in runs)
    out[H] = {"values": runs[0]["values"], "loss": loss, "std": std,
              "gap": (loss - ddp["loss"]) / ddp["loss"]}
  return out


def tuned_lines(results, table, args) -> list[str]:
  rows = tuned(results, table, args)
  if not rows:
    return []
  lines = [f"## W={TUNED_W} with the outer step tuned per H", "",
           f"Outer lr x Nesterov momentum over {TUNE_GRID} at seed 0 (one "
           "`lowbw.sweep` grid per H), then the best point at every seed.",
           "", "| H | outer lr | momentum | eval loss (paper's outer) | eval "
           "loss (tuned) | gap vs DDP (tuned) |",
           "| --- | --- | --- | --- | --- | --- |"]
  for H, t in rows.items():
    paper = table[f"DiLoCo W={TUNED_W} H={H}"]
    lines.append(
        f"| {H} | {t['values']['outer_lr']:g} | "
        f"{t['values']['outer_momentum']:g} | {paper['loss']:.4f} ± "
        f"{paper['std']:.4f} | {t['loss']:.4f} ± {t['std']:.4f} | "
        f"{t['gap']:+.2%} |")
  return lines + [""]


def table_tokens(results):
  first = next(iter(results.values()))["runs"][0]["curve"]["tokens"]
  return f"{int(first[-1]):,}"


def _tokens_per_param(results) -> float:
  import jax
  first = next(iter(results.values()))["runs"][0]["curve"]["tokens"]
  n = sum(x.size for x in jax.tree.leaves(_report.gpt_params()))
  return first[-1] / n


def finding(table, results, args):
  """Row 1's verdict: does DiLoCo at W=8 match DDP up to H = 500?"""
  W = 8 if 8 in args.workers else max(args.workers)
  better = tuned(results, table, args)  # the paper tuned its outer step too
  matched = {t["H"]: better.get(t["H"], t)["gap"] <= TOLERANCE
             for t in table.values() if t["W"] == W and t["H"] > 1}
  largest = {w: max([t["H"] for t in table.values() if t["W"] == w
                     and t["H"] > 1 and t["gap"] <= TOLERANCE], default=None)
             for w in args.workers}
  top = max(args.H)
  if matched.get(top):
    verdict = "reproduces"
  elif any(matched.values()):
    verdict = "partly"
  else:
    verdict = "does not"
  gaps = ", ".join(f"H={t['H']} {t['gap']:+.1%}" for t in table.values()
                   if t["W"] == W and t["H"] > 1)
  ratio = table[f"DDP W={W}"]["payload"] / table[f"DiLoCo W={W} H={top}"][
      "payload"]
  measured = (f"W={W}: DDP {table[f'DDP W={W}']['loss']:.3f} ± "
              f"{table[f'DDP W={W}']['std']:.3f}; DiLoCo gap {gaps}; "
              f"H={top} sends {ratio:.0f}x fewer bytes. Largest matching H "
              "per W: " + ", ".join(f"{w}: {h or 'none'}"
                                    for w, h in largest.items()))
  if better:
    measured += (f". W={TUNED_W}, outer step tuned per H: " + ", ".join(
        f"H={H} {t['gap']:+.1%} (lr {t['values']['outer_lr']:g}, momentum "
        f"{t['values']['outer_momentum']:g})" for H, t in better.items()))
  best = min((t for t in table.values() if t["H"] > 1),
             key=lambda t: t["gap"])
  why = (f"'matches' means within {TOLERANCE:.0%} of DDP's loss"
         + (" with the outer step tuned" if better else "") + ". At "
         f"{table_tokens(results)} tokens the gap grows with W (each "
         f"worker's batch is {args.global_batch}/W); the closest is W="
         f"{best['W']} H={best['H']} ({best['gap']:+.1%}). The paper ran "
         "150M parameters for 88k steps. This regime breaks the suite's "
         f"rules: {args.steps // max(args.H)} to {args.steps // min(args.H)} "
         "outer steps from scratch (H=500 is one-shot averaging of the "
         f"workers), about {_tokens_per_param(results):.1f} tokens per "
         "parameter, a constant learning rate, and a per-worker batch that "
         "shrinks as W grows")
  if better:
    gaps = [table[f"DiLoCo W={W} H={H}"]["gap"] - t["gap"]
            for H, t in better.items()]
    why += (f". Tuning the outer step at W={W} narrows the gap by "
            f"{min(gaps) * 100:.1f} to {max(gaps) * 100:.1f} percentage "
            "points, but none "
            f"comes within {TOLERANCE:.0%} (best "
            f"{min(t['gap'] for t in better.values()):+.1%})")
  if CHECK in results:
    runs = results[CHECK]["runs"]
    top = _report.best_run(runs)
    outer = strategies.spec("diloco").outer
    paper = _report.run_at(runs, {"outer_lr": outer.lr,
                                  "outer_momentum": outer.momentum})
    why += (f". H=10 suffers from the paper's outer optimizer (tuned at "
            f"H=500): at W=1 (one seed) outer lr "
            f"{top['values']['outer_lr']:g}, momentum "
            f"{top['values']['outer_momentum']:g} gives "
            f"{top['final_eval_loss']:.3f} against "
            f"{paper['final_eval_loss']:.3f}")
  return {"row": "1.1", "claim": "control, not the verdict (few outer "
          "steps from scratch; row 1 asks at a faithful regime): 8 DiLoCo "
          "workers match DDP with 500x less communication (H=500)",
          "source": "EXO Gym paper §2, DiLoCo paper",
          "setting": f"default GPT, {args.steps} steps x {args.global_batch} "
          f"windows split over W in {args.workers}, H in {args.H}, "
          f"{len(args.seeds)} seeds", "measured": measured,
          "verdict": verdict, "why": why, "plot": "diloco_scaling.png",
          "command": COMMAND}


def main():
  parser = _report.parser(__doc__)
  parser.add_argument("--workers", type=_report.ints, default=list(WORKERS))
  parser.add_argument("--H", type=_report.ints, default=list(HS))
  parser.add_argument("--steps", type=int, default=500)
  parser.add_argument("--global-batch", type=int, default=16)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--warmup", type=int, default=25)
  parser.add_argument("--eval-every", type=int, default=25)
  parser.add_argument("--eval-examples", type=int, default=128)
  parser.add_argument("--bandwidth", default="1Gbps")
  parser.add_argument("--latency", default="50ms")
  parser.add_argument("--verify", type=int, metavar="N", default=0,
                      help="rerun one seed of the N cheapest cached runs "
                      "through lowbw.study and compare them with the cache")
  args = parser.parse_args()
  if args.verify:
    verify(args, args.verify)
    return
  results = _report.results_for(args, CACHE, run_all)
  table = summarize(results, args)
  report(results, table, args)
  _report.publish_rows(args, "diloco_scaling", results,
                       lambda: [finding(table, results, args)])


if __name__ == "__main__":
  main()
