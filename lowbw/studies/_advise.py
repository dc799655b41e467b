"""``lowbw.advise``: which method to use for a model and a fleet.

A small probe study runs every candidate (strategy, H, codec) at laptop
scale with the paired DDP lane, which measures each one's token efficiency
eta against DDP (``summary["token_efficiency"]``: the share of its tokens
DDP needs to reach the same loss; DDP's is 1). Each probe run's ledger is
then re-timed (``lowbw.retime``) on the user's fleet at the user's model
size (``clock_params``) and compute per step, which gives the seconds and
bytes of one of its steps there. A candidate needs tokens / eta tokens to
be as good as DDP with ``tokens``; its time, bytes and dollars follow, with
an interval from eta's over seeds. The table ranks the candidates by time
(or cost) and says when the probe cannot tell the first two apart.

With ``target_loss`` instead of a model size and a token budget, the task
is the probe itself: each candidate's time to reach that evaluation loss is
read from its probe runs' losses and their simulated times on the fleet
(the runs re-timed there), with no extrapolation, so running a candidate on
that fleet gives the same time.
"""

import dataclasses
import math
import tempfile
from typing import NamedTuple

import numpy as np

from lowbw import _validate
from lowbw import network as net_lib
from lowbw.config import Config
from lowbw.studies import _grid
from lowbw.studies._result import paired_interval
from lowbw.studies._run import study
from lowbw.simulation import _track, retime

PROBE = {"data": "digits", "model": "mlp", "hidden": "32", "steps": 400,
         "batch_size": 16, "eval_every": 20, "eval_examples": 256}
CANDIDATES = ({"strategy": "ddp"}, {"strategy": "diloco", "H": 10},
              {"strategy": "diloco", "H": 50},
              {"strategy": "diloco", "H": 50, "codec": "quant:4"})


@dataclasses.dataclass
class Advice:
  """``advise``'s answer.

  Attributes:
    rows: one per candidate, best first: ``candidate`` (its settings),
      ``eta`` with ``eta_low``/``eta_high`` (token efficiency against DDP
      and its 90 % interval over seeds), ``step_s`` (seconds per step on
      the fleet at the model's size), ``steps`` (to match DDP with the
      tokens), ``time_s`` with ``time_low``/``time_high``, ``sent_gb``,
      ``gpu_hours`` and ``cost_usd`` (with prices).
    notes: what limits the answer (the probe cannot tell the first two
      apart, a candidate whose eta was not measured).
    probe: the probe study (``lowbw.Study``).
  """

  rows: list[dict]
  notes: list[str]
  probe: object

  @property
  def best(self) -> dict:
    return self.rows[0]


