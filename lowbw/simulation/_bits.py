"""A traced quantizer bit width: one build for every width of a linear
quantizer.

A build made with ``lowbw.build(config, traced=("bits",))`` compiles the
strategy's linear quantizer at the config's width (the largest a run may
take: the payload's packed codes have a static shape); a run with
``hparams={"bits": b}`` holds, in ``SimState.levels``, the quantizer's
2**b - 1 steps and their reciprocal (``_quantize.level_numbers``, on the
host). While a message is traced the codec reads them
(``_quantize.leveling``): its codes, in [0, 2**b - 1], fit the build's
packing and decode to the values ``quant:b`` decodes, so the error-feedback
residual and the outer step are those of ``quant:b`` too.

The host runs with a view of the simulator whose strategy is the one the
config makes with the codec at ``b`` (``view``, ``_codec_views``): its
channels, bytes (the payload of b-bit codes, as the codec counts it), the
clock's message seconds, the ledger and the written config are that run's.

Only a linear quantizer (``quant:B``, with or without ``:stochastic`` or
``:chunk=N``: its noise and groups do not depend on the width), alone or as
the last stage of a chain (``topk:D,quant:B``), with or without error
feedback, on the strategies a traced H allows (``_periods.record``); the
statistical scheme (its codebook has 2**bits entries), ``int8``, ``e3m0``,
``sign`` or any other codec is refused in one line.

Such a build keeps no executables on disk, as a traced density's does not
(``_density``).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw.simulation import _codec_views, _periods
from lowbw.simulation._codec_views import codec_of
from lowbw.transforms import _quantize, as_codec, quantize

NAME = "bits"


def stage_of(codec) -> dict | None:
  """The config of ``codec``'s linear quantizer when it is one, alone or
  the last stage of a chain, else None."""
  if codec is None:
    return None
  last = codec.config.get("chain", [codec.config])[-1]
  if last.get("codec") != "quantize" or last.get("scheme") != "linear":
    return None
  return last


def bits_of(strategy) -> int:
  return stage_of(codec_of(strategy))["bits"]


def layout_of(strategy) -> str | None:
  """The strategy's codec with its linear quantizer's width left out (what
  a build with a traced width fixes), or None when it has none."""
  codec = codec_of(strategy)
  stage = stage_of(codec)
  if stage is None:
    return None
  before = codec.name.split(",")[:-1]
  rest = {k: v for k, v in sorted(stage.items()) if k != "bits"}
  return f"{','.join(before)}|quant:{rest}"


def with_bits(codec, bits: int):
  """``codec`` with its linear quantizer at ``bits``, its other stages and
  options kept (a codec's name is its spec, stage by stage)."""
  stage = stage_of(codec)
  last = quantize(bits, stage["scheme"], stage["stochastic"], stage["chunk"])
  return as_codec("codec", ",".join(codec.name.split(",")[:-1] + [last.name]))


def record(run_config):
  """``run_config`` (a ``RunConfig``) with a traced bit width, or a
  one-line error saying what the build has that a traced width does not
  support."""
  c = _periods.record(run_config, (NAME,))
  if stage_of(codec_of(c.strategy)) is None:
    spec = c.strategy.config.get("codec")
    raise _validate.fail(
        _periods.FIELD, (NAME,), f"not supported with codec {spec!r} (a "
        "traced bits value is the width of a linear quantizer: quant:B, "
        "with or without :stochastic or :chunk=N, alone or after other "
        "stages such "
        "as topk:D,quant:B; the statistical scheme, int8, e3m0, sign or "
        "another codec is not supported)")
  return dataclasses.replace(c, traced_bits=True)


def levels(config) -> dict:
  """The ``SimState.levels`` of a run of ``config`` (a ``RunConfig``): its
  quantizer's level numbers, float32 scalars."""
  numbers = _quantize.level_numbers(bits_of(config.strategy))
  return {name: jnp.asarray(value) for name, value in numbers.items()}


def with_levels(state, config):
  """``state`` holding the levels of ``config``'s width (its view's) when
  the width is traced."""
  if not config.traced_bits:
    return state
  return state._replace(levels=levels(config))


def split(hparams, config):
  """``(bits or None, the other hparams)`` of a run's ``hparams`` on a
  build of ``config``: the width only where it is traced (elsewhere it
  stays, and is refused as a name)."""
  return _periods.split_field(hparams, NAME, config.traced_bits)


def check_bits(sim, bits) -> int:
  """``bits`` for a run of ``sim``: a width of ``quantize`` no larger than
  the build's."""
  if not sim.config.traced_bits:
    raise _validate.fail(NAME, bits, "a shape of this build; build with "
                         "lowbw.build(config, traced=('bits',)) to run "
                         "other quantizer bit widths on one program")
  if (not isinstance(bits, (int, np.integer)) or isinstance(bits, bool)
      or bits not in _quantize.BITS):
    raise _validate.fail(NAME, bits, "expected one of "
                         + ", ".join(map(str, _quantize.BITS)))
  if bits > sim.bits_max:
    raise _validate.fail(NAME, bits, f"at most {sim.bits_max}, the "
                         "quantizer bit width this build was made with")
  return int(bits)


def view(sim, bits: int):
  """``sim`` as the host sees a run of its H with its quantizer at
  ``bits`` (``_codec_views.view``), on the same programs."""
  bits = check_bits(sim, bits)
  if bits == bits_of(sim.config.strategy):
    return sim
  return _codec_views.view(
      sim, with_bits(codec_of(sim.config.strategy), bits), NAME)
