"""Each build setting's rule, once: what ``lowbw.build`` accepts for it and
the value the build uses. A build setting's ``Field`` (``_fields``) names its
rule as ``check``; ``_settings.check_settings`` applies the rules in the
fields' order, each seeing the settings checked before it.
"""

import math

import jax.numpy as jnp
import numpy as np
import optax

from lowbw import _validate
from lowbw import data as data_lib
from lowbw import strategies as strategies_lib
from lowbw import transforms as transforms_lib
from lowbw.network import _clock, _faults
from lowbw.config import _resources

_TARGET_CHUNKS = 25  # compiled calls per run when rounds_per_chunk is not given

AUTOCAST = {"float32": None, "bfloat16": jnp.bfloat16}
# The paired DDP lane's choices (``shadow``).
SHADOWS = ("ddp", "snoo")
WORKER_DTYPES = ("float32", "bfloat16")


def _precision(field: str, value, allowed) -> str:
  """``value`` as "float32" or "bfloat16" (None, "fp32" and "bf16"
  accepted); anything else is a ValueError naming ``field``."""
  value = {None: "float32", "bf16": "bfloat16", "fp32": "float32"}.get(
      value, value)
  return _validate.one_of(field, value, allowed)


def check_worker_dtype(value) -> str:
  """``worker_dtype``: the type the workers' state is stored in."""
  return _precision("worker_dtype", value, WORKER_DTYPES)


def check_minibatch_size(value, batch_size: int) -> int | None:
  """None (the whole batch at once) or a size dividing ``batch_size``
  (equal micro-batches, so their mean gradient is the batch's)."""
  value = _validate.optional_positive_int("minibatch_size", value)
  if value is None or value == batch_size:
    return None
  if batch_size % value:
    raise _validate.fail(
        "minibatch_size", value, f"must divide batch_size={batch_size} "
        "(equal micro-batches)")
  return value


def check_autocast(value) -> str:
  """``autocast``: the forward and backward passes' compute type."""
  return _precision("autocast", value, AUTOCAST)


SEED_LIMIT = 2 ** 32  # PRNGKey keeps 32 bits: 2**32 would replay seed 0


def check_seed(seed) -> int:
  if (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
      or not 0 <= seed < SEED_LIMIT):
    raise _validate.fail("seed", seed, "expected an integer in [0, 2**32)")
  return int(seed)


def multiple_of_period(field, value, period):
  value = _validate.optional_positive_int(field, value)
  if value is not None and value % period:
    raise _validate.fail(
        field, value,
        f"must be a multiple of the strategy's period, H = {period} (global "
        "parameters only change at syncs)")
  return value


def check_worker_batch(worker_batch, per_device: int) -> int | str | None:
  """"auto" (chosen from the memory budget, ``_memory``), None or "all"
  (every worker at once), or a group size dividing the workers per device
  (an int, or its digits from a flag)."""
  if isinstance(worker_batch, str) and worker_batch.strip().isdigit():
    worker_batch = int(worker_batch)
  if worker_batch in ("auto", "all"):
    return None if worker_batch == "all" else worker_batch
  if isinstance(worker_batch, str):
    raise _validate.fail("worker_batch", worker_batch,
                         "expected 'auto', 'all' or an integer >= 1")
  worker_batch = _validate.optional_positive_int("worker_batch", worker_batch)
  if worker_batch is not None and per_device % worker_batch:
    raise _validate.fail("worker_batch", worker_batch,
                         f"must divide the {per_device} workers of each device")
  return worker_batch


