"""Do lowbw's fitted laws and the choices they make hold on configurations
the fit did not see?

A study over model sizes and workers is fitted into laws (``lowbw.fit``):
the final eval loss with the joint law y = A N^b M^c (and the power law
y = E + A N^-a + B M^-b) of *Communication-Efficient Language Model Training
Scales Reliably and Robustly: Scaling Laws for DiLoCo* (Charles et al., arXiv
2503.09799), and the simulated time to a target loss with the joint law, per
method. The laws then predict, with bootstrap intervals, a larger model and
W = 8, which are run afterwards:

- the prediction error of the final loss (target: median |error| <= 2 %) and
  of the time to the target loss (target: <= 15 %);
- the regret of the method the time laws pick as fastest to the target on
  each held-out configuration and network, among DDP and DiLoCo at H = 5 and
  10: (time of the pick - time of the best measured) / time of the best
  (target: <= 10 %);
- the scaling-laws paper's two qualitative claims at this scale, paired by
  seed: the gap between DiLoCo and DDP shrinks as the model grows, and
  DiLoCo with one replica (M = 1) beats DDP.

Setting: the digits MLP (one hidden layer of 16, 32 or 64 units; held out:
128) at W in {1, 2, 4} (held out: 8) with 16 examples per worker and step
(the per-worker batch fixed, as the papers hold it), 200 steps with a linear
warm-up of 20 then cosine decay to 0.1x (AdamW), DiLoCo at H = 10 (20 outer
steps) and H = 5 (40), each with its paired DDP lane, and DDP itself. The
inner learning rate (a traced value: one compiled program per shape serves
the whole grid and every seed) is chosen per method and configuration at
seed 100 from a grid of six; verdicts use seeds 0-4. The clock prices each
worker at 4e7 FLOP/s (MFU 0.4; compute and messages both grow with the
model) on two networks re-timed from the same training: 10 Gbit/s and
10 Mbit/s links, 1 ms latency, ring all-reduce.

Every stage is a ``lowbw.study`` under ``experiments/studies/`` (a killed
script resumes); the per-seed results are cached in
``docs/experiments/laws_validation_results.json``; ``--report-only``
rebuilds the report, plot and findings rows from it.

Usage:
  python experiments/laws_validation.py                # 11 min on 2 shared CPU cores
  python experiments/laws_validation.py --report-only
"""

import json
import math
import os
import time
import types

import numpy as np

import _report

COMMAND = "python experiments/laws_validation.py"
NAME = "laws_validation"
CACHE = NAME + "_results.json"
TUNE_SEED = _report.TUNE_SEED
BASE = dict(data="digits", model="mlp", steps=200, batch_size=16,
            eval_examples=359, schedule="cosine", warmup_steps=20,
            min_lr_ratio=0.1, latency="1ms", hardware="4e7FLOPS",
            progress=False)
LRS = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]
NETWORKS = {"10Gbps": "10 Gbit/s", "10Mbps": "10 Mbit/s"}
# Each method's own settings (DiLoCo evaluates at its syncs).
METHODS = {
    "ddp": {"strategy": "ddp", "eval_every": 5},
    "diloco_h5": {"strategy": "diloco", "H": 5, "eval_every": 5,
                  "shadow": "ddp"},
    "diloco_h10": {"strategy": "diloco", "H": 10, "eval_every": 10,
                   "shadow": "ddp"},
}
LABELS = {"ddp": "DDP", "diloco_h5": "DiLoCo H=5", "diloco_h10": "DiLoCo H=10",
          "lane": "DDP lane"}
TRAIN = [(h, w) for h in (16, 32, 64) for w in (1, 2, 4)]
HELD = [(128, 1), (128, 2), (128, 4), (128, 8), (16, 8), (32, 8), (64, 8)]
SEEDS = [0, 1, 2, 3, 4]
TARGETS = {"loss": 0.02, "time": 0.15, "regret": 0.10}
# The time target: this factor times the worst mean final loss of the
# trained configurations (so that every one of them reaches it).
TARGET_MARGIN = 1.1


def grid(configs) -> list[dict]:
  """One sub-grid per method and configuration (hidden, workers): the
  learning rates and networks vary inside it (traced and clock-only)."""
  return [{**{k: [v] for k, v in m.items()}, "hidden": [str(h)],
           "workers": [w], "inner_lr": LRS, "bandwidth": list(NETWORKS)}
          for m in METHODS.values() for h, w in configs]


