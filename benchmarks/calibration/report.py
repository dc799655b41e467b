"""The clock's error on the 73 measured runs, old clock against calibrated.

For every run of ``measured_runs.csv`` (README.md), the sync seconds and
compute utilisation (CU) lowbw predicts under six profiles, against what
was measured:

- ideal: ``lowbw.network.IDEAL``-style, latency + bytes / bandwidth only
  (the clock before profiles; ``residuals.py``'s figures);
- calibrated: the library's default profile;
- fit: ``lowbw calibrate`` on ``measurements.csv`` (the runs over shaped
  links, in the columns ``lowbw calibrate`` reads; this script writes it,
  and the fitted profile to ``profile.yaml``);
- holdout a: fitted on the DiLoCo runs only, scored on LocalSGD and DDP;
- holdout b: fitted on repeats 0 and 1, scored on repeat 2;
- holdout c: per DDP link rate, fitted on every run but DDP's at that rate,
  scored on it.

A run is priced over its own measured window, as ``residuals.py`` does:
``syncs_in_window`` syncs of the clock's seconds (plus the profile's
start-up when the run's first sync is in the window) and ``window_steps``
steps of the measured compute plus the profile's host time; CU is the
measured compute over that wall. LocalSGD's and DiLoCo's trainers issue one
all-reduce per parameter tensor, so they are priced with their 57 calls;
DDP's bucket count was not recorded, so it pays one call.

Usage:
  python benchmarks/calibration/report.py   # rewrites the files below
  python benchmarks/calibration/report.py --check   # only compares
"""

import argparse
import csv
import json
import os
import statistics
import sys

from lowbw.network import _calibrate, _profile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import residuals  # noqa: E402  (beside this script)

MEASUREMENTS = os.path.join(HERE, "measurements.csv")
PROFILE = os.path.join(HERE, "profile.yaml")  # lowbw calibrate's output
JSON = os.path.join(ROOT, "docs", "benchmarks", "calibration_cpu.json")
DOC = os.path.join(ROOT, "docs", "calibration.md")
PLOT = os.path.join(ROOT, "docs", "calibration_residuals.png")
BEGIN, END = "<!-- report.py: begin -->", "<!-- report.py: end -->"
COLUMNS = ("run_id", "repeat") + _calibrate.REQUIRED + _calibrate.OPTIONAL
GROUPS = ("ddp", "localsgd", "diloco", "unshaped")
PROFILES = ("ideal", "calibrated", "fit", "holdout a", "holdout b",
            "holdout c")


def first_excluded(run: dict) -> float | None:
  """Mean seconds of the window's syncs without the run's first (None
  when the first is the window's only sync)."""
  k, mean = run["syncs_in_window"], run["sync_s_mean"]
  if not run["first_sync_in_window"]:
    return mean
  return None if k == 1 else (k * mean - run["first_sync_s"]) / (k - 1)


def measurement(run: dict) -> dict | None:
  """``run`` in ``lowbw calibrate``'s columns; None when its syncs other
  than the first were not measured."""
  sync_s = first_excluded(run)
  if sync_s is None:
    return None
  return {"run_id": run["run_id"], "repeat": run["repeat"],
          "method": run["method"], "workers": run["workers"],
          "bandwidth_bps": run["shaped_bps"], "parameters": run["params"],
          "dtype_bytes": run["dtype_bytes"], "H": run["H"],
          "compute_s_per_step": run["compute_s_per_step"], "sync_s": sync_s,
          "latency_s": 0.0, "first_sync_extra_s": run["first_sync_s"] - sync_s,
          "host_s_per_step": run["host_s_per_step"],
          "calls_per_sync": run["allreduce_calls_per_sync"]}


def measurements(runs: list[dict]) -> list[dict]:
  """The rows of ``measurements.csv``: the runs over shaped links (an
  unshaped link's rate is one TCP flow's, not the collective's)."""
  rows = [measurement(r) for r in runs if r["link"] != "unshaped"]
  return [r for r in rows if r is not None]


def fits(rows: list[dict]) -> dict:
  """The profiles scored (see the module); "holdout c" is one profile per
  DDP link rate, fitted without DDP's run at that rate."""
  def of(keep):
    return _calibrate.fit([r for r in rows if keep(r)])
  ddp_rates = sorted({r["bandwidth_bps"] for r in rows
                      if r["method"] == "ddp"})
  return {"ideal": _profile.IDEAL, "calibrated": _profile.CALIBRATED,
          "fit": of(lambda r: True),
          "holdout a": of(lambda r: r["method"] == "diloco"),
          "holdout b": of(lambda r: int(r["repeat"]) in (0, 1)),
          "holdout c": {rate: of(lambda r, rate=rate: not (
              r["method"] == "ddp" and r["bandwidth_bps"] == rate))
              for rate in ddp_rates}}


