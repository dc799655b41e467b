"""What every experiment's report does: write the generated part, keep the
hand-written reading below it; run configurations resumably, caching each
one's results as JSON."""

import json
import os
import statistics
import time

HAND_WRITTEN = "## Reading (written by hand"


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOCS = os.path.join(ROOT, "docs", "experiments")


def ints(text: str) -> list[int]:
  """A comma-separated list of integers (``--seeds 0,1,2``)."""
  return [int(x) for x in text.split(",")]


def parser(doc: str):
  """An argument parser with the options every findings script takes:
  ``--seeds``, ``--out`` and ``--report-only``."""
  import argparse
  p = argparse.ArgumentParser(description=doc.split("\n")[0])
  p.add_argument("--seeds", type=ints, default=[0, 1, 2])
  p.add_argument("--out", default=DOCS)
  p.add_argument("--report-only", action="store_true",
                 help="rebuild the report and rows from the cached runs")
  return p


def preset_parser(doc: str, presets: dict):
  """``parser(doc)`` with ``--preset`` (one of ``presets``, default cpu)."""
  p = parser(doc)
  p.add_argument("--preset", choices=sorted(presets), default="cpu")
  return p


def finish(args, results: dict, name: str, script: str, report, plot,
           rows) -> None:
  """Writes ``report(results)`` to ``NAME.md`` (keeping its hand-written
  reading) and ``plot`` to ``NAME.png`` in ``args.out``; when that is
  docs/experiments, publishes ``rows(results)`` with the compute the runs
  took (``results["compute_seconds"]``)."""
  write_report(os.path.join(args.out, name + ".md"), report(results))
  plot(results, os.path.join(args.out, name + ".png"))
  if os.path.abspath(args.out) == os.path.abspath(DOCS):
    publish(script, rows(results), results["compute_seconds"] / 60)


def publish_rows(args, script: str, results: dict, rows) -> None:
  """``publish(script, rows())`` with the compute the cached runs took,
  when the report went to docs/experiments (not for a trial ``--out``)."""
  if os.path.abspath(args.out) == os.path.abspath(DOCS):
    minutes = sum(r.get("seconds", 0) for r in results.values()) / 60
    publish(script, rows(), minutes)


def write_report(path: str, generated: str) -> None:
  """Writes ``generated`` to ``path``, keeping a section that starts with
  ``HAND_WRITTEN`` (a reading of the results) from the file already there."""
  kept = ""
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
    if HAND_WRITTEN in text:
      kept = "\n" + text[text.index(HAND_WRITTEN):]
  with open(path, "w") as f:
    f.write(generated.rstrip("\n") + "\n" + kept)


def axes(figsize=(7, 4.5)):
  """A figure and its axes, drawn off screen (no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt.subplots(figsize=figsize)


def save_plot(fig, ax, path: str, xlabel: str, ylabel: str,
              legend_size: int = 8) -> None:
  """The reports' common finish: log x axis, labels, legend, grid, PNG."""
  ax.set_xscale("log")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=legend_size)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def run_resumable(cache_path: str, configs, run, metric: str) -> dict:
  """Runs every ``(label, *args)`` of ``configs`` not cached yet as
  ``run(*args)`` (a dict with ``runs``, one entry per seed holding
  ``metric``), saving the cache after each, so a killed script resumes."""
  results = {}
  if os.path.exists(cache_path):
    with open(cache_path) as f:
      results = json.load(f)
  todo = [c for c in configs if c[0] not in results]
  for i, (label, *args) in enumerate(todo):
    start = time.time()
    results[label] = run(*args)
    vals = [r[metric] for r in results[label]["runs"]
            if r.get(metric) is not None]
    shown = f"{metric} {statistics.mean(vals):.4f}" if vals else ""
    print(f"[{i + 1}/{len(todo)}] {label:32s} {shown}  "
          f"{time.time() - start:5.0f} s", flush=True)
    with open(cache_path, "w") as f:
      json.dump(results, f, indent=1)
  return results


def results_for(args, cache_name: str, run_all) -> dict:
  """The cached results with ``--report-only``, else ``run_all(args,
  cache_path)``; the output folder is made first."""
  os.makedirs(args.out, exist_ok=True)
  cache = os.path.join(args.out, cache_name)
  if args.report_only:
    with open(cache) as f:
      return json.load(f)
  return run_all(args, cache)