def method_of(values: dict) -> str:
  return next(name for name, m in METHODS.items()
              if all(values.get(k) == v for k, v in m.items()))


def run_phase(name: str, configs, seeds) -> tuple[list[dict], float]:
  """Every point of one phase's study as a compact row (method, hidden,
  workers, lr, network, seed, final losses, curve), and the compute
  seconds its points took."""
  import lowbw
  study = lowbw.study(BASE, grid(configs), list(seeds),
                      out=os.path.join(_report.STUDIES, name),
                      progress=False, plots=False)
  rows = []
  for p in study.points:
    h, s = p.history, p.summary
    at = ~np.isnan(h["eval_loss"])
    rows.append({
        "method": method_of(p.values), "hidden": int(p.values["hidden"]),
        "workers": p.values["workers"], "lr": p.values["inner_lr"],
        "network": p.values["bandwidth"], "seed": p.seed,
        "params": s["num_params"], "loss": s.get("final_eval_loss"),
        "lane": s.get("final_shadow_eval_loss"), "error": s.get("error"),
        "curve": {"eval_loss": [_sig(x) for x in h["eval_loss"][at]],
                  "sim_time_s": [_sig(x) for x in h["sim_time_s"][at]]}})
  return rows, _report.compute_seconds(study.points)


def _sig(x) -> float:
  return float(f"{float(x):.6g}")


def compact(rows: list[dict]) -> list[dict]:
  """The rows to cache: those ``choices`` reads (seed ``TUNE_SEED`` on the
  first network, without curves) and the verdict seeds' at the rates chosen
  (curves for the methods' own, the final losses for the lane's)."""
  chosen, first = choices(rows), next(iter(NETWORKS))
  out = []
  for r in rows:
    own = r["lr"] == chosen.get((r["method"], r["hidden"], r["workers"]))
    lane = r["lr"] == chosen.get(("lane", r["hidden"], r["workers"]))
    if r["seed"] == TUNE_SEED:
      keep = r["network"] == first
    else:
      keep = own or (lane and r["network"] == first)
    if keep:
      out.append({k: v for k, v in r.items() if k != "curve" or (
          own and r["seed"] != TUNE_SEED)})
  return out


def run_all(args, cache_path: str) -> dict:
  """The training study, then the held-out one (each resumable)."""
  started = time.time()
  seeds = [TUNE_SEED] + list(args.seeds)
  train, t1 = run_phase(NAME + "_train", TRAIN, seeds)
  held, t2 = run_phase(NAME + "_heldout", HELD, seeds)
  results = {"settings": {"base": BASE, "lrs": LRS, "methods": METHODS,
                          "networks": NETWORKS, "seeds": list(args.seeds),
                          "train": TRAIN, "held": HELD},
             "train": compact(train), "held": compact(held),
             "compute_seconds": t1 + t2,
             "script_seconds": time.time() - started}
  # One line per point row: the curves would take a line per number.
  with open(cache_path, "w") as f:
    f.write(dumps(results))
  return results


def dumps(results: dict) -> str:
  """The cache as JSON with one line per row of a phase."""
  head = {k: v for k, v in results.items() if k not in ("train", "held")}
  text = json.dumps(head, indent=1)[:-2]
  for phase in ("train", "held"):
    text += f',\n "{phase}": [\n' + ",\n".join(
        json.dumps(r) for r in results[phase]) + "\n ]"
  return text + "\n}\n"


# ------------------------------------------------------------- selection

def choices(rows: list[dict]) -> dict:
  """(method, hidden, workers) -> the learning rate with the lowest final
  eval loss at seed ``TUNE_SEED`` (on the first network: the clock does not
  change training); ("lane", hidden, workers) -> the rate the DDP lanes of
  DiLoCo H=10 do best at."""
  first = next(iter(NETWORKS))
  best: dict = {}
  for r in rows:
    if r["seed"] != TUNE_SEED or r["network"] != first:
      continue
    cands = [(r["method"], r["loss"])]
    if r["method"] == "diloco_h10":
      cands.append(("lane", r["lane"]))
    for method, loss in cands:
      key = (method, r["hidden"], r["workers"])
      if loss is not None and math.isfinite(loss) and (
          key not in best or loss < best[key][1]):
        best[key] = (r["lr"], loss)
  return {k: v[0] for k, v in best.items()}


def edges(rows: list[dict]) -> list[tuple]:
  """The choices at an end of the learning-rate grid (rule 4)."""
  return [(k, lr) for k, lr in choices(rows).items()
          if lr in (min(LRS), max(LRS))]