def advise(params=None, tokens=None, *, target_loss: float | None = None,
           workers: int | None = None, tokens_per_step=8192,
           fleet: dict | None = None, candidates=None,
           probe=None, seeds=(0, 1, 2),
           rank_by: str = "time", out: str | None = None,
           progress: bool | None = None) -> Advice:
  """Ranks ``candidates`` for a ``params``-parameter model trained on
  ``tokens`` tokens by ``workers`` workers on ``fleet``, or by their time
  to ``target_loss`` on the probe's own task.

  Args:
    params: the model's parameters ("1B", "350M" or a number).
    tokens: the token budget DDP would train on ("20B" or a number).
    target_loss: instead of ``params`` and ``tokens``: the evaluation loss
      to reach on the probe's task (``probe``: its data, model and steps,
      the most any candidate may take); the time to reach it is measured,
      not extrapolated.
    workers: the fleet's workers (the probe runs as many); default the
      probe's ``workers`` when it gives them, else 8.
    tokens_per_step: tokens one worker processes per step at full scale.
    fleet: the fleet's network and hardware as ``lowbw.network.network``'s
      keywords (bandwidth, latency, topology, hardware, mfu, profile,
      upload_bandwidth, speeds, ...); prices as ``gpu_price`` ($ per
      GPU-hour) and ``egress_price`` ($ per GB sent).
    candidates: settings of each candidate (default: DDP, DiLoCo at H 10
      and 50, DiLoCo at H 50 with 4-bit pseudo-gradients).
    probe: the probe's settings over ``PROBE`` (digits MLP, 400 steps): a
      dict, or a ``lowbw.Config`` (its given fields; its strategy's
      settings are the candidates' to choose, and a setting a candidate
      does not use is left out of its runs).
    seeds: the probe's seeds (the intervals are over them).
    rank_by: "time" or "cost".
    out: the probe study's folder (default a temporary one).
    progress: the probe's progress bar (default: on a terminal).
  """
  probe = _grid.base_values(probe) if isinstance(probe, Config) else dict(
      probe or {})
  workers = _validate.positive_int(
      "workers", workers if workers is not None else probe.get("workers", 8))
  rank_by = _validate.one_of("rank_by", rank_by, ("time", "cost"))
  fleet = dict(fleet or {})
  prices = {k: fleet.pop(k, None) for k in ("gpu_price", "egress_price")}
  if rank_by == "cost" and not any(v is not None for v in prices.values()):
    raise _validate.fail("rank_by", rank_by, "needs a price: gpu_price ($ "
                         "per GPU-hour) or egress_price ($ per GB) in fleet")
  candidates = [dict(c) for c in (candidates or CANDIDATES)]
  task = _Task(workers, prices, seeds, out, progress)
  if target_loss is not None:
    if params is not None or tokens is not None:
      raise _validate.fail(
          "target_loss", target_loss, "is a loss on the probe's own task; "
          "params and tokens ask about a larger model: give one or the other")
    target = _validate.positive_float("target_loss", target_loss)
    return _to_target(target, candidates, probe, _network(fleet), task,
                      rank_by)
  if params is None or tokens is None:
    raise _validate.fail(
        "params" if params is None else "tokens", None, "required: give a "
        "model's size (params) and its token budget (tokens), or "
        "target_loss (the time to a loss on the probe's own task)")
  params = net_lib.count(params, "params")
  tokens = net_lib.count(tokens, "tokens")
  tokens_per_step = net_lib.count(tokens_per_step, "tokens_per_step")
  net = _fleet(fleet, params, tokens_per_step)
  base, grid = probe_study(candidates, probe, workers)
  s = _probe(base, grid, task)
  steps = tokens / (workers * tokens_per_step)
  rows = [_row(c, s, net, params, steps, workers, prices)
          for c in candidates]
  return _ranked(rows, rank_by, s)


class _Task(NamedTuple):
  """What every probe shares: the fleet's workers, prices, the seeds, the
  study's folder and progress bar."""

  workers: int
  prices: dict
  seeds: tuple
  out: str | None
  progress: bool | None


def _probe(base: dict, grid: list[dict], task: _Task):
  folder = task.out or tempfile.mkdtemp(prefix="lowbw-advise-")
  return study(base, grid, task.seeds, out=folder, progress=task.progress,
               plots=False)


def _ranked(rows: list[dict], rank_by: str, probe) -> Advice:
  key = "time_s" if rank_by == "time" else "cost_usd"
  rows.sort(key=lambda r: (math.inf if r[key] is None or
                           math.isnan(r[key]) else r[key]))
  return Advice(rows, _notes(rows, key), probe)


def probe_study(candidates: list[dict], probe: dict | None, workers: int
                ) -> tuple[dict, list[dict]]:
  """The probe study's base and grid: one point per candidate, with the
  paired DDP lane where it measures eta."""
  base = {**PROBE, **(probe or {}), "workers": workers}
  grid = [{k: [v] for k, v in {**_evaluated(c, base["eval_every"]),
                                "shadow": _lane(c)}.items()}
          for c in candidates]
  return base, grid