def profile_for(profiles: dict, name: str, run: dict):
  """Profile ``name`` as it prices ``run`` (holdout c: the fold that left
  ``run``'s rate out)."""
  p = profiles[name]
  return p[run["shaped_bps"]] if isinstance(p, dict) else p


def scored(name: str, run: dict) -> bool:
  """Whether profile ``name`` is scored on ``run`` (holdouts: only on the
  runs left out of their fit)."""
  if name == "holdout a":
    return run["method"] != "diloco"
  if name == "holdout b":
    return run["method"] == "diloco" and run["link"] != "unshaped" and (
        run["repeat"] == 2)
  if name == "holdout c":
    return run["method"] == "ddp" and run["link"] != "unshaped"
  return True


def as_run(run: dict) -> _calibrate.Run:
  calls = run["allreduce_calls_per_sync"]
  return _calibrate.Run(
      run["method"], run["workers"], run["shaped_bps"], run["params"],
      run["dtype_bytes"], run["H"], run["compute_s_per_step"],
      run["sync_s_mean"], calls_per_sync=None if calls is None else int(calls))


def predict(profile, run: dict) -> dict:
  """The clock's mean sync and CU over ``run``'s window under ``profile``."""
  sync_s, step_s = _calibrate.predict(profile, as_run(run))
  n, k = run["window_steps"], run["syncs_in_window"]
  startup = profile.startup_s if run["first_sync_in_window"] else 0.0
  work = n * run["compute_s_per_step"]
  cu = work / (n * step_s + k * sync_s + startup)
  mean = sync_s + startup / k
  return {"sync_s": mean, "sync_err": mean / run["sync_s_mean"] - 1,
          "cu": cu, "cu_err": cu / run["cu"] - 1}


def group(run: dict) -> str:
  return "unshaped" if run["link"] == "unshaped" else run["method"]


def tables(runs: list[dict], profiles: dict) -> dict:
  """Per group and profile, median and max |relative error| of sync and
  CU over the runs the profile is scored on."""
  out = {}
  for g in GROUPS:
    out[g] = {}
    for name in profiles:
      preds = [predict(profile_for(profiles, name, r), r) for r in runs
               if group(r) == g and scored(name, r)]
      if preds:
        out[g][name] = {"runs": len(preds), **{key: {
            "median": statistics.median(abs(p[f"{key}_err"]) for p in preds),
            "max": max(abs(p[f"{key}_err"]) for p in preds)}
            for key in ("sync", "cu")}}
  return out


def unreachable(runs: list[dict], fitted) -> list[dict]:
  """The runs no physical profile (efficiency <= 1, costs >= 0, one
  efficiency per link rate shared by every method) prices within 10 %,
  and why."""
  out = []
  for r in runs:
    run = as_run(r)
    algorithm = (fitted.bucketed_allreduce if _calibrate.bucketed(run)
                 else "ring")
    x, latency = _calibrate._ideal_seconds(run, algorithm)
    alone = first_excluded(r) is None  # the window's one sync is the first
    sync_s = r["sync_s_mean"] if alone else first_excluded(r)
    calls = (run.calls_per_sync or 1) * fitted.per_call_s
    hidden = (fitted.bucketed_overlap * run.compute_s_per_step
              if _calibrate.bucketed(run) else 0.0)  # behind the backward
    paid = latency + calls + (fitted.startup_s if alone else 0.0) - hidden
    need = x / (sync_s - paid)
    reach = fitted.efficiency_at(run.bandwidth_bps)
    if abs(need / reach - 1) <= 0.1:
      continue
    if need > 1:
      why = (f"its sync ({sync_s:.3f} s) beats one all-reduce at the full "
             f"link rate ({x + paid:.3f} s): the rate given is one iperf3 "
             "TCP flow's, and the collective's several flows reach more")
    elif alone:
      extra = sync_s - x / reach - paid
      why = (f"its window's one sync is the run's first, {extra:.2f} s "
             f"longer than the fit's start-up of {fitted.startup_s:.2f} s "
             "(the first sync's extra time varies from run to run: 0.24 "
             "to 0.98 s at 200 Mbit/s and above)")
    else:
      why = (f"it needs an efficiency of {need:.2f} where the fit reaches "
             f"{reach:.2f} at its rate")
    out.append({"run_id": r["run_id"], "needed_efficiency": need,
                "reason": why})
  return out


def _cell(stats: dict | None, key: str) -> str:
  if stats is None:
    return "–"
  return (f"{100 * stats[key]['median']:.1f} / {100 * stats[key]['max']:.1f}"
          f" ({stats['runs']})")


_NAMES = {"ddp": "DDP, shaped", "localsgd": "LocalSGD (all shaped)",
          "diloco": "DiLoCo, shaped", "unshaped": "unshaped (1 DDP, 4 DiLoCo)"}