def seeded(rows: list[dict], method: str, network: str | None = None
           ) -> dict:
  """(hidden, workers) -> the verdict seeds' rows at the chosen rate
  (``method`` "lane": the DDP lane of DiLoCo H=10, its loss as ``loss``)."""
  chosen = choices(rows)
  network = network or next(iter(NETWORKS))
  source = "diloco_h10" if method == "lane" else method
  out: dict = {}
  for r in rows:
    key = (method, r["hidden"], r["workers"])
    if (r["method"] == source and r["network"] == network
        and r["seed"] != TUNE_SEED and r["lr"] == chosen.get(key)
        and r["lane" if method == "lane" else "loss"] is not None):
      row = dict(r, loss=r["lane"]) if method == "lane" else r
      out.setdefault((r["hidden"], r["workers"]), []).append(row)
  return {k: sorted(v, key=lambda r: r["seed"]) for k, v in out.items()}


# ------------------------------------------------------------------ laws

X = ["params", "workers"]
LOSS, TIME = "final_eval_loss", "time_to_target_s"


def target_loss(results: dict) -> float:
  """The time target: ``TARGET_MARGIN`` x the worst mean final eval loss
  of any method at any trained configuration (fixed before the held-out
  configurations are read)."""
  worst = max(float(np.mean([r["loss"] for r in runs]))
              for m in METHODS
              for runs in seeded(results["train"], m).values())
  return TARGET_MARGIN * worst


def time_to(run: dict, target: float):
  """Simulated seconds to the target eval loss (interpolated between
  evaluations); None when the run never reaches it."""
  return _report.reach(run["curve"], target, "sim_time_s")


def view(by_config: dict, y: str, value) -> types.SimpleNamespace:
  """What ``lowbw.fit`` reads from a study (``points`` with ``values``,
  ``summary``, ``seed``, ``index``), built from the chosen seeds' rows:
  each configuration at its own tuned rate, and a figure computed from the
  curves (the time to a target), neither of which a study's points give."""
  points = []
  for (_, w), runs in sorted(by_config.items()):
    for r in runs:
      v = value(r)
      if v is not None:
        points.append(types.SimpleNamespace(
            index=len(points), seed=r["seed"], config=None,
            values={"num_params": r["params"], "workers": w},
            summary={y: v}))
  return types.SimpleNamespace(points=points)


# The power law (five parameters, non-linear) for every method and the
# lane, with as many bootstrap draws as the joint law: its refits start
# from the fit they resample, so a floor E the data cannot pin down costs
# seconds, not minutes.
POWER, POWER_DRAWS = (*METHODS, "lane"), 200


def fits(results: dict) -> dict:
  """(kind, method, form, network) -> the law fitted on the trained
  configurations: final loss (joint; power for ``POWER``; DDP lane
  included) and time to the target on each network (joint)."""
  import lowbw
  out, target = {}, target_loss(results)
  for m in [*METHODS, "lane"]:
    by = seeded(results["train"], m)
    for form in ("joint", "power") if m in POWER else ("joint",):
      out[("loss", m, form, None)] = lowbw.fit(
          view(by, LOSS, lambda r: r["loss"]), X, y=LOSS, form=form, seed=0,
          bootstrap=POWER_DRAWS if form == "power" else 200)
  for m in METHODS:
    for net in NETWORKS:
      by = seeded(results["train"], m, net)
      out[("time", m, "joint", net)] = lowbw.fit(
          view(by, TIME, lambda r: time_to(r, target)), X, y=TIME,
          form="joint", seed=0)
  return out


def measured(runs: list[dict], kind: str, target: float) -> dict:
  """Mean, std (ddof 0) and standard error over seeds of the final loss or
  of the time to the target (None when a seed never reaches it)."""
  vals = [r["loss"] if kind == "loss" else time_to(r, target) for r in runs]
  if any(v is None for v in vals):
    return {"mean": None, "std": None, "sem": None, "n": len(vals)}
  v = np.asarray(vals, float)
  return {"mean": float(v.mean()), "std": float(v.std()),
          "sem": float(v.std(ddof=1) / math.sqrt(len(v))), "n": len(v)}