def check_shadow(shadow, strategy) -> optax.GradientTransformation | None:
  """The lane's optimizer, or None for no lane.

  ``shadow``: None; ``"ddp"``: the strategy's own inner optimizer
  (``Strategy.inner``; DiLoCo's default AdamW for a strategy without one,
  such as DeMo); ``"snoo"``: that optimizer inside SNOO with K the
  strategy's H (``strategies.snoo_optimizer``); or an optax transformation, the
  lane's optimizer.
  """
  if shadow is None:
    return None
  if isinstance(shadow, optax.GradientTransformation):
    return shadow
  inner = strategy.inner or strategies_lib.default_inner()
  if shadow == "ddp":
    return inner
  if shadow == "snoo":
    if strategy.period < 2:
      raise _validate.fail("shadow", shadow, f"SNOO's outer step comes every "
                           f"H steps of the strategy's round, and "
                           f"{strategy.name} has rounds of "
                           f"{strategy.period} step; give 'ddp', or "
                           "lowbw.strategies.snoo_optimizer(K=...) as the optimizer")
    return strategies_lib.snoo_optimizer(inner, K=strategy.period)
  raise _validate.fail(
      "shadow", shadow, "expected None, 'ddp' (a DDP replica with the "
      "strategy's inner optimizer, trained on the union of the workers' "
      "batches), 'snoo' (the same replica with an outer Nesterov step every "
      "H steps: SNOO, arXiv 2510.15830) or an optax.GradientTransformation "
      "(the replica's optimizer)")


def has_masks(network) -> bool:
  """Fault or straggler masks are compiled in (jitter alone drops nobody)."""
  return network is not None and (network.faults is not None or (
      network.stragglers is not None and
      network.stragglers.mitigation != "none"))


# ------------------------------------------------ the build settings' rules
# A rule is ``rule(name, value, settings, strategy) -> the value the build
# uses``; ``settings`` holds the settings checked before it (in the fields'
# order) and the given values of the others.


def positive(name, value, s, strategy) -> int:
  return _validate.positive_int(name, value)


def optional_positive(name, value, s, strategy) -> int | None:
  return _validate.optional_positive_int(name, value)


def every_period(name, value, s, strategy) -> int | None:
  """A number of steps that must fall on syncs (a multiple of H)."""
  return multiple_of_period(name, value, strategy.period)


def boolean(name, value, s, strategy) -> bool:
  return _validate.boolean(name, value)


def steps(name, value, s, strategy) -> int:
  """At least one sync: fewer steps than the period never change the
  shared model."""
  value = _validate.positive_int(name, value)
  period = strategy.period
  if value < period:
    raise _validate.fail(
        name, value, f"the strategy syncs every {period} steps (its "
        "period, H), so with fewer steps no sync happens and the shared "
        f"model never changes; give steps >= {period} or a smaller H")
  return value


def minibatch_size(name, value, s, strategy) -> int | None:
  return check_minibatch_size(value, s["batch_size"])


def autocast(name, value, s, strategy) -> str:
  return check_autocast(value)


def worker_dtype(name, value, s, strategy) -> str:
  return check_worker_dtype(value)


def shadow(name, value, s, strategy):
  return check_shadow(value, strategy)


def memory_budget(name, value, s, strategy):
  return _resources.check_budget(value)


def devices(name, value, s, strategy) -> int:
  """The devices (None: lowbw's choice, ``default_devices``): spread over
  CPU devices unless DDP keeps one replica or the user chose a
  ``worker_batch`` (it counts a device's workers)."""
  one_replica = strategy.replicated and not has_masks(s["network"])
  spread = not one_replica and s["worker_batch"] in (None, "auto")
  return _resources.check_devices(value, s["workers"], spread)