def main(doc: str, seeds, cache_name: str, run_all, name: str, report, plot,
         findings) -> None:
  """An experiment's command line: its parser (``doc``, default ``seeds``),
  the results (cached or run), then the report, plot and findings rows of
  ``name``."""
  parser_ = parser(doc)
  parser_.set_defaults(seeds=seeds)
  args = parser_.parse_args()
  results = results_for(args, cache_name, run_all)
  finish(args, results, name, name, report, plot, findings)


# ------------------------------------------------------------------ seeds

CURVE = ("step", "tokens", "eval_loss", "eval_cross_entropy", "sim_time_s",
         "payload_bytes", "sent_bytes")


# Studies' folders (each point's logs; what a killed script resumes from).
STUDIES = os.path.join(ROOT, "experiments", "studies")


def seeded(build_args, seeds, grid=None) -> list[dict]:
  """Every seed (and grid point) of one build through ``lowbw.sweep``: per
  point its values, seed, summary figures and eval-loss curve (rows with an
  evaluation), plain JSON."""
  import lowbw
  result = lowbw.sweep(build_args, grid=grid, seeds=list(seeds),
                       progress=False)
  return [_entry(p.values, p.seed, p.history, p.summary)
          for p in result.points]


def studied(name: str, base, grid, seeds) -> tuple[list[dict], float]:
  """Every point of ``lowbw.study(base, grid, seeds)`` as ``seeded``'s
  entries, and the compute seconds they took (compiling and running, summed
  over points). The study's folder is ``experiments/studies/NAME``: a
  killed script started again skips the points that finished."""
  import lowbw

  def show(point):
    loss = point.summary.get("final_eval_loss")
    print(f"  point {point.index}: {point.values}, seed {point.seed}: "
          + (f"eval loss {loss:.4f}" if loss is not None else "failed"),
          flush=True)

  result = lowbw.study(base, grid, list(seeds),
                       out=os.path.join(STUDIES, name), progress=False,
                       plots=False, on_point=show)
  seconds = compute_seconds(result.points)
  return [_entry(p.values, p.seed, p.history, p.summary)
          for p in result.points], seconds


def labelled_study(name: str, base, points: dict,
                   seeds) -> tuple[dict, float]:
  """``studied`` over ``points`` (label -> one point's values, an irregular
  grid): label -> its runs (matched on the exact values), and the compute
  seconds."""
  grid = [{k: [v] for k, v in values.items()} for values in points.values()]
  runs, seconds = studied(name, base, grid, seeds)
  return {label: [r for r in runs if r["values"] == values]
          for label, values in points.items()}, seconds


def point_entry(point) -> dict:
  """One study point (a ``PointResult``) as ``seeded``'s entry, with
  ``retimed``: whether the study re-timed it from another point's ledger
  rather than training it."""
  return {**_entry(point.values, point.seed, point.history, point.summary),
          "retimed": bool(point.summary.get("retimed_from"))}


def _entry(values, seed, history, summary) -> dict:
  """One run's values, seed, summary figures and eval-loss curve (rows with
  an evaluation), plain JSON."""
  import numpy as np
  h = history
  rows = ~np.isnan(h["eval_loss"]) if "eval_loss" in h else slice(0, 0)
  curve = {k: [float(v) for v in h[k][rows]] for k in CURVE if k in h}
  keep = ("final_eval_loss", "final_eval_accuracy",
          "final_eval_cross_entropy", "payload_bytes",
          "wire_bytes", "sent_bytes", "sim_time_s", "peak_step_bytes",
          "num_params", "error", "wire_bytes_regional", "wire_bytes_global",
          "final_shadow_eval_loss", "final_shadow_gap", "goodput",
          "stage_bytes", "pipeline_bubble")
  lanes = {k: v for k, v in summary.items() if k.startswith("lane/")}
  return {"values": dict(values), "seed": seed, "curve": curve,
          **{k: summary.get(k) for k in keep}, **lanes}


def save_results(cache_path: str, results: dict) -> dict:
  """Writes the results (what ``--report-only`` reads) and returns them."""
  with open(cache_path, "w") as f:
    json.dump(results, f, indent=1)
  return results


