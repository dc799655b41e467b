"""Rebuilds every report and findings row from the cached runs, and checks
that nothing changed.

Runs each script that caches its runs (the findings scripts, and the two
without findings rows, ``strategies_on_digits.py`` and ``network_whatif.py``)
with ``--report-only`` (no training: the reports, plots and rows come from
``docs/experiments/*_results.json``), then asks git
which generated text files differ from the committed ones. Plots are
rewritten too but not compared (their bytes depend on the matplotlib
version). Prints the compute the cached runs took, script by script, from
the findings files.

Usage (on a tree with no uncommitted changes under docs/experiments):
  python experiments/regenerate.py          # exit status 1 if a report changed
"""

import json
import os
import subprocess
import sys
import time

import _report

HERE = os.path.dirname(os.path.abspath(__file__))


def scripts() -> list[tuple[str, tuple[str, ...]]]:
  """(script, extra arguments) for every script that rebuilds its report
  from a cache (it calls ``_report.results_for``); a script with presets
  (``diloco_faithful.py``) once more for each other preset whose cache is
  in docs/experiments."""
  out = []
  for name in sorted(os.listdir(HERE)):
    if not name.endswith(".py") or name.startswith("_") or (
        name == os.path.basename(__file__)):
      continue
    with open(os.path.join(HERE, name)) as f:
      if "_report.results_for(" not in f.read():
        continue
    out.append((name, ()))
    stem = name[:-3] + "_"
    for cache in sorted(os.listdir(_report.DOCS)):
      preset = cache[len(stem):-len("_results.json")]
      if (cache.startswith(stem) and cache.endswith("_results.json")
          and preset not in ("", "cpu")):
        out.append((name, ("--preset", preset)))
  return out


def rebuild() -> list[str]:
  """Runs every script's ``--report-only``; the names of those that
  failed."""
  failed = []
  for script, extra in scripts():
    started = time.time()
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, script), "--report-only", *extra],
        cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    status = "ok" if done.returncode == 0 else "FAILED"
    print(f"{' '.join((script, *extra))}: {status} "
          f"({time.time() - started:.0f} s)", flush=True)
    if done.returncode:
      print(done.stderr[-2000:])
      failed.append(script)
  return failed


def changed() -> list[str]:
  """Generated text files that differ from the committed ones."""
  out = subprocess.run(
      ["git", "status", "--porcelain", "--", "docs/experiments",
       "experiments/README.md"], cwd=_report.ROOT, capture_output=True,
      text=True, check=True).stdout
  return [line[3:] for line in out.splitlines()
          if not line.endswith(".png")]


def compute() -> str:
  """The compute every script's cached runs took, from the findings."""
  found = []
  for name in sorted(os.listdir(_report.FINDINGS)):
    with open(os.path.join(_report.FINDINGS, name)) as f:
      d = json.load(f)
    found.append((d["script"], d["minutes"], d.get("measured", True)))
  total = sum(m for _, m, _ in found)
  return "\n".join([f"  {s}: {'' if ok else '~'}{m:.1f} min"
                    for s, m, ok in found] +
                   [f"  in all: {total:.0f} min (~: estimated)"])


def main():
  if changed():
    sys.exit("regenerate.py compares the rebuilt reports with the committed "
             "ones: commit or stash the changes under docs/experiments and "
             "experiments/README.md first:\n  " + "\n  ".join(changed()))
  failed = rebuild()
  diff = changed()
  print("compute of the cached runs (2-core CPU):\n" + compute())
  if diff:
    print("changed by the rebuild:\n  " + "\n  ".join(diff))
  if failed or diff:
    sys.exit(1)
  print("every report and row rebuilt byte for byte")


if __name__ == "__main__":
  main()
