"""The run's memory plan: its estimate, and whether (and how) the workers'
steps run in groups (``worker_batch``, ``_grouping.steps_in_groups``)."""

import math

from lowbw import _validate
from lowbw.simulation import _memory


def why_not_groups(c, channels: dict, local_report: dict) -> str | None:
  """Why the workers' steps cannot run in groups (each group runs a whole
  round on its own, ``_grouping.steps_in_groups``), or None."""
  if _mixed(c):
    return "runs a mixed fleet (pipeline_workers)"
  if getattr(c, "clients", None) is not None:
    return "samples its workers' clients every round (clients)"
  if any(k in channels for k in local_report):
    return "communicates at every inner step"
  if c.strategy.asynchronous:
    return "runs each worker's steps on its own schedule"
  if c.redistributes:
    return "redistributes departed workers' data step by step"
  if c.strategy.time_budget:
    return "takes as many inner steps on each worker as its speed allows"
  if local_report:
    return ("reports metrics from its inner step, which groups would not "
            "log")
  return None


def _mixed(c) -> bool:
  """Whether only some workers are pipelines (``pipeline_workers``)."""
  pipeline = getattr(c, "pipeline", None)
  return pipeline is not None and pipeline.workers is not None


def check_worker_batch(c, channels: dict, local_report: dict) -> None:
  """A ``worker_batch`` the user gave needs steps that can run in groups."""
  if c.worker_batch in (None, "auto"):
    return
  if _mixed(c):
    raise _validate.fail(
        "worker_batch", c.worker_batch, "a mixed fleet (pipeline_workers) "
        "computes every worker's step at once, its boundary codecs chosen "
        "by the worker's index; expected 'auto' or 'all'")
  why = why_not_groups(c, channels, local_report)
  if why is not None:
    raise _validate.fail(
        "worker_batch", c.worker_batch,
        f"strategy {c.strategy.name!r} {why}; worker_batch needs one whose "
        "inner steps are local and silent (diloco, muloco, fedavg, "
        "streaming_diloco, hierarchical_diloco, spes)")


def memory_plan(c, facts, eval_batches) -> _memory.Plan:
  """The run's memory estimate and ``worker_batch`` (``_memory``) from the
  build's ``facts`` (``_facts.Facts``)."""
  local_report = facts.reports["local"]
  can_group = not c.one_replica and why_not_groups(
      c, facts.strategy_channels, local_report) is None
  data_bytes = _memory.nbytes(eval_batches) + sum(
      4.0 * math.prod(x.shape) for x in c.data.train.values())
  return _memory.plan(c, facts.abstract_state, facts.abstract_params,
                      facts.example, can_group, data_bytes,
                      _memory.per_step_bytes(c, facts.metric_names,
                                             local_report),
                      len(facts.strategy_channels) + 1)
