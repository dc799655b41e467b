"""What a run writes: its columns (metrics.csv, ``Result.history``), the
layout of its rows (``_history.Layout``) and its configuration as written
to config.json."""

import jax

from lowbw.strategies._base import describe
from lowbw.network._collectives import tiers_of
from lowbw.simulation import _hparams
from lowbw.simulation._history import Layout
from lowbw.telemetry import _metrics as names


class Schema:
  """The output schema of a build's runs.

  Attributes:
    config: the ``RunConfig``.
    channels: name -> ``Channel`` as logged (wire bytes under the build's
      network).
    metric_names, strategy_metric_names: the model's and the strategy's
      own metrics.
  """

  def __init__(self, config, facts, channels: dict, memory, prices):
    self.config, self.channels = config, channels
    self.metric_names = facts.metric_names
    self.strategy_metric_names = facts.strategy_metric_names
    self.num_params = facts.num_params
    self.memory, self.prices = memory, prices

  def layout(self, network) -> Layout:
    """What the rows of a run on ``network`` hold."""
    c = self.config
    return Layout(self.channels, self.metric_names,
                  examples_per_step=c.workers * c.batch_size,
                  tokens_per_example=c.data.tokens_per_example,
                  num_workers=c.workers,
                  strategy_metrics=self.strategy_metric_names,
                  clock=network is not None,
                  correlation=c.correlation_every is not None,
                  members=c.masks, perplexity=c.is_lm,
                  stage_bytes_per_step=(c.pipeline.bytes_per_step()
                                        if c.pipeline else 0))

  def columns(self) -> list[str]:
    """The columns of metrics.csv, in order."""
    c, metrics = self.config, self.metric_names
    lm = c.is_lm
    cols = [names.STEP, names.EXAMPLES] + ([names.TOKENS] if lm else [])
    cols += [names.TRAIN_LOSS] + [names.train_metric(m) for m in metrics]
    cols += [names.TRAIN_PERPLEXITY] if lm else []
    cols += [names.EVAL_LOSS] + [names.eval_metric(m) for m in metrics]
    cols += [names.EVAL_PERPLEXITY] if lm else []
    if c.shadow is not None:
      cols += [names.SHADOW_EVAL_LOSS, names.SHADOW_GAP]
    if c.eval_local:
      cols += [names.EVAL_LOCAL_LOSS, names.EVAL_LOCAL_LOSS_STD] + [
          names.eval_metric("local_" + m) for m in metrics]
    cols += [names.PAYLOAD_BYTES, names.WIRE_BYTES, names.SENT_BYTES,
             names.RECEIVED_BYTES]
    cols += [names.tier_wire_bytes(t) for t in tiers_of(self.channels)]
    cols += [names.STAGE_BYTES] if c.pipeline else []
    cols += [names.PEAK_STEP_BYTES, names.WORKER_DIVERGENCE, names.LR]
    cols += [names.WORKER_CORRELATION] if c.correlation_every else []
    if c.network is not None:
      cols += [names.SIM_TIME_S, names.SYNC_WORKERS]
      cols += [names.WORKERS_UP] if c.masks else []
    cols += [names.strategy_metric(m) for m in self.strategy_metric_names]
    cols += [names.WALL_TIME_S]
    return cols

  def describe(self, seed: int, network, hparams=None, metadata=None) -> dict:
    """The run's configuration as written to config.json."""
    c = self.config
    return {
        "model": c.model.config, "data": c.data.config,
        "strategy": c.strategy.config, "num_workers": c.workers,
        "batch_size": c.batch_size, "steps": c.steps, "seed": seed,
        "hparams": _hparams.jsonable(hparams or {}),
        "eval_every": c.eval_every, "log_every": c.default_log_every,
        "eval_examples": c.eval_examples, "num_params": self.num_params,
        "channels": {k: ch._asdict() for k, ch in self.channels.items()},
        "network": self._network(network),
        "jax_version": jax.__version__, "backend": jax.default_backend(),
        "worker_dtype": c.worker_dtype, "worker_batch": c.worker_batch,
        # only when set: configurations (and checkpoints) from before match
        **({"minibatch_size": c.minibatch_size} if c.minibatch_size else {}),
        **({"autocast": c.autocast} if c.autocast != "float32" else {}),
        **({"correlation_every": c.correlation_every}
           if c.correlation_every else {}),
        **({"eval_local": True} if c.eval_local else {}),
        **({"shadow": {"name": "ddp",
                       "inner": describe(c.shadow)}}
           if c.shadow is not None else {}),
        "memory": self.memory.describe(),
        "devices": c.devices, "processes": jax.process_count(),
        "metadata": dict(metadata or {}),
    }

  def _network(self, network) -> dict | None:
    """``network`` described, with what it charges this run."""
    if network is None:
      return None
    pricing = self.prices.pricing(network)
    return {**network.describe(), "compute_s_per_step": pricing.step_s,
            "comm_s_per_event": {name: cost.seconds
                                 for name, cost in pricing.clock_costs.items()}}