def _evaluated(candidate: dict, every: int) -> dict:
  """The candidate, evaluated every ``every`` steps or, when its rounds
  are longer, at the least multiple of both (evaluations come at syncs)."""
  H = candidate.get("H")
  if "eval_every" in candidate or not isinstance(H, int) or H < 1:
    return candidate
  return {**candidate, "eval_every": math.lcm(int(every), H)}


def _lane(candidate: dict):
  """The paired lane that measures eta: none for DDP (its eta is 1)."""
  return None if candidate.get("strategy", "diloco") == "ddp" else "ddp"


def _network(fleet: dict):
  """``lowbw.network.network(**fleet)``, a wrong keyword named."""
  try:
    return net_lib.network(**fleet)
  except TypeError as e:
    raise _validate.fail("fleet", sorted(fleet), f"{e}; expected "
                         "lowbw.network.network's keywords") from None


def _fleet(fleet: dict, params: int, tokens_per_step: int):
  """The fleet's network (``lowbw.network.network``'s defaults for what
  ``fleet`` leaves out), its compute per step fixed at the model's size:
  6 x params x tokens per step at the hardware's peak x MFU (the clock's
  FLOP model), so that the probe's own batch does not enter."""
  net = _network(fleet)
  hw = net.hardware
  step_s = (hw.step_time_s if hw.step_time_s is not None else
            6.0 * params * tokens_per_step / (hw.flops * hw.mfu))
  return net._replace(hardware=net_lib.hardware(f"{step_s!r}s"),
                      clock_params=params)


def _row(candidate: dict, s, net, params: int, steps: float, workers: int,
         prices: dict) -> dict:
  ok, failed = _candidate_points(candidate, s)
  if not ok:
    return {"candidate": candidate, "eta": math.nan, "time_s": math.nan,
            "cost_usd": math.nan, "error": failed}
  etas = np.array([1.0 if _lane(candidate) is None else
                   (p.summary.get("token_efficiency") or math.nan)
                   for p in ok])
  eta = float(np.nanmean(etas)) if np.isfinite(etas).any() else math.nan
  low, high = (eta, eta) if _lane(candidate) is None else paired_interval(
      etas, 0.95)
  timed = retime(ok[0].log_dir, net)
  startup = net.profile.startup_s
  step_s = (timed["sim_time_s"] - startup) / timed["steps"]
  scale = params / ok[0].summary["num_params"]
  sent_per_step = ok[0].summary["sent_bytes"] / timed["steps"] * scale
  need = steps / eta if eta > 0 else math.nan

  def time(e):
    return steps / e * step_s + startup if e and e > 0 else math.nan
  hours = workers * time(eta) / 3600
  gb = need * sent_per_step / 1e9
  cost = _cost(prices, hours, gb)
  return {"candidate": candidate, "eta": eta, "eta_low": low,
          "eta_high": high, "step_s": step_s, "steps": need,
          "time_s": time(eta), "time_low": time(high), "time_high": time(low),
          "sent_gb": gb, "gpu_hours": hours, "cost_usd": cost,
          "seeds": len(ok)}


def _to_target(target: float, candidates: list[dict], probe: dict | None,
               net, task: _Task, rank_by: str) -> Advice:
  """Each candidate's time to ``target`` on the probe's task: its runs
  (no DDP lane) re-timed on the fleet ``net`` at their own size."""
  base = {**PROBE, **(probe or {}), "workers": task.workers}
  grid = [{k: [v] for k, v in _evaluated(c, base["eval_every"]).items()}
          for c in candidates]
  s = _probe(base, grid, task)
  rows = [_target_row(c, s, net, target, task) for c in candidates]
  return _ranked(rows, rank_by, s)