def validation(results: dict, laws: dict) -> list[dict]:
  """Every law's prediction at every held-out configuration, against what
  the configuration measured."""
  target, out = target_loss(results), []
  for (kind, m, form, net), law in laws.items():
    for (h, w), runs in sorted(seeded(results["held"], m, net).items()):
      n = runs[0]["params"]
      p = law.predict({"params": n, "workers": w})[0]
      got = measured(runs, kind, target)
      err = None if got["mean"] is None else p[law.y] / got["mean"] - 1
      out.append({"kind": kind, "method": m, "form": form, "network": net,
                  "hidden": h, "workers": w, "params": n,
                  "predicted": p[law.y], "low": p["low"], "high": p["high"],
                  **{f"measured_{k}": v for k, v in got.items()},
                  "error": err, "inside": None if err is None else
                  p["low"] <= got["mean"] <= p["high"]})
  return out


def noise(rows: list[dict], kind: str, m: str, net, target: float) -> float:
  """The median over the trained configurations of the seeds' relative
  standard error of the mean: the residual a perfect law would still show."""
  sems = []
  for runs in seeded(rows, m, net).values():
    got = measured(runs, kind, target)
    if got["mean"]:
      sems.append(got["sem"] / got["mean"])
  return float(np.median(sems)) if sems else math.nan


def summary(results: dict, laws: dict, checked: list[dict]) -> list[dict]:
  """Per law: median and max |prediction error| over the held-out
  configurations, how many fall inside their interval, the law's own
  residual on the trained ones and the seeds' noise there."""
  target, out = target_loss(results), []
  for (kind, m, form, net), law in laws.items():
    rows = [c for c in checked if (c["kind"], c["method"], c["form"],
                                   c["network"]) == (kind, m, form, net)]
    errs = [abs(c["error"]) for c in rows if c["error"] is not None]
    out.append({"kind": kind, "method": m, "form": form, "network": net,
                "median_abs_error": float(np.median(errs)) if errs else None,
                "max_abs_error": float(max(errs)) if errs else None,
                "inside": sum(bool(c["inside"]) for c in rows),
                "measured": len(errs), "configs": len(rows),
                "residual": law.quality()["median_rel_residual"],
                "noise": noise(results["train"], kind, m, net, target),
                "held_noise": float(np.median(
                    [c["measured_sem"] / c["measured_mean"] for c in rows
                     if c["measured_mean"]])) if errs else None,
                "params": law.params, "intervals": law.intervals})
  return out


def regrets(results: dict, laws: dict) -> list[dict]:
  """On each held-out configuration and network: the method the time laws
  predict fastest to the target, the fastest measured, and the regret."""
  target, out = target_loss(results), []
  for net in NETWORKS:
    for h, w in HELD:
      pred, got = {}, {}
      for m in METHODS:
        runs = seeded(results["held"], m, net)[(h, w)]
        law = laws[("time", m, "joint", net)]
        pred[m] = law.predict({"params": runs[0]["params"],
                               "workers": w})[0][TIME]
        got[m] = measured(runs, "time", target)["mean"]
      pick = min(pred, key=pred.get)
      reached = {m: t for m, t in got.items() if t is not None}
      best = min(reached, key=reached.get) if reached else None
      regret = (got[pick] / reached[best] - 1 if best and got[pick]
                is not None else None)
      out.append({"network": net, "hidden": h, "workers": w,
                  "predicted": pred, "measured": got, "pick": pick,
                  "best": best, "regret": regret})
  return out


# ---------------------------------------------------------------- claims

def gaps(results: dict) -> dict:
  """(hidden, workers) -> DiLoCo H=10 against the DDP lane, each at its
  own tuned rate, paired by seed (trained and held-out configurations)."""
  out = {}
  for phase in ("train", "held"):
    dil = seeded(results[phase], "diloco_h10")
    lane = seeded(results[phase], "lane")
    for key in dil:
      out[key] = _report.paired(dil[key], lane[key], key="loss")
  return dict(sorted(out.items()))


def size_claim(g: dict) -> dict:
  """Per W: the mean gap at each size; whether it ends lower than it
  starts and whether it falls at every step of size."""
  out = {}
  for w in sorted({w for _, w in g}):
    sizes = sorted(h for h, x in g if x == w)
    means = [g[(h, w)]["mean"] for h in sizes]
    out[w] = {"sizes": sizes, "means": means, "ends_lower": means[-1] <
              means[0], "falls": all(b < a for a, b in zip(means,
                                                           means[1:]))}
  return out


def analyse(results: dict) -> dict:
  """Everything the report, plot and rows read, from the cached rows."""
  laws = fits(results)
  checked = validation(results, laws)
  g = gaps(results)
  return {"laws": laws, "checked": checked,
          "summary": summary(results, laws, checked),
          "regrets": regrets(results, laws), "gaps": g,
          "sizes": size_claim(g), "target": target_loss(results),
          "edges": edges(results["train"]) + edges(results["held"]),
          "params": {r["hidden"]: r["params"] for phase in ("train", "held")
                     for r in results[phase]}}


