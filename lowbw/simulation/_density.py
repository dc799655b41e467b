"""A traced top-k density: one build for every fraction of a top-k codec.

A build made with ``lowbw.build(config, traced=("density",))`` compiles the
strategy's top-k codec with the config's fraction (the largest a run may
take: ``lax.top_k`` needs a static k); a run with ``hparams={"density": d}``
holds, in ``SimState.keep``, k = ``sparse_count(n, d)`` for each tensor or
chunk size n of the messages, computed on the host in float64 as top-k at
``d`` computes it. While a message is traced the codec reads those counts
(``_topk.keeping``) and sends the entries it ranks at or past the run's k as
zeros, so the decoded message, the error-feedback residual and the outer
step are those of top-k at ``d``.

The host runs with a view of the simulator whose strategy is the one the
config makes with the codec at ``d`` (``view``): its channels, bytes, the
clock's message seconds (the programs' ``NetParams`` are priced from
them), the ledger and the written config are that run's.

Only a top-k codec alone (whole tensors, ``chunk=`` or ``block=``), with or
without error feedback, on the strategies a traced H allows
(``_periods.record``); a quantizer after top-k (whose statistics would see
the zeros) or any other codec is refused in one line.

Such a build keeps no executables on disk (``_exe_store``; JAX's persistent
cache still serves it): on the CPU, a traced-density build loaded from the
store beside another one's programs from JAX's cache, in one process,
failed to run ("Function broadcast.30_kernel not found"), which a build
without a traced density did not do in the same sequence; not understood
yet.
"""

import dataclasses

import jax

from lowbw import _validate
from lowbw.simulation import _codec_views, _periods
from lowbw.simulation._codec_views import codec_of
from lowbw.transforms import _topk

NAME = "density"


def fraction_of(strategy) -> float:
  return codec_of(strategy).config["fraction"]


def layout_of(strategy) -> str | None:
  """The layout of the strategy's codec when it is top-k alone (whole,
  flat:N or blocks:N), else None."""
  chunker = _topk.chunker_of(codec_of(strategy))
  return None if chunker is None else chunker.spec


def record(run_config):
  """``run_config`` (a ``RunConfig``) with a traced density, or a one-line
  error saying what the build has that a traced density does not
  support."""
  c = _periods.record(run_config, (NAME,))
  codec = codec_of(c.strategy)
  if _topk.chunker_of(codec) is None:
    spec = c.strategy.config.get("codec")
    raise _validate.fail(
        _periods.FIELD, (NAME,), f"not supported with codec {spec!r} (a "
        "traced density is the fraction of a top-k codec alone: topk:D, "
        "with or without chunk= or block=; a quantizer after it or another "
        "codec is not supported)")
  return dataclasses.replace(c, traced_density=True)


def counts(config, params) -> dict:
  """The ``SimState.keep`` of a run of ``config`` (a ``RunConfig``): k of
  each chunk size of ``params``' tensors at its codec's fraction."""
  codec = codec_of(config.strategy)
  return _topk.keep_counts(codec, [x.shape for x in jax.tree.leaves(params)],
                           codec.config["fraction"])


def with_counts(state, config):
  """``state`` holding the counts of ``config``'s fraction (its view's)
  when the density is traced."""
  if not config.traced_density:
    return state
  fraction = fraction_of(config.strategy)
  return state._replace(keep=_topk.counts_at(state.keep, fraction))


def split(hparams, config):
  """``(density or None, the other hparams)`` of a run's ``hparams`` on a
  build of ``config``: the density only where it is traced (elsewhere it
  stays, and is refused as a name)."""
  return _periods.split_field(hparams, NAME, config.traced_density)


def check_density(sim, density) -> float:
  """``density`` for a run of ``sim``: a fraction in (0, 1] no larger than
  the build's."""
  if not sim.config.traced_density:
    raise _validate.fail(NAME, density, "a shape of this build; build with "
                         "lowbw.build(config, traced=('density',)) to run "
                         "other top-k densities on one program")
  density = _validate.fraction(NAME, density)
  if density > sim.density_max:
    raise _validate.fail(NAME, density, f"at most {sim.density_max}, the "
                         "top-k density this build was made with")
  return density


def view(sim, density: float):
  """``sim`` as the host sees a run of its H with top-k at ``density``
  (``_codec_views.view``), on the same programs."""
  density = check_density(sim, density)
  if density == fraction_of(sim.config.strategy):
    return sim
  return _codec_views.view(
      sim, _topk.with_fraction(codec_of(sim.config.strategy), density), NAME)
