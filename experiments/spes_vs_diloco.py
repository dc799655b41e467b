"""SPES against DiLoCo (and its paired DDP lane) on one mixture-of-experts
GPT, under the suite's rules (rows 7.5-7.7 of the findings table in
experiments/README.md).

SPES (Zhang et al., 2026, arXiv 2602.11543) claims that training only E/W
experts per worker (plus the shared parameters) costs little loss: slower
early, then close to DiLoCo (Fig. 4, Table 1); that the expert-merging
warm-up helps (Table 4); and that it sends fewer bytes (only the trained
parameters go up) and needs less memory (optimizer state for the trained
parameters only). Here every run trains the same ``models.moe_gpt`` (2
layers, d 64, 8 experts of width 128, top-2, context 64) on the Python
standard library's bytes with 4 sequences per worker and step (the
per-worker batch fixed as W varies), at W = 4 (the preset's ``workers``
takes more):

- the paper's inner optimizer: AdamW betas (0.9, 0.95), weight decay 0.1,
  clipping at 1.0, a 4 % linear warm-up and a cosine to 0.1x; H = 20 for 40
  syncs (800 steps); DiLoCo averages (outer SGD lr 1, as the authors' code
  runs SPES's baseline) and carries the paired DDP lane;
- SPES without merging and with the merging warm-up: a merge at every sync
  for the first fifth of the run (the paper's 12,500 of 62,500 steps), alpha
  0.1 decaying to 0, top 4 peers;
- the inner learning rate tuned for DiLoCo at the first W on a grid whose
  optimum is inside (seed 100) and reused; 5 seeds paired (the merge's
  effect is close).

"Slower early" is read at the first quarter of the run, "close" at its end,
both as paired relative gaps of eval cross-entropy (the loss without the
router terms) with one-sided 95 % t-bounds.

Usage:
  python experiments/spes_vs_diloco.py               # 2 CPU cores
  python experiments/spes_vs_diloco.py --report-only
  python experiments/spes_vs_diloco.py --preset tiny --out /tmp/s
"""

import os

import numpy as np

import _report
import lowbw
from lowbw import bench
from lowbw.strategies import _spes

COMMAND = "python experiments/spes_vs_diloco.py"
CACHE = "spes_vs_diloco_results.json"
KEY = "final_eval_cross_entropy"

PRESETS = {
    "cpu": dict(layers=2, d_model=64, heads=4, seq_len=64, experts=8,
                top_k=2, expert_hidden=128, batch_size=4, steps=800, H=20,
                eval_every=40, workers=[4], inner_lrs=[1e-3, 2e-3, 4e-3],
                seeds=[0, 1, 2], close_seeds=[3, 4]),
    "tiny": dict(layers=1, d_model=32, heads=2, seq_len=32, experts=8,
                 top_k=2, expert_hidden=32, batch_size=2, steps=80, H=10,
                 eval_every=20, workers=[4], inner_lrs=[2e-3, 4e-3],
                 seeds=[0, 1], close_seeds=[]),
}
MODEL_FIELDS = ("layers", "d_model", "heads", "seq_len", "experts", "top_k",
                "expert_hidden")