def _law_row(s: dict) -> str:
  net = f" ({NETWORKS[s['network']]})" if s["network"] else ""
  params = ", ".join(f"{k} {v:.3g} [{s['intervals'][k][0]:.3g}, "
                     f"{s['intervals'][k][1]:.3g}]"
                     for k, v in s["params"].items())
  med = ("-" if s["median_abs_error"] is None else
         f"{s['median_abs_error']:.1%}")
  mx = "-" if s["max_abs_error"] is None else f"{s['max_abs_error']:.1%}"
  held = "-" if s["held_noise"] is None else f"{s['held_noise']:.1%}"
  return (f"| {s['kind']} | {LABELS[s['method']]}{net} | {s['form']} | "
          f"{params} | {s['residual']:.1%} | {s['noise']:.1%} | {med} | "
          f"{mx} | {held} | {s['inside']} of {s['measured']} |")


def _check_row(c: dict) -> str:
  fmt = "{:.4f}" if c["kind"] == "loss" else "{:.2f}"
  got = ("not reached" if c["measured_mean"] is None else
         f"{fmt.format(c['measured_mean'])} ± {fmt.format(c['measured_std'])}")
  err = "-" if c["error"] is None else f"{c['error']:+.1%}"
  net = NETWORKS[c["network"]] if c["network"] else "-"
  return (f"| {c['kind']} | {LABELS[c['method']]} | {c['form']} | {net} | "
          f"{c['hidden']} ({c['params']:,}) | {c['workers']} | "
          f"{fmt.format(c['predicted'])} [{fmt.format(c['low'])}, "
          f"{fmt.format(c['high'])}] | {got} | {err} |")


def _regret_row(r: dict) -> str:
  cells = " | ".join(
      f"{r['predicted'][m]:.2f} / " + ("-" if r["measured"][m] is None else
                                      f"{r['measured'][m]:.2f}")
      for m in METHODS)
  reg = "-" if r["regret"] is None else f"{r['regret']:+.1%}"
  return (f"| {NETWORKS[r['network']]} | {r['hidden']} | {r['workers']} | "
          f"{cells} | {LABELS[r['pick']]} | "
          f"{LABELS[r['best']] if r['best'] else '-'} | {reg} |")


def headline(a: dict, kind: str, form: str = "joint") -> dict:
  """Median |error| per law of ``kind`` (and ``form``) and over all of
  their held-out configurations."""
  rows = [s for s in a["summary"] if s["kind"] == kind and s["form"] == form]
  errs = [abs(c["error"]) for c in a["checked"] if c["kind"] == kind and
          c["form"] == form and c["error"] is not None]
  return {"per_law": rows, "median": float(np.median(errs)),
          "max": float(max(errs)), "n": len(errs),
          "missing": sum(1 for c in a["checked"] if c["kind"] == kind and
                         c["form"] == form and c["error"] is None)}


def report(results: dict, a: dict) -> str:
  s = results["settings"]
  lines = [
      "# Fitted laws and their advice on configurations the fit did not see",
      "", f"Generated by `{COMMAND}`.", "",
      "Trained (the fit): the digits MLP with one hidden layer of "
      f"{', '.join(str(h) for h in sorted({h for h, _ in TRAIN}))} units at W "
      f"in {sorted({w for _, w in TRAIN})}; held out: "
      + ", ".join(f"({h}, W={w})" for h, w in HELD) + ". "
      f"{BASE['steps']} steps of {BASE['batch_size']} examples per worker, a "
      f"{BASE['warmup_steps']}-step warm-up then cosine to "
      f"{BASE['min_lr_ratio']}x (AdamW); DiLoCo H=5 (40 outer steps) and "
      "H=10 (20), each with its paired DDP lane, and DDP. Inner learning "
      f"rate per method and configuration from {LRS} at seed {TUNE_SEED}; "
      f"seeds {s['seeds']} for everything below. Clock: each worker "
      f"{BASE['hardware']} at MFU 0.4, links of "
      f"{' or '.join(NETWORKS.values())} with {BASE['latency']} latency, "
      "ring all-reduce (the networks re-time the same training).", "",
      f"Compute: {results['compute_seconds'] / 60:.1f} min of compiling and "
      f"running (summed over the studies' points), "
      f"{results['script_seconds'] / 60:.1f} min of wall time for the "
      "script on a 2-core CPU shared with other jobs.", ""]
  lines += _rate_lines(results, a) + _law_lines(a) + _check_lines(a)
  lines += _regret_lines(a) + _claim_lines(a) + _fit_notes()
  return "\n".join(lines) + "\n"


