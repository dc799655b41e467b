"""Spreading the workers over devices and hosts.

W workers over N devices: a ``Mesh`` with one axis, ``"workers"``; every
per-worker leaf (axis 0 of size W) is split into N contiguous slices of W/N
workers, everything else is replicated. Over several hosts
(``jax.distributed``) the mesh spans every process's devices and each process
holds its own devices' slices; the program is the same.
"""

import dataclasses
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lowbw import _validate
from lowbw.data import ClientSampler, WorkerSampler
from lowbw.simulation._engine import MESH_AXIS

_WORKERS = PartitionSpec(MESH_AXIS)
_REPLICATED = PartitionSpec()


def initialize(coordinator: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins a multi-process run (``jax.distributed.initialize``).

  Call it before anything else uses JAX. Missing arguments come from
  ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``
  (then from JAX's cluster detection, e.g. SLURM). On CPU the processes'
  collectives go over gloo.

  Args:
    coordinator: ``host:port`` of process 0's coordination service.
    num_processes: K, the number of processes.
    process_id: this process's index in [0, K).

  Raises:
    ValueError: a malformed value, naming it.
  """
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and "JAX_NUM_PROCESSES" in os.environ:
    num_processes = _env_int("JAX_NUM_PROCESSES")
  if process_id is None and "JAX_PROCESS_ID" in os.environ:
    process_id = _env_int("JAX_PROCESS_ID")
  if coordinator is not None:
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
      raise _validate.fail("coordinator", coordinator, "expected host:port")
  if num_processes is not None:
    _validate.positive_int("num_processes", num_processes)
  if process_id is not None:
    _validate.non_negative_int("process_id", process_id)
    if num_processes is not None and process_id >= num_processes:
      raise _validate.fail("process_id", process_id,
                           f"must be below num_processes={num_processes}")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator,
                             num_processes=num_processes,
                             process_id=process_id)


def _env_int(name):
  value = os.environ[name]
  try:
    return int(value)
  except ValueError:
    raise _validate.fail(name, value, "expected an integer") from None


def make_mesh(devices: int) -> Mesh:
  """A one-axis mesh (``"workers"``) over the first ``devices`` devices."""
  return Mesh(np.asarray(jax.devices()[:devices]), (MESH_AXIS,))


def strategy_specs(strategy, params, num_workers: int, key):
  """Which leaves of the strategy's state are per worker.

  A leaf is per worker when its leading axis changes with the number of
  workers: the state's shapes are compared for W and another worker count
  the strategy accepts (a multiple of W, else a divisor: SPES needs W to
  divide its experts), so a global tensor that happens to have W rows is
  not mistaken for one.
  """
  def shapes_for(w):
    return jax.eval_shape(lambda p, k: strategy.init(p, w, k), params, key)

  shapes = shapes_for(num_workers)
  others = [k * num_workers for k in (2, 3, 5)] + [
      num_workers // d for d in (2, 3, 5) if num_workers % d == 0]
  more = None
  for w in others:
    try:
      more = shapes_for(w)
      break
    except ValueError:  # e.g. a group size that must equal W
      continue
  if more is None:  # the strategy only accepts this W: leading axis W
    flags = jax.tree.map(lambda s: bool(s.shape) and s.shape[0] == num_workers,
                         shapes)
  else:
    flags = jax.tree.map(lambda a, b: a.shape != b.shape, shapes, more)
  return jax.tree.map(lambda f: _WORKERS if f else _REPLICATED, flags)


def active_specs(masks: bool):
  """The engine's participation mask is per worker (when there is one)."""
  return _WORKERS if masks else None


def fleet_specs(asynchronous):
  """An asynchronous schedule's state is per worker (when there is one),
  but for the syncer's clock, which every device keeps the same."""
  if not asynchronous:
    return None
  from lowbw.simulation._pace import Fleet
  return Fleet(*(_WORKERS,) * 7, _REPLICATED, _REPLICATED)


def sampler_specs(sampler):
  """A ``WorkerSampler``'s shards are per worker; the dataset is replicated.
  A ``ClientSampler``'s slots are per worker; its clients' shards are
  replicated (any device's slot may draw any client)."""
  if isinstance(sampler, ClientSampler):
    return dataclasses.replace(
        jax.tree.map(lambda _: _REPLICATED, sampler), slot_W=_WORKERS)
  if not isinstance(sampler, WorkerSampler):
    raise _validate.fail("data", type(sampler).__name__,
                         "spreading workers over devices needs a data source "
                         "whose build() returns a lowbw.data.WorkerSampler")
  return WorkerSampler(
      arrays=jax.tree.map(lambda _: _REPLICATED, sampler.arrays),
      shard_idx_W=_WORKERS, shard_len_W=_WORKERS,
      batch_size=sampler.batch_size, task=sampler.task,
      seq_len=sampler.seq_len, max_shard=sampler.max_shard)


def replicated(tree):
  """Specs that replicate every leaf of ``tree``."""
  return jax.tree.map(lambda _: _REPLICATED, tree)


def is_spec(x):
  return isinstance(x, PartitionSpec)


def shardings(tree, specs, mesh: Mesh):
  """The ``NamedSharding`` of every leaf of ``tree`` (arrays or shapes) as
  ``specs`` (a prefix of ``tree``) say."""
  return jax.tree.map(
      lambda spec, sub: jax.tree.map(lambda _: NamedSharding(mesh, spec), sub),
      specs, tree, is_leaf=is_spec)


def place(tree, specs, mesh: Mesh):
  """Puts ``tree`` on ``mesh`` as ``specs`` say (works across processes:
  every process passes the same values and keeps its devices' slices)."""

  if jax.process_count() == 1:  # one transfer call for the whole tree
    return jax.device_put(tree, shardings(tree, specs, mesh))

  def one(x, spec):
    sharding = NamedSharding(mesh, spec)
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(one(jax.random.key_data(x), spec),
                                      impl=impl)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding,
                                        lambda index: host[index])

  return jax.tree.map(lambda spec, sub: jax.tree.map(lambda x: one(x, spec), sub),
                      specs, tree, is_leaf=is_spec)


def to_host(tree):
  """numpy copies of replicated outputs, also when other processes hold
  devices of the same array."""

  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      x = x.addressable_data(0)
    return np.asarray(x)

  return jax.tree.map(one, tree)