def mean_std(values) -> tuple[float, float]:
  """Mean and standard deviation (ddof 0) of the finite values."""
  import numpy as np
  v = np.asarray([np.nan if x is None else x for x in values], float)
  v = v[np.isfinite(v)]
  return (float(v.mean()), float(v.std())) if v.size else (float("nan"),) * 2


def pm(values, digits: int = 4) -> str:
  """``mean ± std`` of ``values``, formatted."""
  m, s = mean_std(values)
  return f"{m:.{digits}f} ± {s:.{digits}f}"


def paired(runs: list[dict], against: list[dict],
           key: str = "final_eval_loss") -> dict:
  """``runs`` against ``against`` seed by seed (``seeded`` entries): the
  relative differences (a / b - 1), their mean, std (ddof 0) and one-sided
  95 % t-bounds (``low``, ``high``)."""
  from lowbw.studies import paired_interval
  by_seed = {r["seed"]: r[key] for r in against}
  diffs = [r[key] / by_seed[r["seed"]] - 1 for r in runs
           if r["seed"] in by_seed]
  mean, std = mean_std(diffs)
  low, high = paired_interval(diffs)
  return {"diffs": diffs, "mean": mean, "std": std, "low": low, "high": high}


def losses(runs: list[dict], key: str = "final_eval_loss") -> list[float]:
  """Each run's final ``key``."""
  return [r[key] for r in runs]


def gap_text(g: dict) -> str:
  """A ``paired`` result as ``+1.23% [+0.45%, +2.01%]`` (mean, then its
  one-sided 95 % bounds)."""
  return f"{g['mean']:+.2%} [{g['low']:+.2%}, {g['high']:+.2%}]"


# The suite's "matches": a mean paired relative gap <= +2 % whose one-sided
# 95 % t-bound is <= +3 % (row 1's rule, read by every row that asks it).
MATCH, MATCH_BOUND = 0.02, 0.03


def matches(g: dict) -> bool:
  """The suite's 'matches' for a ``paired`` result (or any dict with its
  ``mean`` and ``high``)."""
  return g["mean"] <= MATCH and g["high"] <= MATCH_BOUND


