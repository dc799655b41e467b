"""A traced H: one build for every sync period of a DiLoCo-style strategy.

A build made with ``lowbw.build(config, traced=("H",))`` compiles rounds of
``H`` step slots (the config's H, the largest a run may take) followed by
the sync; a run with ``hparams={"H": h}`` runs the first ``h`` slots of each
round (``SimState.period``, a traced int32; a skipped slot is a
``lax.cond`` that does nothing), so every h up to the build's shares one
program. The tail program has ``H - 1`` slots, those past the run's steps
skipped.

The host knows each run's h: it runs with a view of the simulator whose
strategy is the one the config makes with ``H=h`` (``view``), so the chunk
loop, the logged rows, the ledger's bytes, the clock and the written config
are those of the run built with that H, and it reads only a round's first h
slots (``trimmed``).

Only strategies whose round is "H local steps then one sync", with nothing
else depending on H (``Strategy.traceable_period``: DiLoCo, SparseLoCo,
MuLoCo, FedAdam without a delayed outer step or DyLU), in one process,
without fault or straggler masks, counterfactual lanes, a paired DDP lane
or worker groups; anything else is refused in one line.
"""

import copy
import dataclasses

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw import strategies as strategies_lib

# "density": top-k's fraction (``_density``); "bits": a linear quantizer's
# width (``_bits``).
TRACEABLE = ("H", "density", "bits")
FIELD = "traced"


def check(config, traced) -> tuple:
  """``traced`` as a tuple of field names (``()``, or some of ``"H"``,
  ``"density"`` and ``"bits"``), given a ``lowbw.Config`` whose strategy is
  given by name and has an H."""
  if traced is None:
    return ()
  if isinstance(traced, str) or not isinstance(traced, (tuple, list)):
    raise _validate.fail(FIELD, traced, "expected a tuple of field names, "
                         f"e.g. ('H',); traceable: {', '.join(TRACEABLE)}")
  for name in traced:
    if name not in TRACEABLE:
      raise _validate.fail(FIELD, name, "not a field a build can trace; "
                           f"expected one of {', '.join(TRACEABLE)}")
  traced = tuple(dict.fromkeys(traced))
  if traced and not isinstance(config.strategy, str):
    raise _validate.fail(FIELD, traced, "needs the strategy by name (a "
                         "strategy object cannot be rebuilt with another "
                         "value)")
  return traced


# A traced field as messages name it.
WHAT = {"H": "H", "density": "top-k density", "bits": "quantizer bit width"}


def record(run_config, traced=("H",)):
  """``run_config`` (a ``RunConfig``) with ``traced`` (H, or the names a
  build traces on the same strategies: ``_density``, ``_bits``), or a one-line error
  saying what the build has that they do not support."""
  c = run_config
  s = c.strategy
  what = " and ".join(WHAT[name] for name in traced)
  why = (None if s.traceable_period else
         f"strategy {s.name!r} as configured (its round is not H local "
         f"steps then one sync; a traced {what} supports "
         f"{', '.join(strategies_lib.strategies_with('traceable_period'))}"
         " without outer_delay or dylu)")
  why = why or next((text for bad, text in (
      (c.masks, "fault or straggler masks"),
      (c.shadow is not None, "a paired DDP lane (shadow)"),
      # The client draw and its shards are keyed by rounds of the build's
      # H (``data.client_sampler``).
      (c.clients is not None, f"clients={c.clients} (sampled clients)"),
      (jax.process_count() > 1, "several processes")) if bad), None)
  if why:
    raise _validate.fail(FIELD, tuple(traced), f"not supported with {why}")
  return dataclasses.replace(c, traced_period=c.traced_period or
                             "H" in traced)


def traced_fields(run_config) -> tuple:
  """The names a build of ``run_config`` (a ``RunConfig``) traces."""
  c = run_config
  return tuple(name for name, on in (
      ("H", c.traced_period), ("density", c.traced_density),
      ("bits", c.traced_bits)) if on)


def check_grouping(run_config) -> None:
  """Worker groups (``worker_batch``) step in their own loop, which has no
  slots."""
  traced = traced_fields(run_config)
  if traced and run_config.grouping is not None:
    raise _validate.fail(FIELD, traced, "not supported with worker_batch="
                         f"{run_config.worker_batch} (workers in groups); "
                         "give worker_batch=None or a smaller run")


