"""What a build learns before compiling anything, checked.

The model's parameters and the run's state as shapes (``jax.eval_shape``),
the strategy's channels and what its steps report; a strategy that reports
an integer it does not price, or Byzantine workers it cannot model, is
refused here with a one-line error.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw.transforms._robust import corrupts
from lowbw.models import check_contract
from lowbw.simulation import _engine, _inputs, _plan, _precision


class Facts(NamedTuple):
  """The build's static facts (shapes only, nothing on a device).

  Attributes:
    example: an example batch of one worker.
    abstract_params: the model's parameters as shapes.
    metric_names: the model's own metrics.
    num_params: parameters of the model.
    abstract_state: the run's ``SimState`` as shapes.
    strategy_channels: name -> ``Channel`` of the strategy's messages.
    reports: ``"local"``/``"sync"`` -> the shapes of what those steps
      report.
    strategy_metric_names: the strategy's own metrics (its report entries
      that are not channels).
  """

  example: Any
  abstract_params: Any
  metric_names: list
  num_params: int
  abstract_state: Any
  strategy_channels: dict
  reports: dict
  strategy_metric_names: list


def learn(config) -> Facts:
  """The facts of ``config`` (a ``RunConfig``); one-line errors for what
  the strategy cannot do in this run."""
  c = config
  example = c.data.example_batch(c.batch_size)
  key = jax.random.PRNGKey(0)
  abstract_params, metric_names = check_contract(c.model, example, key)
  num_params = sum(x.size for x in jax.tree.leaves(abstract_params))
  abstract_state = jax.eval_shape(
      functools.partial(_inputs.initial_state, c, example), key)
  channels = c.strategy.channels(abstract_params, c.workers)
  reports = _reports(c, abstract_state)
  strategy_metrics = check_reports(c, channels, reports)
  _plan.check_worker_batch(c, channels, reports["local"])
  check_byzantine(c, abstract_state)
  return Facts(example, abstract_params, metric_names, num_params,
               abstract_state, channels, reports, strategy_metrics)


def _reports(c, abstract_state) -> dict:
  """The shapes of what ``local`` and ``sync`` report (gradients have the
  parameters' shapes)."""
  strategy, st = c.strategy, abstract_state.strategy
  # On the state the engine computes with: stored worker state widened.
  wide = _precision.Precision(_engine.stored_dtype(c)).widen
  local = jax.eval_shape(lambda s: strategy.local(
      wide(s), wide(s).params_W), st)[1]
  sync = {} if strategy.sync is None else jax.eval_shape(
      lambda s: strategy.sync(wide(s)), st)[1]
  return {"local": local, "sync": sync}


def check_reports(c, channels: dict, reports: dict) -> list[str]:
  """The strategy's own metrics: its report entries that are not
  channels, each a float scalar (an integer one is a channel that
  ``channels()`` forgot to price)."""
  metrics = set()
  for fn, report in reports.items():
    for name, leaf in report.items():
      if name in channels:
        continue
      if not (getattr(leaf, "shape", None) == () and
              jnp.issubdtype(leaf.dtype, jnp.floating)):
        raise _validate.fail(
            "report", name,
            f"strategy {c.strategy.name!r}'s {fn} step reports it, but it "
            f"is not one of its channels "
            f"({', '.join(channels) or 'none'}); other "
            "entries are its own metrics and must be float scalars")
      metrics.add(name)
  return sorted(metrics)


def check_byzantine(c, abstract_state) -> None:
  """Byzantine workers need a strategy whose sync sends pseudo-gradients
  they can corrupt (the DiLoCo family); refused otherwise, not ignored."""
  faults = None if c.network is None else c.network.faults
  if faults is None or not faults.byzantine:
    return
  strategy, st = c.strategy, abstract_state.strategy
  if strategy.sync is None or not corrupts(
      strategy.sync, c.workers, st):
    raise _validate.fail(
        "byzantine", list(faults.byzantine), f"strategy {strategy.name!r} "
        "sends no pseudo-gradients a Byzantine worker could corrupt; "
        "Byzantine workers are modelled for the DiLoCo family (diloco, "
        "muloco, streaming_diloco, hierarchical_diloco)")