def every(interval: int, H: int) -> int:
  """An evaluation interval that lands on syncs: the first multiple of H
  at or after ``interval``."""
  return H * -(-interval // H)


def gpt_text(p: dict, n: int, context: bool = False) -> str:
  """``GPT of 44,160 parameters (2 blocks, d_model 32)`` from a preset's
  ``layers``, ``d_model`` (and ``seq_len`` with ``context``)."""
  blocks = f"{p['layers']} block" + ("s" if p["layers"] != 1 else "")
  extra = f", context {p['seq_len']}" if context else ""
  return f"GPT of {n:,} parameters ({blocks}, d_model {p['d_model']}{extra})"


def lanes(runs: list[dict]) -> list[dict]:
  """The runs' paired DDP lanes (``shadow="ddp"``) as runs: each entry with
  its lane's ``final_shadow_eval_loss`` as ``final_eval_loss``."""
  return [{**r, "final_eval_loss": r["final_shadow_eval_loss"]} for r in runs]


def lane_gap(runs: list[dict]) -> dict:
  """``paired``: each run against its own paired DDP lane."""
  return paired(runs, lanes(runs))


def cost_cells(runs: list[dict], baseline_payload: float) -> str:
  """A report row's cost cells: payload MB per worker, its fraction of the
  baseline's (``1/60``) and the simulated seconds (mean over seeds)."""
  pay = runs[0]["payload_bytes"]
  return (f"{pay / 1e6:.2f} | 1/{baseline_payload / pay:.0f} | "
          f"{mean_std(r['sim_time_s'] for r in runs)[0]:.1f}")


def best_run(runs: list[dict]) -> dict:
  """The run (a ``seeded`` entry) with the lowest final eval loss."""
  return min(runs, key=lambda r: r["final_eval_loss"])


def run_at(runs: list[dict], values: dict) -> dict:
  """The run of a grid whose swept ``values`` are these."""
  return next(r for r in runs
              if all(r["values"].get(k) == v for k, v in values.items()))


def reach(curve: dict, target: float, key: str = "step"):
  """The ``key`` (step, tokens, sim_time_s) at which the eval-loss curve
  first reaches ``target``, interpolated linearly between evaluations;
  None if it never does."""
  xs, ys = curve[key], curve["eval_loss"]
  for i, (x, y) in enumerate(zip(xs, ys)):
    if y <= target:
      if i == 0:
        return float(x)
      x0, y0 = xs[i - 1], ys[i - 1]
      return float(x0 + (x - x0) * (y0 - target) / (y0 - y))
  return None


def timed(run):
  """``run`` wrapped to record its wall seconds in its result's
  ``seconds`` (the compute the findings table adds up)."""
  def wrapped(*args):
    start = time.time()
    out = run(*args)
    out["seconds"] = time.time() - start
    return out
  return wrapped


# --------------------------------------------------------------- findings

FINDINGS = os.path.join(DOCS, "findings")
README = os.path.join(ROOT, "experiments", "README.md")
VERDICTS = ("reproduces", "partly", "does not", "not testable at this scale",
            "measured (no published figure)")
START, END = "<!-- findings table: start -->", "<!-- findings table: end -->"


def verdict(held: int, total: int) -> str:
  """The verdict when a claim splits into ``total`` checks, ``held`` of
  which hold: all of them reproduce it, some partly, none do not."""
  return ("reproduces" if held == total else "partly" if held else
          "does not")


MEASURED = "measured (no published figure)"


def assumption(held: int, total: int, why: str) -> dict:
  """The ``verdict`` and ``why`` of a row that tests an engineering assumption
  (a planning constant or heuristic, no published measurement behind it):
  *measured*, with how many of its ``total`` checks held (the suite's
  rule 7)."""
  return {"verdict": MEASURED, "why": (
      f"an engineering assumption, not a published measurement; {held} of "
      f"{total} checks hold: {why}")}


def publish(script: str, rows: list[dict], minutes: float,
            measured: bool = True) -> None:
  """Writes ``script``'s findings (rows of claim / setting / measured /
  verdict / why / plot / command) and regenerates the README's table.
  ``minutes``: the compute its runs took (``measured=False``: an estimate,
  for runs that predate timing)."""
  for r in rows:
    if r["verdict"] not in VERDICTS:
      raise ValueError(f"verdict {r['verdict']!r}: expected one of {VERDICTS}")
  os.makedirs(FINDINGS, exist_ok=True)
  with open(os.path.join(FINDINGS, script + ".json"), "w") as f:
    json.dump({"script": script, "minutes": round(minutes, 1),
               "measured": measured, "rows": rows}, f, indent=1)
  render_table()


def _cell(text) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def _minutes(m: float) -> str:
  return f"{m:.1f} min" if m < 10 else f"{m:.0f} min"


def render_table() -> None:
  """The one findings table in experiments/README.md, from every script's
  findings file, rows in experiment order, and the compute they took."""
  files = sorted(os.listdir(FINDINGS)) if os.path.isdir(FINDINGS) else []
  found = []
  for name in files:
    with open(os.path.join(FINDINGS, name)) as f:
      found.append(json.load(f))
  rows = sorted(((r, d) for d in found for r in d["rows"]),
                key=lambda rd: [int(x) if x.isdigit() else x
                                for x in rd[0]["row"].split(".")])
  lines = [START, "", "| # | claim (source) | our setting | measured "
           "(mean ± std over seeds) | verdict | plot | command |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
  for r, d in rows:
    plot = (f"[plot](../docs/experiments/{r['plot']})" if r.get("plot")
            else "-")
    lines.append("| " + " | ".join(_cell(x) for x in (
        r["row"], f"{r['claim']} ({r['source']})", r["setting"],
        r["measured"], f"**{r['verdict']}**: {r['why']}", plot,
        f"`{r['command']}`")) + " |")
  total = sum(d["minutes"] for d in found)
  lines += ["", "Compute, wall minutes on a 2-core CPU (no GPU was lent to these "
            "runs; two or three scripts often shared the cores, so each alone "
            "is faster): " + ", ".join(
                f"`{d['script']}` {'' if d.get('measured', True) else '~'}"
                f"{_minutes(d['minutes'])}" for d in found)
            + f"; {total:.0f} min in all (~: the script's own estimate, runs "
            "made before the scripts timed themselves).", "", END]
  with open(README) as f:
    text = f.read()
  if START in text:
    text = text[:text.index(START)] + "\n".join(lines) + text[
        text.index(END) + len(END):]
  else:
    text = text.rstrip("\n") + "\n\n## Findings\n\n" + "\n".join(lines) + "\n"
  with open(README, "w") as f:
    f.write(text)


# ------------------------------------------------------------ equal bytes

def gpt_params():
  """The default GPT's parameters (for exact payload sizes)."""
  import jax
  import jax.numpy as jnp
  from lowbw import models
  return models.gpt().init(jax.random.key(0),
                           {"tokens": jnp.zeros((1, 129), jnp.int32)})


def matching(spec, target: int, params, lo: float, hi: float,
             integer: bool = False):
  """The largest value x in [lo, hi] whose codec ``spec(x)`` sends at most
  ``target`` payload bytes for ``params`` (bisected on the exact count)."""
  from lowbw import transforms

  def sent(x):
    return transforms.payload_nbytes(transforms.parse_codec(spec(x)), params)
  for _ in range(60):
    if (hi - lo) <= (1 if integer else 1e-9 * hi):
      break
    mid = (lo + hi) // 2 if integer else (lo + hi) / 2
    lo, hi = (mid, hi) if sent(mid) <= target else (lo, mid)
  return lo


# ----------------------------------------------------------------- tuning

TUNE_SEED = 100  # the seed grids are searched at (none of the verdicts')
MAX_EXTENSIONS = 3  # grid values added past an edge before giving up


def timed_study(name: str, config, grid, seeds, root: str):
  """``lowbw.study`` in ``root/name`` (resumable) and the compute seconds
  its points took (compiling and running, from their summaries, so a
  resumed study still counts what it found finished)."""
  import lowbw
  result = lowbw.study(config, grid, list(seeds), out=os.path.join(root, name),
                       progress=True, plots=False)
  return result, compute_seconds(result.points)


def compute_seconds(points) -> float:
  """Compile and run seconds summed over a study's points."""
  return sum((p.summary.get("compile_s") or 0.0) +
             (p.summary.get("wall_time_s") or 0.0) for p in points)


def grid_text(grid: dict) -> str:
  """A ``grid_search`` result as ``value: loss, ...; best B, optimum
  inside`` (or AT THE EDGE)."""
  cells = ", ".join(f"{v:g}: {x:.4f}" for v, x in zip(grid["values"],
                                                      grid["loss"]))
  return (f"{cells}; best {grid['best']:g}, optimum "
          f"{'inside' if grid['inside'] else 'AT THE EDGE'}")


def grid_search(name: str, config, field: str, values: list, key: str,
                root: str) -> tuple[dict, float]:
  """The grid of ``field`` at seed ``TUNE_SEED`` by final ``key``, extended
  one value at a time past the edge that holds the optimum (by the ratio of
  the two values next to it) until the optimum is strictly inside or
  ``MAX_EXTENSIONS`` values were added (the suite's rule 4): the grid
  (``values``, ``loss``, ``best``, ``inside`` and the runs' own
  ``diloco_loss``) and the seconds it took."""
  import numpy as np
  seen, diloco, todo, seconds = {}, {}, list(values), 0.0
  for k in range(MAX_EXTENSIONS + 1):
    result, t = timed_study(name if k == 0 else f"{name}_x{k}", config,
                            {field: todo}, [TUNE_SEED], root)
    seconds += t
    final = result.final(frame=False)
    seen.update({float(v): float(x) for v, x in zip(
        final[field], final[key + "_mean"])})
    diloco.update({float(v): float(x) for v, x in zip(
        final[field], final["final_eval_loss_mean"])})
    xs = sorted(seen)
    i = int(np.nanargmin([seen[x] for x in xs]))
    inside = 0 < i < len(xs) - 1
    if inside or len(xs) == 1:
      break
    past = xs[0] * xs[0] / xs[1] if i == 0 else xs[-1] * xs[-1] / xs[-2]
    todo = [float(f"{past:.3g}")]
  return {"values": xs, "loss": [seen[x] for x in xs], "best": xs[i],
          "inside": inside or len(xs) == 1,
          "diloco_loss": [diloco[x] for x in xs]}, seconds
