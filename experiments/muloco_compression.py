"""MuLoCo's claims under the suite's rules (rows 3.1-3.5 of the findings table
in experiments/README.md).

The MuLoCo paper (Thérien et al., 2025, arXiv 2505.23725) claims: (1) error
feedback consistently improves top-k sparsified and quantized DiLoCo updates;
(2) MuLoCo (Muon inner steps) converges to a lower loss than DiLoCo (AdamW
inner steps), with and without compression; (3) with 2-bit quantization and
error feedback MuLoCo beats uncompressed DiLoCo while sending 8x less than a
16-bit payload; (4) at identical memory complexity (Table 1). Its Figure 4
compares top-k, DCT top-k and random-k.

Here every run trains the same small GPT (2 blocks, d_model 32, context 64)
on the Python standard library's bytes with the paper's K = 8 workers x 4
windows, H = 30 for 20 outer steps (600 steps), a 5 % warm-up and a cosine
to 0.1x, clipping at 1 (AdamW weight decay 7.2e-5 as the paper's AdamW
baseline):

- tuned at seed 100 on float32, per method, each grid with its optimum
  inside: the inner rate (with the paper's outer SGD lr 0.8, Nesterov 0.9),
  then the outer rate (Nesterov 0.9) at the tuned inner rate;
- per method: float32 (with its paired DDP lane, ``shadow="ddp"``: DDP with
  AdamW against DDP with Muon, at the methods' rates, says how much of
  MuLoCo's win is Muon's), 8-, 4- and 2-bit statistical quantization on the
  authors' grid and top-k 10 % and 1 %, each with error feedback off and at
  the paper's beta (0.7 AdamW, 0.9 Muon); Figure 4's DCT top-k (chunk 128)
  and random-k at top-k's exact bytes with the paper's beta;
- 3 seeds paired (seed s shares its initialisation and data order); the
  headline pairs (float32, and MuLoCo 2-bit + EF against DiLoCo float32) get
  2 more when close. For 2-bit, top-k 10 % and top-k 1 %, EF off and on
  are run once more, each at its own outer rate tuned on its own grid (the
  float32 rate may not suit a compressed, error-fed pseudo-gradient): row
  3.1 is judged there. Verdicts use paired relative differences of the final
  eval loss and their one-sided 95 % t-bounds. Memory per worker comes from
  ``lowbw.bench.state_bytes``.

Usage:
  python experiments/muloco_compression.py          # ~65 min on 2 CPU cores
  python experiments/muloco_compression.py --report-only
  python experiments/muloco_compression.py --preset tiny --out /tmp/m
"""

import os

import numpy as np

import _report
import lowbw
from lowbw import bench, strategies, transforms

COMMAND = "python experiments/muloco_compression.py"
CACHE = "muloco_claims_results.json"
KEY = "final_eval_loss"
METHODS = {"DiLoCo": ("diloco", 0.7), "MuLoCo": ("muloco", 0.9)}  # EF beta
CODECS = {"8-bit": "quant:8:statistical:muloco",
          "4-bit": "quant:4:statistical:muloco",
          "2-bit": "quant:2:statistical:muloco",
          "top-k 10%": "topk:0.1", "top-k 1%": "topk:0.01"}
SPARSE = {"10%": 0.1, "1%": 0.01}
# The codecs whose EF on/off pairs are also run at their own tuned outer
# rate (row 3.1 asked at rates tuned per codec, not float32's).
EF_TUNED = ("2-bit", "top-k 10%", "top-k 1%")
_PAPER = strategies.spec("muloco").outer  # section 4, for both methods
CLOSE = 0.02  # a headline gap this small gets the close seeds (rule 5)
TWO_BIT = f"MuLoCo | 2-bit | EF {METHODS['MuLoCo'][1]}"
# The pairs whose verdicts may be close: run -> the run it is compared with.
HEADLINE = {"MuLoCo | fp32": "DiLoCo | fp32", TWO_BIT: "DiLoCo | fp32"}