def _rate_lines(results: dict, a: dict) -> list[str]:
  out = ["## Learning rates chosen (seed 100)", "",
         "| method | " + " | ".join(f"{h}, W={w}" for h, w in TRAIN + HELD)
         + " |", "| --- |" + " --- |" * len(TRAIN + HELD)]
  chosen = {**choices(results["train"]), **choices(results["held"])}
  for m in [*METHODS, "lane"]:
    out.append(f"| {LABELS[m]} | " + " | ".join(
        f"{chosen[(m, h, w)]:g}" for h, w in TRAIN + HELD) + " |")
  at_edge = ", ".join(f"{LABELS[k[0]]} ({k[1]}, W={k[2]}): {lr:g}"
                      for k, lr in a["edges"])
  out += ["", "Rule 4 (optimum inside the grid): " + (
      f"at an end of the grid: {at_edge}." if at_edge else
      "every choice is inside."), ""]
  return out


def _law_lines(a: dict) -> list[str]:
  return ["## The laws and their errors", "",
          "Residual: the law's median |relative residual| on the trained "
          "configurations (means over seeds); seed noise: the median "
          "relative standard error of those means (what a perfect law "
          "would still show), then the same on the held-out ones. Errors: "
          "predicted / measured - 1 over the held-out configurations; "
          "inside: measured means inside the law's 90 % bootstrap "
          f"interval. Time target: eval loss {a['target']:.4f} "
          f"({TARGET_MARGIN}x the worst trained final loss).", "",
          "| figure | method | law | parameters [90 % interval] | residual "
          "| seed noise (trained) | median \\|error\\| | max \\|error\\| | "
          "seed noise (held out) | inside |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"] + [
              _law_row(s) for s in a["summary"]] + [""]


def _check_lines(a: dict) -> list[str]:
  return ["## Every held-out prediction", "",
          "| figure | method | law | network | hidden (parameters) | W | "
          "predicted [90 %] | measured (mean ± std) | error |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"] + [
              _check_row(c) for c in a["checked"]] + [""]


def _regret_lines(a: dict) -> list[str]:
  regs = [r["regret"] for r in a["regrets"] if r["regret"] is not None]
  return ["## Regret of the method the time laws pick", "",
          "Simulated seconds to the target loss, predicted / measured (mean "
          "over seeds); regret = measured time of the pick / the fastest "
          f"measured - 1. Median {np.median(regs):+.1%}, max "
          f"{max(regs):+.1%} over {len(regs)} cases (target <= "
          f"{TARGETS['regret']:.0%}).", "",
          "| network | hidden | W | " + " | ".join(
              LABELS[m] for m in METHODS) + " | pick | fastest | regret |",
          "| --- | --- | --- |" + " --- |" * (len(METHODS) + 3)] + [
              _regret_row(r) for r in a["regrets"]] + [""]


def _claim_lines(a: dict) -> list[str]:
  sizes = sorted({h for h, _ in a["gaps"]})
  out = ["## The scaling-laws paper's two claims (DiLoCo H=10 against DDP)",
         "", "DiLoCo / DDP lane - 1 of the final eval loss, each at its own "
         "tuned rate, paired by seed: mean [one-sided 95 % bounds].", "",
         "| W | " + " | ".join(f"hidden {h}" for h in sizes) +
         " | falls at every size | ends lower |",
         "| --- |" + " --- |" * (len(sizes) + 2)]
  for w, c in a["sizes"].items():
    cells = [_report.gap_text(a["gaps"][(h, w)]) if (h, w) in a["gaps"]
             else "-" for h in sizes]
    out.append(f"| {w} | " + " | ".join(cells) +
               f" | {'yes' if c['falls'] else 'no'} | "
               f"{'yes' if c['ends_lower'] else 'no'} |")
  return out + [""]


def _fit_notes() -> list[str]:
  return [
      "## What `lowbw.fit` could not do directly", "",
      "`lowbw.fit(study, ..., where=...)` keeps the points a dict of values "
      "or a function chooses (each combination at its own tuned learning "
      "rate, say), but `y` must be a figure of the points' summaries, so a "
      "figure computed from the curves (the simulated time to a target "
      "loss) cannot be fitted from a study. This script's runs are cached "
      "rows, not a study's folder: it passes `lowbw.fit` an object with the "
      "`points` it reads (`values`, `summary`, `seed`, `index`), built from "
      "the chosen rows (`view`).", ""]