def check_run(config, checkpoint_every, resume_from) -> None:
  """A run of a build with a traced H, density or bit width is not
  checkpointed (not tested yet): one line naming the setting."""
  traced = traced_fields(config)
  if traced and (checkpoint_every or resume_from):
    name = "checkpoint_every" if checkpoint_every else "resume_from"
    what = WHAT[traced[0]]
    raise _validate.fail(name, checkpoint_every or resume_from,
                         f"not supported on a build with a traced {what} "
                         "yet; build with the run's own value")


def check_period(sim, H) -> int:
  """``H`` for a run of ``sim``: a positive int no larger than the build's
  (its round's slots)."""
  if not sim.config.traced_period:
    raise _validate.fail("H", H, "a shape of this build; build with "
                         "lowbw.build(config, traced=('H',)) to run other "
                         "H values on one program, or build again")
  H = _validate.positive_int("H", H)
  if H > sim.slots:
    raise _validate.fail("H", H, f"at most {sim.slots}, the H this build "
                         "was made with (its rounds' step slots)")
  return H


# The host's settings a run takes from its own config (their defaults
# follow H); the others are the build's.
HOST_SETTINGS = ("eval_every", "log_every")


def view(sim, H: int):
  """``sim`` as the host sees a run with ``H``: the strategy the config
  makes with ``H=H`` (its period, its description) and that config's
  evaluation and logging steps, on the same programs and inputs. Errors of
  the config with that H (an ``eval_every`` that is not a multiple of it)
  name H."""
  from lowbw.simulation import _schema  # the simulator imports this module
  H = check_period(sim, H)
  if H == sim.config.period:
    return sim
  built = sim.strategy_at(H)
  # rounds_per_chunk stays the build's (its programs' buffers), which
  # changes how many chunks run, not a row.
  for name in ("correlation_every",):  # in the programs
    if built.checked[name] != getattr(sim.config, name):
      raise _validate.fail("H", H, f"its {name} ({built.checked[name]}) is "
                           f"not the build's ({getattr(sim.config, name)})")
  out = copy.copy(sim)
  out.config = dataclasses.replace(
      sim.config, strategy=built.strategy,
      **{name: built.checked[name] for name in HOST_SETTINGS})
  out.schema = _schema.Schema(out.config, sim.facts, sim.channels,
                              sim.memory, sim.prices)
  return out


def split(hparams, config):
  """``(H or None, the other hparams)`` of a run's ``hparams`` on a build
  of ``config`` (a ``RunConfig``): H only where it is traced (elsewhere it
  stays, and is refused as a shape)."""
  return split_field(hparams, "H", config.traced_period)


def split_field(hparams, name: str, traced: bool):
  """``(hparams[name] or None, the other hparams)``: a traced field's value
  taken out where the build traces it (``traced``); elsewhere ``hparams``
  as given (the name is then refused as a shape or unknown)."""
  if not traced or not isinstance(hparams, dict) or name not in hparams:
    return None, hparams
  rest = dict(hparams)
  return rest.pop(name), rest


def with_period(state, config):
  """``state`` holding the run's H (``config``'s period) when it is
  traced."""
  if not config.traced_period:
    return state
  return state._replace(period=jnp.asarray(config.period, jnp.int32))


def strategy_at(config, H: int):
  """What ``config`` (a ``lowbw.Config``) builds with ``H`` (its strategy
  and checked settings); an invalid combination is one line naming H."""
  try:
    return config.replace(H=H).built()
  except _validate.ConfigError as e:
    raise _validate.fail("H", H, f"{e.field}={e.value!r}: {e.allowed}"
                         ) from None


def trimmed(kind: str, n: int, out, period: int):
  """A chunk's outputs (numpy, one run's) as a build with ``period``
  returns them: a round's first ``period`` step slots, the tail's first
  ``n`` steps."""
  if kind == "rounds":
    return out._replace(steps=jax.tree.map(lambda x: x[:, :period],
                                           out.steps))
  return jax.tree.map(lambda x: x[:n], out)
