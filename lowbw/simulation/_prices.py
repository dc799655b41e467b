"""What a network charges a run: its priced channels, the model's FLOPs, and
``network.price``'s result per network (the one place a run's messages are
priced: the bytes logged, the clock and config.json all read it)."""

import jax

from lowbw import models as models_lib
from lowbw import network as net_lib
from lowbw.network import _clock


class Prices:
  """The run's channels and FLOPs, and each network's ``Pricing`` (cached).

  Attributes:
    priced_channels: what a network prices: the strategy's messages and,
      with faults, the engine's catch-up downloads.
    flops_per_token, flops_per_step: the model's compute (``network``'s
      compute-time model).
  """

  def __init__(self, config, facts):
    c = self.config = config
    self.priced_channels = {**facts.strategy_channels,
                            **catch_up(c, facts)}
    self.num_params = facts.num_params
    self.num_tensors = len(jax.tree.leaves(facts.abstract_params))
    tokens = c.batch_size * (c.data.tokens_per_example or 1)
    self.flops_per_token = models_lib.flops_per_token(
        c.model, facts.num_params, c.data.tokens_per_example)
    self.flops_per_step = _clock.flops_per_step(facts.num_params, tokens,
                                                 self.flops_per_token)
    self._pricings: dict = {}  # id(network) -> (network, Pricing)
    self._net_params: dict = {}  # (id(network), seed) -> (network, params)

  def pricing(self, network) -> net_lib.Pricing:
    """What ``network`` charges for this run, in one call
    (``network.price``): the logged wire bytes, the clock's seconds per
    message and per step."""
    key = id(network)
    if key not in self._pricings:  # keyed by identity: networks are values
      if len(self._pricings) >= 8:
        self._pricings.pop(next(iter(self._pricings)))
      self._pricings[key] = (network, net_lib.price(
          network, self.priced_channels, self.config.workers,
          self.num_params, self.flops_per_step, steps=self.config.steps,
          num_tensors=self.num_tensors, pipeline=self.config.pipeline))
    return self._pricings[key][1]

  def channels(self, network) -> dict:
    """name -> ``Channel``, with what each worker sends under ``network``'s
    topology (as logged); the priced channels as they are without one."""
    if network is None:
      return dict(self.priced_channels)
    costs = self.pricing(network).costs
    return {name: ch._replace(wire_bytes=costs[name].wire_bytes,
                              collective=costs[name].algorithm,
                              received_bytes=costs[name].received_bytes)
            for name, ch in self.priced_channels.items()}

  def net_params(self, network, seed: int):
    """The traced network numbers of a run on ``network``, or None."""
    if network is None:
      return None
    # A study runs many points of one network and seed: made once each
    # (keyed like ``pricing``, by identity; the arrays are never donated).
    key = (id(network), seed)
    if key not in self._net_params:
      if len(self._net_params) >= 16:
        self._net_params.pop(next(iter(self._net_params)))
      self._net_params[key] = (network, _clock.net_params(
          network, self.config.workers, self.pricing(network), seed))
    return self._net_params[key][1]


def catch_up(c, facts) -> dict:
  """With faults, the channel of a worker's return to the fleet: it
  downloads the global model and the outer optimizer's state (one worker's
  share of per-worker outer states; none under an asynchronous strategy,
  whose server keeps its optimizer)."""
  if not c.masks or c.network.faults is None:
    return {}
  comm = facts.abstract_state.strategy.comm
  outer = 0
  places = {} if c.strategy.asynchronous else c.strategy.outer_places
  for field in (places or {}).values():
    size = _strategy_bytes(getattr(comm, field, ()))
    outer += size // c.workers if field.endswith("_W") else size
  state = 4 * facts.num_params + outer  # the global model in float32
  return {_clock.CATCH_UP: net_lib.exchange(0, state, c.workers)}


def _strategy_bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