def worker_batch(name, value, s, strategy):
  return check_worker_batch(value, s["workers"] // s["devices"])


def network(name, value, s, strategy):
  """The network object (``lowbw.Config`` builds it from its settings, or
  takes the one given), checked against the workers and the strategy."""
  if value is None:
    return None
  value = _clock.check_network(value, s["workers"])
  if value.faults is not None:
    _faults.check_windows(value.faults, strategy.period)
  if strategy.asynchronous:
    _check_asynchronous(strategy, value)
  return value


def rounds_per_chunk(name, value, s, strategy) -> int:
  """Rounds per compiled call: given, or about 1/25 of the run."""
  if value is not None:
    return _validate.positive_int(name, value)
  return max(1, math.ceil(s["steps"] // strategy.period / _TARGET_CHUNKS))


def _check_asynchronous(strategy, network) -> None:
  """An asynchronous strategy orders its events by the workers' compute
  times. Of the fault model it takes the windows, failures and joins
  (a worker down loses its round and restarts from the server's model when
  back); drops per round, lost messages, Byzantine workers and straggler
  mitigations (which act on a barrier it does not have) are not part of its
  schedule."""
  if network.hardware is None:
    raise _validate.fail(
        "hardware", None, f"strategy {strategy.name!r} orders its arrivals "
        "by the workers' compute times: give the network a hardware "
        "(e.g. 'h100' or a time per step, '0.5s'), or run without a network")
  f = network.faults
  if f is not None and strategy.pull is None:
    raise _validate.fail(
        "faults", "given", f"strategy {strategy.name!r} does not say how a "
        "worker back from a fault window restarts (Strategy.pull); run it "
        "without faults")
  if f is not None:
    for field, value, given in (
        ("drop_prob", f.drop_prob, f.drop_prob > 0),
        ("message_loss", f.message_loss, f.message_loss > 0),
        ("byzantine", f.byzantine, bool(f.byzantine)),
        ("leave_shards", f.leave_shards, f.leave_shards != "drop")):
      if given:
        raise _validate.fail(
            field, value, f"strategy {strategy.name!r} has no rounds to "
            "drop workers from or barrier to lose messages at; of the "
            "fault model it takes windows, failures and joins (workers "
            "that go down and come back)")
  if network.stragglers is not None and network.stragglers.mitigation != "none":
    raise _validate.fail(
        "mitigation", network.stragglers.mitigation,
        f"strategy {strategy.name!r} waits for nobody, so there is nothing "
        "to mitigate: give mitigation 'none' (jitter still slows workers)")


def clients(name, value, s, strategy) -> int | None:
  """``clients``: None (every worker is a client of its own) or a
  population M >= workers, of which the workers are a fresh sample every
  round (``data.client_sampler``, ``strategies.sampled_clients``): FedAvg,
  DiLoCo or FedAdam, without per-client state, faults or worker groups."""
  if value is None:
    return None
  value = _validate.positive_int(name, value)
  if value < s["workers"]:
    raise _validate.fail(name, value, f"must be at least workers="
                         f"{s['workers']}, the clients sampled each round")
  if not strategy.clients:
    allowed = strategies_lib.client_strategies()
    raise _validate.fail(
        name, value, f"samples clients for strategies {', '.join(allowed)} "
        "(their workers restart from the global model every round); "
        f"strategy {strategy.name!r} is not one of them")
  _check_stateless_clients(strategy)
  if has_masks(s["network"]):
    raise _validate.fail(
        "faults" if s["network"].faults is not None else "mitigation",
        "given", f"with clients={value} the workers are other clients every "
        "round, so faults and stragglers of fixed workers have no meaning; "
        "run without them")
  per_device = s["workers"] // s["devices"]
  if s["worker_batch"] not in (None, "auto", per_device):
    raise _validate.fail("worker_batch", s["worker_batch"], f"with clients="
                         f"{value} every worker's steps run at once: give "
                         "'auto' or 'all'")
  return value


def _check_stateless_clients(strategy) -> None:
  """A sampled client keeps nothing between rounds: no error-feedback
  residual, no outer model of its own, no warm-started codec."""
  config = strategy.config
  for field, given in (("ef", config.get("error_feedback")),
                       ("eager", config.get("eager")),
                       ("message", config.get("message"))):
    if given:
      raise _validate.fail(field, given, "is state each worker keeps "
                           "between rounds, which sampled clients (clients=M)"
                           " do not keep; run without it")
  codec = config.get("codec")
  try:
    warm = codec is not None and transforms_lib.parse_codec(
        codec).start is not None
  except (ValueError, TypeError):  # a codec of the user's, not a spec
    warm = False
  if warm:
    raise _validate.fail("codec", codec, "is warm-started from each "
                         "worker's previous message, which sampled clients "
                         "(clients=M) do not keep; choose a stateless codec")


def availability(name, value, s, strategy) -> str | None:
  """``availability``: None, or with ``clients`` the path of a trace that
  ``data.read_availability`` accepts (read again when a run starts)."""
  if value is None:
    return None
  if s["clients"] is None:
    raise _validate.fail(name, value, "needs clients=M (it says which of "
                         "the M clients can be drawn each round)")
  data_lib.read_availability(value, s["clients"], s["workers"])
  return str(value)