# ------------------------------------------------------------ plot, rows

def plot(a: dict, path: str) -> None:
  """Predicted against measured (final loss; time to the target), the
  held-out configurations with their 90 % intervals; and the paired gap of
  DiLoCo H=10 to DDP against parameters, one line per W."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
  marks = {None: "o", "10Gbps": "o", "10Mbps": "s"}
  for ax, kind in zip(axes[:2], ("loss", "time")):
    for i, m in enumerate(METHODS):
      for net in ([None] if kind == "loss" else list(NETWORKS)):
        rows = [c for c in a["checked"] if c["kind"] == kind and
                c["method"] == m and c["form"] == "joint" and
                c["network"] == net and c["measured_mean"] is not None]
        if not rows:
          continue
        got = np.array([c["measured_mean"] for c in rows])
        pred = np.array([c["predicted"] for c in rows])
        err = [pred - np.array([c["low"] for c in rows]),
               np.array([c["high"] for c in rows]) - pred]
        ax.errorbar(got, pred, yerr=err, fmt=marks[net], color=f"C{i}",
                    capsize=2, ms=4, label=LABELS[m] + (
                        f", {NETWORKS[net]}" if net else ""))
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
    what = "final eval loss" if kind == "loss" else "simulated s to target"
    ax.set(xscale="log", yscale="log", xlabel=f"measured {what}",
           ylabel="joint law's prediction (90 % interval)")
    for axis in (ax.xaxis, ax.yaxis):
      axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
  _plot_gaps(axes[2], a)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _plot_gaps(ax, a: dict) -> None:
  params = a["params"]
  for i, (w, c) in enumerate(a["sizes"].items()):
    g = [a["gaps"][(h, w)] for h in c["sizes"]]
    n = [params[h] for h in c["sizes"]]
    mean = np.array([x["mean"] for x in g]) * 100
    low = np.array([x["low"] for x in g]) * 100
    high = np.array([x["high"] for x in g]) * 100
    ax.errorbar(n, mean, yerr=[mean - low, high - mean], marker="o",
                capsize=3, color=f"C{i}", label=f"W={w}")
  ax.axhline(0, color="k", lw=0.8)
  ax.set(xscale="log", xlabel="parameters",
         ylabel="DiLoCo H=10 / DDP - 1 (%), one-sided 95 % bounds")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)


def _setting(results: dict) -> str:
  return (f"digits MLP, hidden {'/'.join(str(h) for h in (16, 32, 64))} at "
          f"W in {{1, 2, 4}} fitted; held out hidden 128 (W 1-8) and W=8 "
          f"(every size): {len(HELD)} configurations; {BASE['steps']} steps x "
          f"{BASE['batch_size']} examples per worker, warm-up + cosine, "
          "DiLoCo H=5 and H=10 with paired DDP lanes, and DDP; inner lr "
          f"tuned per method and configuration at seed {TUNE_SEED}; "
          f"{len(results['settings']['seeds'])} seeds")


def finding_rows(results: dict, a: dict) -> list[dict]:
  """Rows 10.1-10.5 of the findings table."""
  common = {"plot": NAME + ".png", "command": COMMAND,
            "setting": _setting(results)}
  loss = headline(a, "loss")
  ok = sum(s["median_abs_error"] <= TARGETS["loss"] for s in loss["per_law"])
  cells = "; ".join(f"{LABELS[s['method']]} {s['median_abs_error']:.1%} "
                    f"(residual {s['residual']:.1%}, seed noise "
                    f"{s['noise']:.1%})" for s in loss["per_law"])
  rows = [{**common, "row": "10.1", "source": "Scaling laws for DiLoCo "
           "(arXiv 2503.09799)", "claim": "a joint power law in model size N "
           "and replicas M fitted on smaller runs predicts the final loss of "
           "larger ones", "measured": f"median |error| of the joint law on "
           f"{loss['n']} held-out predictions {loss['median']:.1%} (max "
           f"{loss['max']:.1%}); per method: {cells}",
           "verdict": _report.verdict(ok, len(loss["per_law"])),
           "why": f"'reproduces' means a median |error| <= "
           f"{TARGETS['loss']:.0%} for every method's law ({ok} of "
           f"{len(loss['per_law'])}); the residual on the fitted runs against "
           "the seeds' standard error says whether noise or the law bounds "
           "the error"}]
  return rows + _time_rows(a, common) + _claim_rows(a, common)


def _time_rows(a: dict, common: dict) -> list[dict]:
  t = headline(a, "time")
  ok = sum(s["median_abs_error"] is not None and s["median_abs_error"] <=
           TARGETS["time"] for s in t["per_law"])
  cells = "; ".join(
      f"{LABELS[s['method']]} {NETWORKS[s['network']]} "
      + ("-" if s["median_abs_error"] is None else
         f"{s['median_abs_error']:.1%}") for s in t["per_law"])
  regs = [r["regret"] for r in a["regrets"] if r["regret"] is not None]
  small = sum(r <= TARGETS["regret"] for r in regs)
  picks = sum(r["pick"] == r["best"] for r in a["regrets"])
  return [
      {**common, "row": "10.2", "source": "lowbw.fit on the simulated clock",
       "claim": "a joint law in N and M of the simulated time to a target "
       f"loss predicts it within {TARGETS['time']:.0%} on larger models and "
       "more workers", "measured": f"target eval loss {a['target']:.3f}; "
       f"median |error| {t['median']:.1%} (max {t['max']:.1%}) over "
       f"{t['n']} predictions ({t['missing']} not reached); per law: {cells}",
       **_report.assumption(ok, len(t["per_law"]), "'holds' means a median "
                            f"|error| <= {TARGETS['time']:.0%} per method and "
                            "network")},
      {**common, "row": "10.3", "source": "lowbw.fit on the simulated clock",
       "claim": "the method the time laws predict fastest to the target is "
       f"within {TARGETS['regret']:.0%} of the fastest measured",
       "measured": f"{picks} of {len(a['regrets'])} picks were the fastest; "
       f"regret median {np.median(regs):+.1%}, max {max(regs):+.1%} (DDP, "
       "DiLoCo H=5, H=10 on 7 held-out configurations x 2 networks)",
       **_report.assumption(small, len(regs), "'holds' means a regret <= "
                            f"{TARGETS['regret']:.0%}")}]


def _claim_rows(a: dict, common: dict) -> list[dict]:
  sizes = a["sizes"]
  lower = sum(c["ends_lower"] for c in sizes.values())
  falls = sum(c["falls"] for c in sizes.values())
  one = [(h, g) for (h, w), g in a["gaps"].items() if w == 1]
  beats = sum(g["high"] < 0 for _, g in one)
  src = "Scaling laws for DiLoCo (arXiv 2503.09799)"
  return [
      {**common, "row": "10.4", "source": src, "claim": "the gap between "
       "DiLoCo and DDP shrinks as the model grows", "measured": "; ".join(
           f"W={w}: " + ", ".join(f"{h} {m:+.1%}" for h, m in
                                  zip(c["sizes"], c["means"]))
           for w, c in sizes.items()),
       "verdict": _report.verdict(lower, len(sizes)),
       "why": f"'reproduces' means the mean paired gap (DiLoCo H=10 over the "
       f"DDP lane, each at its tuned rate) ends lower at hidden 128 than at "
       f"16 at every W ({lower} of {len(sizes)}; it falls at every size at "
       f"{falls})"},
      {**common, "row": "10.5", "source": src, "claim": "DiLoCo with one "
       "replica (M=1) reaches a lower loss than DDP", "measured": ", ".join(
           f"hidden {h}: {_report.gap_text(g)}" for h, g in one),
       "verdict": _report.verdict(beats, len(one)),
       "why": "'reproduces' means the one-sided 95 % upper bound of DiLoCo "
       f"H=10 / DDP - 1 below 0 at every size ({beats} of {len(one)}), each "
       "at its own tuned inner rate (the outer step is DiLoCo's default, "
       "0.7 with Nesterov 0.9, not tuned for M=1)"}]


def main():
  args = _report.parser(__doc__).parse_args()
  results = _report.results_for(args, CACHE, run_all)
  a = analyse(results)
  text = report(results, a)
  _report.write_report(os.path.join(args.out, NAME + ".md"), text)
  plot(a, os.path.join(args.out, NAME + ".png"))
  if os.path.abspath(args.out) == os.path.abspath(_report.DOCS):
    _report.publish(NAME, finding_rows(results, a),
                    results["script_seconds"] / 60)
  print(text)
  print(json.dumps({"minutes": round(results["script_seconds"] / 60, 1)}))


if __name__ == "__main__":
  main()
