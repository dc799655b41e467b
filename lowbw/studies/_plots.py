"""A study's plots: final loss against bytes (the Pareto front marked),
against simulated time, and against each swept field; mean ± std over
seeds per combination. Needs matplotlib."""

import math
import numbers
import os

from lowbw.telemetry import _axes


def _loss_key(final: dict) -> str:
  """Eval loss where the points evaluated, else the train loss."""
  means = final.get("final_eval_loss_mean", [])
  return ("final_eval_loss" if any(not math.isnan(v) for v in means)
          else "final_train_loss")


def _fmt(v) -> str:
  return f"{v:.4g}" if isinstance(v, float) else str(v)


def label(row: dict, names: list[str]) -> str:
  return ", ".join(f"{n}={_fmt(row[n])}" for n in names
                   if row[n] is not None) or "base"


def pareto(xs: list[float], ys: list[float]) -> list[int]:
  """Indices of the points no other point beats on both (fewer bytes and a
  lower loss), ordered by x."""
  order = sorted((i for i in range(len(xs))
                  if not (math.isnan(xs[i]) or math.isnan(ys[i]))),
                 key=lambda i: (xs[i], ys[i]))
  front, best = [], math.inf
  for i in order:
    if ys[i] < best:
      front.append(i)
      best = ys[i]
  return front


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _rows(final: dict) -> list[dict]:
  keys = list(final)
  return [{k: final[k][i] for k in keys}
          for i in range(len(final[keys[0]]) if keys else 0)]


def _against(study, rows, x: str, loss: str, path: str, front: bool) -> str:
  """Final loss against a final figure ``x``, one marker per combination."""
  plt = _pyplot()
  xs = [r[f"{x}_mean"] for r in rows]
  ys = [r[f"{loss}_mean"] for r in rows]
  ax_x = _axes.axis(x, [v for v in xs if not math.isnan(v)])
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for r, xv, yv in zip(rows, xs, ys):
    ax.errorbar(xv * ax_x.scale, yv, yerr=r[f"{loss}_std"], marker="o",
                capsize=3, label=label(r, study.names), linestyle="none")
  if front:
    idx = pareto(xs, ys)
    ax.plot([xs[i] * ax_x.scale for i in idx], [ys[i] for i in idx],
            color="black", linewidth=1, linestyle="--", zorder=0,
            label="Pareto front")
  if ax_x.log:
    ax.set_xscale("log")
  else:
    _axes.short_ticks(ax.xaxis)
  ax.set_xlabel(ax_x.label)
  ax.set_ylabel(loss.replace("_", " "))
  ax.set_title(f"{loss.replace('_', ' ')} against {ax_x.label} (mean ± std "
               f"over {len(study.seeds)} seed(s))", fontsize=9)
  ax.legend(fontsize=6, loc="best")
  fig.tight_layout()
  _axes.save_figure(fig, path)
  return path


def _numeric(values) -> bool:
  return all(isinstance(v, numbers.Real) and not isinstance(v, bool)
             for v in values)


def swept_lines(rows: list[dict], names: list[str], name: str,
                loss: str) -> tuple[list, bool, bool]:
  """What the plot against ``name`` draws: ``[(label, xs, means, stds)]``,
  one line per combination of the other swept fields (rows without a value
  of ``name`` left out), whether the values are numbers (numpy's too;
  anything else, such as a strategy, is a category: its x is its place)
  and whether a log axis suits them (learning rates)."""
  rows = [r for r in rows if r[name] is not None]
  others = [n for n in names if n != name]
  values = list(dict.fromkeys(r[name] for r in rows))
  numeric = _numeric(values)
  groups: dict = {}
  for r in rows:
    groups.setdefault(tuple(r[n] for n in others), []).append(r)
  lines = []
  for key, members in groups.items():
    members = sorted(members, key=lambda r: float(r[name]) if numeric
                     else values.index(r[name]))
    lines.append((label(dict(zip(others, key)), others),
                  [float(r[name]) if numeric else values.index(r[name])
                   for r in members],
                  [r[f"{loss}_mean"] for r in members],
                  [r[f"{loss}_std"] for r in members]))
  log = numeric and _axes.spans_decades([float(v) for v in values])
  return lines, numeric, log


def _swept(study, rows, name: str, loss: str, path: str) -> str:
  """Final loss against one swept field, a line per combination of the
  others (a category axis for names such as strategies or codecs)."""
  plt = _pyplot()
  lines, numeric, log = swept_lines(rows, study.names, name, loss)
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for text, xs, means, stds in lines:
    ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=text)
  if log:
    ax.set_xscale("log")
  elif numeric:
    _axes.short_ticks(ax.xaxis, [x for _, xs, _, _ in lines for x in xs])
  if not numeric:
    values = list(dict.fromkeys(r[name] for r in rows
                                if r[name] is not None))
    ax.set_xticks(range(len(values)), [str(v) for v in values],
                  rotation=20, fontsize=8)
  ax.set_xlabel(name)
  ax.set_ylabel(loss.replace("_", " "))
  if len(lines) > 1:
    ax.legend(fontsize=6, loc="best")
  fig.tight_layout()
  _axes.save_figure(fig, path)
  return path


def draw(study, folder: str) -> list[str]:
  """Every plot of ``study`` into ``folder``; their paths."""
  final = study.final(frame=False)
  rows = _rows(final)
  if not rows:
    return []
  loss = _loss_key(final)
  os.makedirs(folder, exist_ok=True)
  paths = [_against(study, rows, "wire_bytes", loss,
                    os.path.join(folder, "loss_vs_bytes.png"), front=True)]
  if any(not math.isnan(r["sim_time_s_mean"]) for r in rows):
    paths.append(_against(study, rows, "sim_time_s", loss,
                          os.path.join(folder, "loss_vs_time.png"),
                          front=True))
  for name in study.names:
    paths.append(_swept(study, rows, name, loss,
                        os.path.join(folder, f"loss_vs_{name}.png")))
  return paths
