"""The host's view of a build at another setting of its codec: a traced
top-k density (``_density``) or quantizer bit width (``_bits``).

The programs are the build's; the view's strategy is the one the config
makes with the run's own codec, so its channels, bytes, the clock's message
seconds (the programs' ``NetParams`` are priced from them), the ledger and
the written config are that run's.
"""

import copy
import dataclasses

from lowbw import _validate
from lowbw.transforms import as_codec


def codec_of(strategy):
  """The strategy's codec (from its spec), or None."""
  spec = strategy.config.get("codec")
  try:
    return as_codec("codec", spec) if isinstance(spec, str) else None
  except _validate.ConfigError:  # a codec object of the user's own
    return None


def view(sim, codec, field: str):
  """``sim`` as the host sees a run of its H with ``codec`` (a codec its
  programs run under the run's traced values of ``field``): the strategy
  the config makes with that codec, its channels, prices and schema, on
  the same programs. Nothing is compiled."""
  from lowbw.simulation import _prices, _schema  # they import the engine
  built = sim.codec_at(sim.config.period, codec.name, field)
  c = dataclasses.replace(sim.config, strategy=built.strategy)
  out = copy.copy(sim)
  out.config = c
  out.facts = sim.facts._replace(strategy_channels=c.strategy.channels(
      sim.facts.abstract_params, c.workers))
  out.strategy_channels = out.facts.strategy_channels
  out.prices = _prices.Prices(c, out.facts)
  out.priced_channels = out.prices.priced_channels
  out.channels = out.prices.channels(c.network)
  out.inputs = copy.copy(sim.inputs)
  out.inputs.prices = out.prices
  out.schema = _schema.Schema(c, out.facts, out.channels, sim.memory,
                              out.prices)
  return out


def strategy_at(config, H: int, spec: str, field: str):
  """What ``config`` (a ``lowbw.Config``) builds with ``H`` and codec
  ``spec``; an invalid combination is one line naming ``field`` (the
  traced setting that made the spec)."""
  try:
    return config.replace(H=H, codec=spec).built()
  except _validate.ConfigError as e:
    raise _validate.fail(field, spec, f"{e.field}={e.value!r}: {e.allowed}"
                         ) from None
