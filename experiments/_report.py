"""What every experiment's report does: write the generated part, keep the
hand-written reading below it; run configurations resumably, caching each
one's results as JSON."""

import json
import os
import statistics
import time

HAND_WRITTEN = "## Reading (written by hand"


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
    mean = statistics.mean(r[metric] for r in results[label]["runs"])
    print(f"[{i + 1}/{len(todo)}] {label:32s} {metric} {mean:.4f}  "
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