PRESETS = {
    "cpu": dict(layers=2, d_model=32, heads=2, seq_len=64, workers=8,
                batch_size=4, steps=600, H=30,
                inner_lrs={"DiLoCo": [2e-3, 4e-3, 8e-3],
                           "MuLoCo": [1e-2, 2e-2, 4e-2]},
                outer_lrs=[0.4, 0.8, 1.2], seeds=[0, 1, 2],
                close_seeds=[3, 4]),
    "tiny": dict(layers=1, d_model=32, heads=2, seq_len=32, workers=2,
                 batch_size=2, steps=40, H=10,
                 inner_lrs={"DiLoCo": [4e-3, 8e-3], "MuLoCo": [1e-2, 2e-2]},
                 outer_lrs=[0.4, 0.8], seeds=[0, 1], close_seeds=[]),
}


def base(p: dict) -> dict:
  """What every run shares."""
  return dict(
      data="text", model="gpt", layers=p["layers"], d_model=p["d_model"],
      heads=p["heads"], seq_len=p["seq_len"], workers=p["workers"],
      batch_size=p["batch_size"], steps=p["steps"], H=p["H"], max_norm=1.0,
      warmup_steps=max(1, p["steps"] // 20), schedule="cosine",
      min_lr_ratio=0.1, eval_every=p["H"] * max(1, 60 // p["H"]),
      eval_examples=256, progress=False)


def method_base(p: dict, m: str) -> dict:
  extra = {"weight_decay": 7.2e-5} if m == "DiLoCo" else {}
  return {**base(p), "strategy": METHODS[m][0], **extra}


def sizes(p: dict) -> dict:
  """Per target fraction, the DCT top-k (chunk 128) k and the random-k
  fraction sending at most top-k's exact payload; and the 16-bit payload."""
  config = lowbw.Config(**method_base(p, "DiLoCo"))
  params = lowbw.build(config, compile=False).abstract_params
  out = {"bf16": transforms.payload_nbytes(transforms.parse_codec(
      "cast:bf16"), params)}
  for label, f in SPARSE.items():
    target = transforms.payload_nbytes(transforms.parse_codec(f"topk:{f}"),
                                       params)
    k = _report.matching(lambda k: f"dct:128:{int(k)}", target, params, 1,
                         128 * 128, integer=True)
    r = _report.matching(lambda x: f"randk:{x:.6g}", target, params, 1e-4,
                         1.0)
    out[label] = {"dct": f"dct:128:{int(k)}", "randk": f"randk:{r:.6g}"}
  return out


def points(m: str, s: dict) -> dict:
  """Label -> a method's point values: float32 (with the DDP lane), every
  codec with EF off and at the paper's beta, Figure 4's DCT and random-k."""
  beta = METHODS[m][1]
  out = {f"{m} | fp32": {"codec": "none", "shadow": "ddp"}}
  for name, spec in CODECS.items():
    out[f"{m} | {name} | EF off"] = {"codec": spec, "ef": 0.0}
    out[f"{m} | {name} | EF {beta}"] = {"codec": spec, "ef": beta}
  for label in SPARSE:
    out[f"{m} | DCT top-k ~{label}"] = {"codec": s[label]["dct"], "ef": beta}
    out[f"{m} | random-k ~{label}"] = {"codec": s[label]["randk"], "ef": beta}
  return out


def tune(p: dict, m: str, root: str) -> tuple[dict, float]:
  """The inner rate at the paper's outer step, then the outer rate."""
  config = {**method_base(p, m), "outer_lr": _PAPER.lr,
            "outer_momentum": _PAPER.momentum}
  inner, t1 = _report.grid_search(f"{m}_inner", config, "inner_lr",
                                  p["inner_lrs"][m], KEY, root)
  outer, t2 = _report.grid_search(
      f"{m}_outer", {**config, "inner_lr": inner["best"]}, "outer_lr",
      p["outer_lrs"], KEY, root)
  print(f"{m}: inner {_report.grid_text(inner)}; outer "
        f"{_report.grid_text(outer)}", flush=True)
  return {"inner": inner, "outer": outer}, t1 + t2


def run_all(args, cache_path: str) -> dict:
  p = PRESETS[args.preset]
  name = f"muloco_{args.preset}"
  root = os.path.join(_report.STUDIES, name)
  s, tuning, runs, memory, seconds = sizes(p), {}, {}, {}, 0.0
  for m in METHODS:
    tuning[m], t = tune(p, m, root)
    tuned = {**method_base(p, m), "inner_lr": tuning[m]["inner"]["best"],
             "outer_lr": tuning[m]["outer"]["best"],
             "outer_momentum": _PAPER.momentum}
    found, t2 = _report.labelled_study(f"{name}/{m}", tuned, points(m, s),
                                       p["seeds"])
    runs.update(found)
    seconds += t + t2
    memory[m] = {
        label: bench.state_bytes(lowbw.build(lowbw.Config(
            **tuned, **({"codec": CODECS["2-bit"], "ef": METHODS[m][1]}
                        if label == "ef" else {})), compile=False))
        for label in ("plain", "ef")}
  if p["close_seeds"]:
    close = {k: v for k, v in HEADLINE.items()
             if abs(_report.paired(runs[k], runs[v])["mean"]) <= CLOSE}
    for label in {x for pair in close.items() for x in pair}:
      m = label.split(" | ")[0]
      tuned = {**method_base(p, m), "inner_lr": tuning[m]["inner"]["best"],
               "outer_lr": tuning[m]["outer"]["best"],
               "outer_momentum": _PAPER.momentum}
      more, t = _report.labelled_study(
          f"{name}/close_{label.replace(' | ', '_').replace(' ', '_')}",
          tuned, {label: points(m, s)[label]}, p["close_seeds"])
      runs[label] = runs[label] + more[label]
      seconds += t
  ef_tuning = {}
  for m in METHODS:
    grids, found, t = own_outer_rate(p, m, tuning[m], name, root)
    ef_tuning.update(grids)
    runs.update(found)
    seconds += t
  return _report.save_results(cache_path, {
      "preset": args.preset, "settings": p, "sizes": s, "tuning": tuning,
      "runs": runs, "memory": memory, "ef_tuning": ef_tuning,
      "compute_seconds": seconds})


def own_label(m: str, c: str, ef: float) -> str:
  return f"{m} | {c} | EF {ef if ef else 'off'} | own outer lr"


def own_outer_rate(p: dict, m: str, t: dict, name: str,
                   root: str) -> tuple[dict, dict, float]:
  """Each ``EF_TUNED`` codec with EF off and at the paper's beta, its outer
  rate tuned on its own grid (seed 100, optimum inside), then the seeds at
  it: label -> grid, label -> runs, and the seconds."""
  tuned = {**method_base(p, m), "inner_lr": t["inner"]["best"],
           "outer_momentum": _PAPER.momentum}
  grids, runs, seconds = {}, {}, 0.0
  for c in EF_TUNED:
    for ef in (0.0, METHODS[m][1]):
      label = own_label(m, c, ef)
      slug = "".join(ch for ch in f"{m}_{c}_ef{ef}" if ch.isalnum() or
                     ch in "_.")
      grids[label], t1 = _report.grid_search(
          f"tune_own_{slug}", {**tuned, "codec": CODECS[c], "ef": ef}, "outer_lr",
          p["outer_lrs"], KEY, root)
      print(f"{label}: {_report.grid_text(grids[label])}", flush=True)
      found, t2 = _report.labelled_study(
          f"{name}/own_{slug}", tuned, {label: {
              "codec": CODECS[c], "ef": ef,
              "outer_lr": grids[label]["best"]}}, p["seeds"])
      runs.update(found)
      seconds += t1 + t2
  return grids, runs, seconds


# ----------------------------------------------------------------- analysis

def setting(r: dict) -> str:
  p, t = r["settings"], r["tuning"]
  n = r["runs"]["DiLoCo | fp32"][0]["num_params"]
  tokens = p["workers"] * p["batch_size"] * p["seq_len"] * p["steps"]
  rates = "; ".join(
      f"{m} inner {t[m]['inner']['best']:g}, outer {t[m]['outer']['best']:g}"
      for m in METHODS)
  return (f"{_report.gpt_text(p, n)}, K={p['workers']} x {p['batch_size']} windows of "
          f"{p['seq_len']}, H={p['H']} for {p['steps'] // p['H']} outer steps "
          f"({tokens / n:.0f} tokens per parameter), warm-up + cosine to "
          f"0.1x, rates tuned per method with Nesterov 0.9 ({rates})")


def memory(r: dict) -> dict:
  """Per method, in parameter copies per worker: optimizer state and the
  EF residual (a build with EF)."""
  out = {}
  for m in METHODS:
    mem = r["memory"][m]
    params = mem["plain"]["params"]
    out[m] = {"optimizer": mem["plain"]["optimizer"] / params,
              "ef": mem["ef"]["messages"] / params}
  return out


def report(r: dict) -> str:
  runs, t = r["runs"], r["tuning"]
  lines = [
      "# MuLoCo's claims", "",
      f"Generated by `{COMMAND}` (preset `{r['preset']}`, "
      f"{r['compute_seconds'] / 60:.0f} min of compute). {setting(r)}. "
      "Quantization on the MuLoCo authors' statistical grid; DCT top-k with "
      "chunk 128 and random-k sized to top-k's exact bytes. Payload: bytes "
      "each worker encodes over the run. Gaps are paired by seed, relative, "
      "with one-sided 95 % t-bounds.", "",
      "## Tuning (float32, seed 100)", "",
      "| method | inner lr (outer 0.8, Nesterov 0.9) | outer lr (Nesterov 0.9) "
      "|", "| --- | --- | --- |"]
  for m in METHODS:
    lines.append(f"| {m} | {_report.grid_text(t[m]['inner'])} | "
                 f"{_report.grid_text(t[m]['outer'])} |")
  lines += ["", "## Every configuration", "",
            "| run | eval loss | vs own float32 | payload MB |",
            "| --- | --- | --- | --- |"]
  for label, x in runs.items():
    own = runs[label.split(" | ")[0] + " | fp32"]
    vs = "-" if x is own else _report.gap_text(_report.paired(x, own))
    lines.append(f"| {label} | {_report.pm(_report.losses(x))} | {vs} | "
                 f"{x[0]['payload_bytes'] / 1e6:.3f} |")
  lines += own_rate_lines(r)
  lines += ["", "## The paired DDP lanes (float32 runs)", ""]
  for m in METHODS:
    x = runs[f"{m} | fp32"]
    lines.append(f"- {m}'s lane (DDP with its inner optimizer and rate): "
                 f"{_report.pm(_report.losses(_report.lanes(x)))}; {m} is "
                 f"{_report.gap_text(_report.lane_gap(x))} from it.")
  lines += ["", "## Memory per worker (Table 1)", "",
            "`lowbw.bench.state_bytes`, in parameter copies (the outer "
            "optimizer's momentum is one more copy, global).", "",
            "| inner | optimizer state | EF residual | total |",
            "| --- | --- | --- | --- |"]
  for m, mem in memory(r).items():
    lines.append(f"| {m} | {mem['optimizer']:.2f} | {mem['ef']:.2f} | "
                 f"{mem['optimizer'] + mem['ef']:.2f} |")
  lines += ["", "![eval loss against payload bytes](muloco.png)", ""]
  return "\n".join(lines)


def own_rate_lines(r: dict) -> list[str]:
  """EF off against on, each at its own tuned outer rate."""
  if not r.get("ef_tuning"):
    return []
  runs, g = r["runs"], r["ef_tuning"]
  lines = ["", "## Error feedback at each codec's own outer rate", "",
           "The outer rate (Nesterov 0.9) tuned for each codec with EF off "
           "and with EF at the paper's beta, on its own grid at seed 100; "
           "then the seeds at the best rate.", "",
           "| method | codec | EF off: outer lr, eval loss | EF on: beta, "
           "outer lr, eval loss | with EF / without - 1 |",
           "| --- | --- | --- | --- | --- |"]
  for m, (_, beta) in METHODS.items():
    for c in EF_TUNED:
      off, on = own_label(m, c, 0.0), own_label(m, c, beta)
      lines.append(
          f"| {m} | {c} | {g[off]['best']:g}, "
          f"{_report.pm(_report.losses(runs[off]))} | {beta}, "
          f"{g[on]['best']:g}, {_report.pm(_report.losses(runs[on]))} | "
          f"{_report.gap_text(_report.paired(runs[on], runs[off]))} |")
  lines += ["", "Grids (final eval loss, seed 100):", ""]
  lines += [f"- {label}: {_report.grid_text(grid)}"
            for label, grid in g.items()]
  return lines


def plot(r: dict, path: str) -> None:
  fig, ax = _report.axes()
  runs = r["runs"]
  for m, (_, beta) in METHODS.items():
    for ef, style in ((f"EF {beta}", "-"), ("EF off", ":")):
      labels = [f"{m} | fp32"] + [f"{m} | {c} | {ef}" for c in CODECS]
      pts = sorted((runs[k][0]["payload_bytes"], _report.losses(runs[k]))
                   for k in labels)
      ax.errorbar([x for x, _ in pts], [np.mean(v) for _, v in pts],
                  yerr=[np.std(v) for _, v in pts], marker="o", capsize=3,
                  ls=style, label=f"{m}, {ef}")
  _report.save_plot(fig, ax, path, "payload bytes per worker, whole run",
                    "final eval loss (mean ± std over seeds)")


# ---------------------------------------------------------------- findings

def rows(r: dict) -> list[dict]:
  row = dict(source="MuLoCo paper (arXiv 2505.23725)", plot="muloco.png",
             command=COMMAND)
  seeds = len(r["settings"]["seeds"])
  s = f"{setting(r)}; {seeds} seeds paired"
  return [error_feedback_row(r, s, row), muon_row(r, s, row),
          two_bit_row(r, s, row), memory_row(r, row), figure4(r, s, row)]


def error_feedback_row(r: dict, s: str, row: dict) -> dict:
  """Claim 1: EF at the paper's beta against off, per compressed setting;
  where compression alone costs loss, EF should win it back. Judged at each
  codec's own tuned outer rate (``EF_TUNED``); the shared-rate pairs of
  every codec are reported beside it."""
  runs = r["runs"]
  shared = ef_effects(runs, [(m, c) for m in METHODS for c in CODECS],
                      lambda m, c, ef: (f"{m} | {c} | EF {ef}" if ef else
                                        f"{m} | {c} | EF off"))
  own = ef_effects(runs, [(m, c) for m in METHODS for c in EF_TUNED],
                   own_label)
  held = not own["hurt"] and not own["missed"]
  return {
      "row": "3.1", "claim": "error feedback consistently improves top-k "
      "and quantized updates", "setting": s + "; EF at the paper's beta vs "
      f"off, each of {', '.join(EF_TUNED)} also at its own outer rate tuned "
      "with EF off and on", "measured": "at each codec's own outer rate: "
      + own["text"] + ". At the float32-tuned outer rate, every codec: "
      + shared["text"],
      "verdict": ("reproduces" if held else "partly" if own["helped"]
                  else "does not"),
      "why": "judged at each codec's own outer rate: 'helped' and 'hurt' "
      "mean a one-sided 95 % bound of the paired difference beyond 0, "
      "'cost' that compression without EF is above float32 the same way; "
      "'reproduces' means EF never hurts and helps wherever compression "
      "alone costs loss. EF's beta is the paper's, not tuned", **row}


def ef_effects(runs: dict, pairs: list, label) -> dict:
  """EF on against off for each (method, codec) of ``pairs`` (``label(m,
  c, beta or 0)`` names the runs): which it helped, hurt, where
  compression alone cost loss and EF did not win it back, and the text."""
  def on(m, c):
    return runs[label(m, c, METHODS[m][1])]

  def off(m, c):
    return runs[label(m, c, 0.0)]
  effect = {q: _report.paired(on(*q), off(*q)) for q in pairs}
  cost = {q: _report.paired(off(*q), runs[f"{q[0]} | fp32"]) for q in pairs}
  helped = [q for q in pairs if effect[q]["high"] < 0]
  hurt = [q for q in pairs if effect[q]["low"] > 0]
  costly = [q for q in pairs if cost[q]["low"] > 0]
  missed = [q for q in costly if q not in helped]
  text = (f"EF helped in {len(helped)}, hurt in {len(hurt)} of {len(pairs)} "
          "(with EF / without - 1: " + "; ".join(
              f"{m} {c} {_report.gap_text(effect[(m, c)])}" for m, c in pairs)
          + f"); compression without EF cost loss in {len(costly)}: "
          + (", ".join(f"{m} {c} {cost[q]['mean']:+.2%}"
                       for q in costly for m, c in [q]) or "none")
          + "; of those EF did not win back: "
          + (", ".join(f"{m} {c}" for m, c in missed) or "none"))
  return {"helped": helped, "hurt": hurt, "missed": missed, "text": text}


def muon_row(r: dict, s: str, row: dict) -> dict:
  runs = r["runs"]
  beta = {m: METHODS[m][1] for m in METHODS}
  labels = ["fp32"] + [f"{c} | EF {{b}}" for c in CODECS]
  gaps = {}
  for lab in labels:
    mu = runs[f"MuLoCo | {lab.format(b=beta['MuLoCo'])}"]
    di = runs[f"DiLoCo | {lab.format(b=beta['DiLoCo'])}"]
    gaps[lab.split(" |")[0]] = _report.paired(mu, di)
  wins = [c for c, g in gaps.items() if g["high"] < 0]
  muon = _report.paired(_report.lanes(runs["MuLoCo | fp32"]),
                        _report.lanes(runs["DiLoCo | fp32"]))
  return {
      "row": "3.2", "claim": "MuLoCo converges to a lower loss than DiLoCo, "
      "with and without compression", "setting": s + "; each codec with "
      "the paper's EF beta; the float32 runs' paired DDP lanes (DDP with "
      "Muon against DDP with AdamW)",
      "measured": f"MuLoCo lower in {len(wins)} of {len(gaps)}; MuLoCo / "
      "DiLoCo - 1: " + "; ".join(f"{c} {_report.gap_text(g)}"
                                 for c, g in gaps.items())
      + f". Muon alone, DDP lanes: {_report.gap_text(muon)}",
      "verdict": _report.verdict(len(wins), len(gaps)),
      "why": "'lower' means the one-sided 95 % upper bound of the paired "
      "relative difference below 0. The lanes say how much of the gap Muon "
      "brings to plain DDP at the same rates", **row}


def two_bit_row(r: dict, s: str, row: dict) -> dict:
  runs, sz = r["runs"], r["sizes"]
  two = runs[TWO_BIT]
  g = _report.paired(two, runs["DiLoCo | fp32"])
  syncs = r["settings"]["steps"] // r["settings"]["H"]
  ratio = sz["bf16"] * syncs / two[0]["payload_bytes"]
  beats = g["high"] < 0
  return {
      "row": "3.3", "claim": "MuLoCo with 2-bit quantization and EF beats "
      "uncompressed DiLoCo while sending 8x less", "setting": s,
      "measured": f"MuLoCo 2-bit+EF {_report.pm(_report.losses(two), 3)} vs DiLoCo "
      f"float32 {_report.pm(_report.losses(runs['DiLoCo | fp32']), 3)}: "
      f"{_report.gap_text(g)}; {ratio:.2f}x fewer bytes than a 16-bit payload",
      "verdict": ("reproduces" if beats and ratio >= 7.5 else
                  "partly" if beats or g["mean"] < 0 else "does not"),
      "why": "'reproduces' means the one-sided 95 % upper bound of the "
      "paired gap below 0 and at least 7.5x fewer bytes than DiLoCo's "
      "pseudo-gradient cast to 16 bits (8x less the 2-bit codes' scales)",
      **row}


def memory_row(r: dict, row: dict) -> dict:
  mem = memory(r)
  excess = ((mem["MuLoCo"]["optimizer"] + mem["MuLoCo"]["ef"])
            / mem["DiLoCo"]["optimizer"] - 1)
  return {
      "row": "3.4", "claim": "MuLoCo with EF has DiLoCo's memory (Muon's one "
      "momentum plus the EF residual = AdamW's two moments)",
      "setting": "lowbw.bench.state_bytes of the runs above",
      "measured": "per worker, in parameter copies: " + "; ".join(
          f"{m}: optimizer {v['optimizer']:.2f}, EF {v['ef']:.2f}"
          for m, v in mem.items()),
      "verdict": ("reproduces" if abs(excess) < 0.01 else "partly"
                  if abs(excess) < 0.25 else "does not"),
      "why": f"MuLoCo + EF keeps {excess:+.0%} against DiLoCo without EF, "
      "counted from the simulator's state: Muon updates the 2-D weight "
      "matrices and an AdamW (two moments) the rest (embeddings, norms, "
      "biases), which Table 1 leaves out", **row}


def figure4(r: dict, s: str, row: dict) -> dict:
  """Top-k against DCT top-k and random-k at equal bytes: each ordering the
  figure shows holds when its paired upper bound is below 0."""
  runs, cells, held, total = r["runs"], [], 0, 0
  for m, (_, beta) in METHODS.items():
    for label in SPARSE:
      t = runs[f"{m} | top-k {label} | EF {beta}"]
      d = runs[f"{m} | DCT top-k ~{label}"]
      rk = runs[f"{m} | random-k ~{label}"]
      first, second = (d, t) if label == "10%" else (t, d)
      checks = [_report.paired(a, b)["high"] < 0
                for a, b in ((first, second), (t, rk), (d, rk))]
      held, total = held + sum(checks), total + len(checks)
      cells.append(f"{m} {label}: DCT / top-k - 1 "
                   f"{_report.gap_text(_report.paired(d, t))}, random-k / top-k - 1 "
                   f"{_report.gap_text(_report.paired(rk, t))}")
  return {"row": "3.5", "claim": "Figure 4: DCT top-k slightly beats top-k "
          "at 10%, top-k beats DCT at 1%, random-k deteriorates fast",
          "setting": s + "; EF at the paper's beta, DCT chunk 128 and "
          "random-k at top-k's exact bytes",
          "measured": "; ".join(cells),
          "verdict": _report.verdict(held, total),
          "why": f"{held} of the {total} orderings the figure shows hold "
          "(per method and size: the DCT/top-k order, random-k above each), "
          "each by a paired one-sided 95 % bound below 0", **row}


def main():
  args = _report.preset_parser(__doc__, PRESETS).parse_args()
  results = _report.results_for(args, CACHE, run_all)
  _report.finish(args, results, "muloco", "muloco_compression", report, plot,
                 rows)


if __name__ == "__main__":
  main()