def base(p: dict) -> dict:
  """What every run shares (a dict: DiLoCo leaves out SPES's merging)."""
  return dict(
      data="text", model="moe_gpt", **{k: p[k] for k in MODEL_FIELDS},
      batch_size=p["batch_size"], steps=p["steps"], H=p["H"], b1=0.9,
      b2=0.95, weight_decay=0.1, max_norm=1.0,
      warmup_steps=max(1, p["steps"] * 4 // 100), schedule="cosine",
      min_lr_ratio=0.1, outer_lr=1.0, outer_momentum=0.0,
      eval_every=p["eval_every"], eval_examples=256, progress=False)


def points(p: dict, W: int) -> dict:
  """Label -> the point's values at W workers."""
  merge = p["steps"] // 5
  return {
      f"DiLoCo W={W}": {"strategy": "diloco", "workers": W, "shadow": "ddp"},
      f"SPES W={W}": {"strategy": "spes", "workers": W,
                      "merge_warmup_steps": 0},
      f"SPES+merge W={W}": {"strategy": "spes", "workers": W,
                            "merge_warmup_steps": merge, "merge_every": p["H"],
                            "merge_alpha": 0.1, "merge_top_k": 4}}


def memory(p: dict, lr: float, W: int, strategy: str) -> dict:
  """What one worker keeps between steps (built, not run)."""
  merging = {"merge_warmup_steps": 0} if strategy == "spes" else {}
  config = lowbw.Config(strategy=strategy, workers=W, inner_lr=lr,
                        **base(p), **merging)
  return bench.state_bytes(lowbw.build(config, compile=False))


def run_all(args, cache_path: str) -> dict:
  p = PRESETS[args.preset]
  root = os.path.join(_report.STUDIES, f"spes_vs_diloco_{args.preset}")
  tuning, tune_s = _report.grid_search(
      "inner", lowbw.Config(strategy="diloco", workers=p["workers"][0],
                            **base(p)),
      "inner_lr", p["inner_lrs"], "final_eval_loss", root)
  labelled = {k: v for W in p["workers"] for k, v in points(p, W).items()}
  tuned = {**base(p), "inner_lr": tuning["best"]}
  results, seconds = _report.labelled_study(
      f"spes_vs_diloco_{args.preset}/runs", tuned, labelled, p["seeds"])
  if p["close_seeds"]:  # the suite's rule 5: 5 seeds for a close verdict
    more, t = _report.labelled_study(
        f"spes_vs_diloco_{args.preset}/close", tuned, labelled,
        p["close_seeds"])
    results = {k: v + more[k] for k, v in results.items()}
    seconds += t
  state = {f"{s} W={W}": memory(p, tuning["best"], W, s)
           for W in p["workers"] for s in ("diloco", "spes")}
  return _report.save_results(cache_path, {
      "preset": args.preset, "settings": p, "tuning": tuning,
      "runs": results, "state": state, "compute_seconds": tune_s + seconds})


# The paper's configurations (Table 2; the Qwen tokenizer's 151,936-entry
# embedding, which Section 4.1 names; nodes as in Section 4.1).
PAPER = {"2B, 16 nodes": (16, 1536, 1280, 16, 16),
         "7B, 4 nodes": (16, 2048, 2048, 32, 4)}
VOCAB = 151_936


def paper_table():
  lines = ["| configuration | parameters / trained per node | memory per node "
           "DiLoCo / SPES (GB) | upload per node and round DiLoCo / SPES (GB) "
           "| upload + download saving |", "| --- | --- | --- | --- | --- |"]
  for name, (L, d, f, E, nodes) in PAPER.items():
    shared, expert = _spes.moe_param_counts(L, d, f, E, VOCAB)
    b = _spes.node_bytes(shared, expert, E, nodes)
    lines.append(
        f"| {name} | {b['params'] / 1e9:.2f}B / {b['trained'] / 1e9:.2f}B | "
        f"{b['memory_diloco'] / 1e9:.1f} / {b['memory_spes'] / 1e9:.1f} | "
        f"{b['uplink_diloco'] / 1e9:.1f} / {b['uplink_spes'] / 1e9:.1f} "
        f"({1 - b['uplink_spes'] / b['uplink_diloco']:.0%} less) | "
        f"{b['comm_saving']:.1%} |")
  return lines


# ------------------------------------------------------------------ report

def ce(runs: list[dict]) -> list[float]:
  return [r[KEY] for r in runs]


def early(runs: list[dict], at: int) -> list[dict]:
  """Each run's eval cross-entropy at step ``at``, as ``KEY`` (for
  ``_report.paired``)."""
  out = []
  for r in runs:
    i = r["curve"]["step"].index(at)
    out.append({"seed": r["seed"], KEY: r["curve"]["eval_cross_entropy"][i]})
  return out


def early_step(p: dict) -> int:
  """The evaluation nearest a quarter of the run."""
  return max(p["eval_every"], p["steps"] // 4 // p["eval_every"]
             * p["eval_every"])


def table(results: dict) -> list[str]:
  p, runs, state = results["settings"], results["runs"], results["state"]
  at = early_step(p)
  lines = [f"| run | eval CE (mean ± std) | vs DiLoCo at step {at} (paired) "
           "| vs DiLoCo at the end (paired) | wire MB per worker | state per "
           "worker MB (params + optimizer) |",
           "| --- | --- | --- | --- | --- | --- |"]
  for label, rs in runs.items():
    W = label.split("W=")[1]
    ref = runs[f"DiLoCo W={W}"]
    s = state[("diloco" if label.startswith("DiLoCo") else "spes") + f" W={W}"]
    cells = []
    for a, b in ((early(rs, at), early(ref, at)), (rs, ref)):
      g = _report.paired(a, b, KEY)
      cells.append("-" if rs is ref else
                   f"{g['mean']:+.2%} [{g['low']:+.2%}, {g['high']:+.2%}]")
    lines.append(
        f"| {label} | {_report.pm(ce(rs))} | {cells[0]} | {cells[1]} | "
        f"{rs[0]['wire_bytes'] / 1e6:.2f} | "
        f"{(s['params'] + s['optimizer']) / 1e6:.2f} ({s['params'] / 1e6:.2f}"
        f" + {s['optimizer'] / 1e6:.2f}) |")
  return lines


def lane_lines(results: dict) -> list[str]:
  out = []
  for W in results["settings"]["workers"]:
    rs = results["runs"][f"DiLoCo W={W}"]
    gaps = [r["final_shadow_gap"] for r in rs]
    out.append(f"- W={W}: the DDP lane ends at eval loss "
               f"{_report.pm([r['final_shadow_eval_loss'] for r in rs])}; "
               f"DiLoCo is {_report.mean_std(gaps)[0]:+.2%} from it.")
  return out


def report(results: dict) -> str:
  p, t = results["settings"], results["tuning"]
  params = next(iter(results["runs"].values()))[0]["num_params"]
  lines = [
      "# SPES vs DiLoCo on a mixture-of-experts GPT", "",
      f"Generated by `{COMMAND}` (preset {results['preset']}). "
      f"`moe_gpt` ({params:,} parameters: {p['layers']} layers, d "
      f"{p['d_model']}, {p['experts']} experts of width {p['expert_hidden']}, "
      f"top-{p['top_k']}, context {p['seq_len']}) on the Python standard "
      f"library's bytes, {p['batch_size']} sequences per worker and step, "
      f"{p['steps']} steps, H = {p['H']} ({p['steps'] // p['H']} syncs); "
      "AdamW (0.9, 0.95), weight decay 0.1, clipping 1.0, 4 % warm-up, "
      "cosine to 0.1x; DiLoCo and SPES average (outer SGD lr 1); SPES+merge "
      f"merges at every sync of the first {p['steps'] // 5} steps (alpha 0.1 "
      f"decaying to 0, top 4 peers); seeds {p['seeds'] + p['close_seeds']} "
      "paired. State per "
      "worker from the simulator's state (`lowbw.bench.state_bytes`).", "",
      f"Inner lr tuned for DiLoCo at W = {p['workers'][0]} (seed "
      f"{_report.TUNE_SEED}, final eval loss): {_report.grid_text(t)}.", ""]
  lines += table(results) + [""] + lane_lines(results)
  lines += ["", "![eval cross-entropy against steps](spes_vs_diloco.png)",
            "", "## Bytes per round with a parameter server", ""]
  lines += bytes_lines(p)
  lines += ["", "## The paper's configurations, by its formulas", "",
            "`lowbw.strategies._spes.node_bytes` on Table 2's architectures "
            "(parameter counts from `moe_param_counts`):", ""]
  lines += paper_table()
  return "\n".join(lines) + "\n"


def _abstract_params(p: dict):
  """The experiment model's parameter shapes (nothing computed)."""
  import jax
  from lowbw import models
  model = models.moe_gpt(
      layers=p["layers"], d_model=p["d_model"], heads=p["heads"],
      seq_len=p["seq_len"], num_experts=p["experts"], top_k=p["top_k"],
      expert_hidden=p["expert_hidden"])
  return jax.eval_shape(model.init, jax.random.key(0), {
      "tokens": np.zeros((1, p["seq_len"] + 1), np.int32)})


def bytes_lines(p: dict) -> list[str]:
  params = _abstract_params(p)
  out = []
  for W in p["workers"]:
    b = _spes.round_bytes(params, W)
    out.append(
        f"- W={W}: per worker and round SPES uploads "
        f"{b['spes_uplink'] / 1e6:.3f} MB (shared + {p['experts'] // W}"
        f" experts) and downloads {b['spes_downlink'] / 1e6:.3f} MB; DiLoCo "
        f"{b['diloco_uplink'] / 1e6:.3f} MB each way: uplink "
        f"{b['spes_uplink'] / b['diloco_uplink']:.3f}x, up + down "
        f"{(b['spes_uplink'] + b['spes_downlink']) / (2 * b['diloco_uplink']):.3f}x.")
  return out


def plot(results: dict, path: str) -> None:
  fig, ax = _report.axes()
  for label, rs in results["runs"].items():
    steps = rs[0]["curve"]["step"]
    ys = np.mean([r["curve"]["eval_cross_entropy"] for r in rs], axis=0)
    ax.plot(steps, ys, marker=".", label=label,
            linestyle="--" if "W=8" in label else "-")
  _report.save_plot(fig, ax, path, "step", "eval cross-entropy (mean of "
                    "seeds)")


# ---------------------------------------------------------------- findings

def finding_rows(results: dict) -> list[dict]:
  p, runs = results["settings"], results["runs"]
  at = early_step(p)
  setting = (f"MoE GPT (8 experts), W in {p['workers']} x {p['batch_size']} "
             f"sequences, H={p['H']} for {p['steps'] // p['H']} syncs, the "
             "paper's AdamW (0.9, 0.95) with warm-up + cosine, lr tuned for "
             f"DiLoCo, {len(p['seeds'] + p['close_seeds'])} seeds paired")
  row = dict(plot="spes_vs_diloco.png", command=COMMAND)
  return [_slower_early_row(p, runs, at, setting, row),
          _merge_row(p, runs, setting, row),
          _state_row(results, setting, row)]


def _slower_early_row(p, runs, at, setting, row) -> dict:
  g = {W: (_report.paired(early(runs[f"SPES W={W}"], at),
                          early(runs[f"DiLoCo W={W}"], at), KEY),
           _report.paired(runs[f"SPES W={W}"], runs[f"DiLoCo W={W}"], KEY))
       for W in p["workers"]}
  slower = all(e["low"] > 0 for e, _ in g.values())
  close = all(f["high"] <= 0.02 for _, f in g.values())
  return {
      "row": "7.5", "claim": "SPES (each worker trains E/W experts) is "
      "slower early, then close to DiLoCo", "source": "SPES paper (arXiv "
      "2602.11543) Fig. 4, Table 1", "setting": setting,
      "measured": "; ".join(
          f"W={W}: SPES vs DiLoCo at step {at} {e['mean']:+.2%} [{e['low']:+.2%}, "
          f"{e['high']:+.2%}], at the end {f['mean']:+.2%} [{f['low']:+.2%}, "
          f"{f['high']:+.2%}]" for W, (e, f) in g.items()),
      "verdict": _report.verdict(slower + close, 2),
      "why": "two checks, paired by seed on eval cross-entropy: slower early "
      f"(the one-sided 95 % lower bound at step {at} above 0) and close at "
      "the end (the upper bound <= +2 %)", **row}


def _merge_row(p, runs, setting, row) -> dict:
  g = {W: _report.paired(runs[f"SPES+merge W={W}"], runs[f"SPES W={W}"], KEY)
       for W in p["workers"]}
  verdict = ("reproduces" if all(x["high"] < 0 for x in g.values()) else
             "partly" if all(x["mean"] < 0 for x in g.values()) else
             "does not")
  return {
      "row": "7.6", "claim": "the expert-merging warm-up helps",
      "source": "SPES paper (arXiv 2602.11543) Table 4",
      "setting": setting + f", a merge at every sync of the first "
      f"{p['steps'] // 5} steps", "measured": "SPES+merge vs SPES: " +
      "; ".join(f"W={W}: {x['mean']:+.2%} [{x['low']:+.2%}, {x['high']:+.2%}]"
                for W, x in g.items()),
      "verdict": verdict,
      "why": "'reproduces' means the paired upper bound below 0 at each W; "
      "'partly' a mean below 0 whose bound is not", **row}


def _state_row(results, setting, row) -> dict:
  p, state = results["settings"], results["state"]
  params = _abstract_params(p)
  text, off = [], []
  for W in p["workers"]:
    share = (_spes.round_bytes(params, W)["spes_uplink"]
             / _spes.round_bytes(params, W)["diloco_uplink"])
    got = state[f"spes W={W}"]["optimizer"] / state[f"diloco W={W}"]["optimizer"]
    off.append(abs(got - share))
    text.append(f"W={W}: optimizer state {got:.3f}x (formula {share:.3f}), "
                f"uplink {share:.3f}x")
  return {
      "row": "7.7", "claim": "SPES keeps optimizer state and uploads for its "
      "trained share only (up to 33.3% fewer bytes up + down)",
      "source": "SPES paper (arXiv 2602.11543) §3, Table 2",
      "setting": setting, "measured": "; ".join(text) + "; the paper's 2B/16 "
      "nodes by its formulas: 33.3% (spes_vs_diloco.md)",
      "verdict": "reproduces" if max(off) < 0.005 else "does not",
      "why": "measured state against the formula Phi_t/Phi; bytes are "
      "counted exactly", **row}


def main():
  args = _report.preset_parser(__doc__, PRESETS).parse_args()
  results = _report.results_for(args, CACHE, run_all)
  _report.finish(args, results, "spes_vs_diloco", "spes_vs_diloco", report, plot,
                 finding_rows)


if __name__ == "__main__":
  main()