def reach(history: dict, sim_time_s, target: float) -> tuple[float, float]:
  """(step, seconds) at which the evaluation loss first reaches
  ``target``, linear between the evaluations around the crossing (the
  first evaluation's own, when it is already there; ``_track.crossing``,
  as the token efficiency reads its lane); (nan, nan) when it never
  does."""
  loss = np.asarray(history["eval_loss"], float)
  at = np.flatnonzero(np.isfinite(loss))
  found = _track.crossing(loss[at], target)
  if found is None:
    return math.nan, math.nan
  return (_track.at_crossing(np.asarray(history["step"], float)[at], *found),
          _track.at_crossing(np.asarray(sim_time_s, float)[at], *found))


def _target_row(candidate: dict, s, net, target: float, task: _Task
                ) -> dict:
  ok, failed = _candidate_points(candidate, s)
  if not ok:
    return {"candidate": candidate, "time_s": math.nan, "cost_usd": math.nan,
            "error": failed}
  reached = []
  for p in ok:
    timed = retime(p.log_dir, net)
    step, seconds = reach(p.history, timed["history"]["sim_time_s"], target)
    sent = p.summary["sent_bytes"] / timed["steps"] * step
    reached.append((step, seconds, sent))
  step, seconds, sent = np.array(reached).T
  done = int(np.isfinite(seconds).sum())
  time_s = float(seconds.mean()) if done == len(ok) else math.nan
  low, high = paired_interval(seconds, 0.95) if done == len(ok) else (
      math.nan, math.nan)
  hours = task.workers * time_s / 3600
  gb = float(sent.mean()) / 1e9 if done == len(ok) else math.nan
  return {"candidate": candidate, "target_loss": target,
          "steps": float(step.mean()) if done == len(ok) else math.nan,
          "time_s": time_s, "time_low": low, "time_high": high,
          "sent_gb": gb, "gpu_hours": hours,
          "cost_usd": _cost(task.prices, hours, gb),
          "seeds": len(ok), "reached": done,
          "probe_steps": int(ok[0].summary.get("steps") or 0)}


def _candidate_points(candidate: dict, s) -> tuple[list, str | None]:
  """The candidate's finished probe points, and the error of a failed one
  when none finished."""
  points = [p for p in s.points if all(p.values.get(k) == v
                                       for k, v in candidate.items())]
  ok = [p for p in points if not p.summary.get("error")]
  return ok, (None if ok else points[0].summary.get("error") if points
              else "no point ran")


def _cost(prices: dict, hours: float, gb: float) -> float | None:
  if prices["gpu_price"] is None and prices["egress_price"] is None:
    return None
  return hours * (prices["gpu_price"] or 0.0) + gb * (
      prices["egress_price"] or 0.0)


def _notes(rows: list[dict], key: str) -> list[str]:
  unmeasured = ("the lane's and the run's losses never crossed after the "
                "first evaluation: evaluate more often")
  notes = []
  for r in rows:
    if "target_loss" not in r and "eta" in r and (
        r["eta"] is None or math.isnan(r["eta"])):
      why = r.get("error") or unmeasured
      notes.append(f"{r['candidate']}: eta not measured ({why}); left last")
    elif "eta" not in r and r.get("error"):
      notes.append(f"{r['candidate']}: its probe runs failed ({r['error']});"
                   " left last")
    elif "target_loss" in r and r["reached"] < r["seeds"]:
      notes.append(
          f"{r['candidate']}: reached eval loss {r['target_loss']:g} in "
          f"{r['reached']} of {r['seeds']} seeds within {r['probe_steps']} "
          "steps; left last (give more probe steps)")
  timed = [r for r in rows if not math.isnan(r.get("time_s", math.nan))]
  if len(timed) >= 2 and key == "time_s":
    a, b = timed[0], timed[1]
    if a["time_high"] >= b["time_low"]:
      notes.append(f"the probe cannot tell {a['candidate']} from "
                   f"{b['candidate']}: their time intervals overlap (more "
                   "seeds or probe steps narrow them)")
  return notes


__all__ = ["Advice", "advise"]