def markdown(t: dict, profiles: dict, lost: list[dict]) -> str:
  """The tables docs/calibration.md shows between its markers."""
  lines = []
  for key, what in (("sync", "sync seconds"), ("cu", "compute utilisation")):
    lines += [f"Relative error of the {what}, median / max of |predicted / "
              "measured − 1|, % (runs scored):", "",
              "| runs | " + " | ".join(PROFILES) + " |",
              "| --- |" + " --- |" * len(PROFILES)]
    for g in GROUPS:
      lines.append(f"| {_NAMES[g]} | " + " | ".join(
          _cell(t[g].get(p), key) for p in PROFILES) + " |")
    lines.append("")
  lines += ["The fitted profiles (holdout c: one per DDP rate left out):",
            "", "| profile | efficiency (rate: fraction) | per_call_s | "
            "startup_s | host_s | bucketed_allreduce |",
            "| --- | --- | --- | --- | --- | --- |"]
  for name in PROFILES[1:]:
    p = profiles[name]
    for label, one in ([(f"{name}, without {rate / 1e6:.0f} Mbit/s", one)
                        for rate, one in p.items()] if isinstance(p, dict)
                       else [(name, p)]):
      eff = ", ".join(f"{b / 1e6:.0f} Mbit/s: {e:.3f}"
                      for b, e in one.efficiency)
      lines.append(f"| {label} | {eff} | {1e3 * one.per_call_s:.3f} ms | "
                   f"{one.startup_s:.3f} s | {1e3 * one.host_s:.3f} ms | "
                   f"{one.bucketed_allreduce} |")
  lines += ["", "Runs no physical profile reaches (under the fit):", ""]
  lines += [f"- `{x['run_id']}`: {x['reason']}." for x in lost]
  return "\n".join(lines)


def plot(runs: list[dict], profiles: dict, path: str) -> bool:
  """Predicted / measured sync seconds against the measured, per profile;
  False when matplotlib is missing."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for name, marker in (("ideal", "o"), ("calibrated", "s"), ("fit", "^")):
    xs = [r["sync_s_mean"] for r in runs]
    ys = [1 + predict(profiles[name], r)["sync_err"] for r in runs]
    ax.scatter(xs, ys, marker=marker, s=18, alpha=0.7, label=name)
  ax.axhline(1.0, color="k", lw=0.8)
  ax.set(xscale="log", xlabel="measured seconds of a sync (73 runs)",
         ylabel="predicted / measured", title="lowbw's clock against "
         "measured DDP, LocalSGD and DiLoCo runs")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110, metadata={"Software": None})
  plt.close(fig)
  return True


def write_rows(rows: list[dict], path: str) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: repr(v) if isinstance(v, float) else v
                      for k, v in r.items()} for r in rows)


def report(runs: list[dict]) -> dict:
  """Everything the script writes, as values."""
  rows = measurements(runs)
  profiles = fits(rows)
  t = tables(runs, profiles)
  lost = unreachable(runs, profiles["fit"])
  return {"source": "benchmarks/calibration/measured_runs.csv",
          "profiles": {k: {f"{rate:.0f}": one.describe()
                           for rate, one in p.items()} if isinstance(p, dict)
                       else p.describe() for k, p in profiles.items()},
          "tables": t, "unreachable": lost,
          "rows": [{"run_id": r["run_id"], **{
              name: predict(profile_for(profiles, name, r), r)
              for name in profiles if scored(name, r)}} for r in runs],
          "_rows": rows, "_markdown": markdown(t, profiles, lost),
          "_profiles": profiles}


def rewrite_doc(text: str, tables_md: str) -> str:
  """``text`` with what lies between the markers replaced."""
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  return f"{head}{BEGIN}\n{tables_md}\n{END}{tail}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare the "
                      "committed files with a fresh run; write nothing")
  args = parser.parse_args(argv)
  runs = residuals.load_runs()
  out = report(runs)
  with open(DOC) as f:
    doc = f.read()
  public = {k: v for k, v in out.items() if not k.startswith("_")}
  text = json.dumps(public, indent=1) + "\n"
  if args.check:
    with open(JSON) as f:
      same = f.read() == text and rewrite_doc(doc, out["_markdown"]) == doc
    print("up to date" if same else "stale: run report.py")
    return 0 if same else 1
  write_rows(out["_rows"], MEASUREMENTS)
  _profile.save(out["_profiles"]["fit"], PROFILE)
  with open(JSON, "w") as f:
    f.write(text)
  with open(DOC, "w") as f:
    f.write(rewrite_doc(doc, out["_markdown"]))
  print(out["_markdown"])
  if not plot(runs, out["_profiles"], PLOT):
    print("matplotlib is missing: docs/calibration_residuals.png not drawn "
          "(pip install matplotlib)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
