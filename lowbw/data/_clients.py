"""Client populations: M clients own the data, W of them train each round.

Cross-device federated learning (FedAvg, McMahan et al. 2017, arXiv
1602.05629) samples a few clients of a large population every round. lowbw
keeps only the W sampled clients live: the W worker slots of a run train,
each round, the clients drawn for it, each on its own shard. What grows with
the population is the shards' index table, ``(M, shard size)`` int32, kept
once on the device; nothing of the model does.

Which clients a round trains is a keyed random bijection of ``[0, M)``
(``_random.random_bijection``, a 4-round Feistel network) evaluated at the
slots ``0 .. W-1``, keyed by the round: W distinct clients, drawn in O(W) per
round whatever M is.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._random import random_bijection
from lowbw._types import Array, ArrayLike, Batch, PRNGKey
from lowbw.data import _sharding
from lowbw.data._sampler import WorkerSampler
from lowbw.data._source import DataSource, train_arrays

# Folded into the data key for the clients' draw; client streams fold in
# client ids, which are below 2**31, so the two never share a key.
_DRAW_TAG = 0xFFFFFFFF


def round_clients(key: PRNGKey, round_: ArrayLike, clients: int,
                  slots: ArrayLike) -> Array:
  """The clients that worker slots ``slots`` train in round ``round_``.

  The images of ``slots`` under a random bijection of ``[0, clients)``
  keyed by ``fold_in(fold_in(key, 0xFFFFFFFF), round_)``: distinct slots get
  distinct clients, every round its own draw, at a cost proportional to the
  slots (the population is never listed).

  Args:
    key: the run's data key (the same key every round).
    round_: the round, ``step // H``; may be traced.
    clients: M, the population (static).
    slots: int array of slot indices, each in ``[0, W)`` with W <= M.

  Returns:
    int32 client ids shaped like ``slots``.

  Example:
    >>> import jax
    >>> ids = round_clients(jax.random.key(0), 3, 100, jnp.arange(4))
    >>> len(set(ids.tolist())) == 4 and bool((ids < 100).all())
    True
  """
  round_key = jax.random.fold_in(jax.random.fold_in(key, _DRAW_TAG),
                                 jnp.asarray(round_, jnp.uint32))
  return random_bijection(round_key, slots, clients, clients)


def available_clients(key: PRNGKey, round_: ArrayLike, clients: int,
                      available_MP: Array, workers: int) -> Array:
  """The ``workers`` clients of round ``round_`` under an availability
  trace: the first ``workers`` clients, in the order of the round's
  bijection (``round_clients`` at positions 0, 1, 2, ...), that
  ``available_MP[:, round_ % P]`` marks available.

  Without unavailable clients this is ``round_clients`` at slots
  ``0 .. workers-1``. The positions are scanned ``workers`` at a time, so a
  round costs O(workers / f) for a fraction f of clients available.

  Args:
    key: the run's data key.
    round_: the round, ``step // H``; may be traced.
    clients: M (static).
    available_MP: bool (M, P), client c can be drawn in round r when
      ``available_MP[c, r % P]``; every column has at least ``workers``.
    workers: W, the clients drawn (static).

  Returns:
    int32 (W,): slot w's client.
  """
  round_ = jnp.asarray(round_, jnp.uint32)
  available_MP = jnp.asarray(available_MP, bool)
  column = available_MP[:, (round_ % available_MP.shape[1]).astype(jnp.int32)]
  round_key = jax.random.fold_in(jax.random.fold_in(key, _DRAW_TAG), round_)
  chunk = jnp.arange(workers, dtype=jnp.int32)

  def scan(carry):
    start, filled, out = carry
    position = start + chunk
    client = random_bijection(round_key, jnp.minimum(position, clients - 1),
                              clients, clients)
    ok = (position < clients) & column[client]
    rank = filled + jnp.cumsum(ok) - 1
    out = out.at[jnp.where(ok, rank, workers)].set(client, mode="drop")
    return start + workers, filled + ok.sum(), out

  start = (jnp.int32(0), jnp.int32(0), jnp.zeros(workers, jnp.int32))
  return jax.lax.while_loop(lambda c: c[1] < workers, scan, start)[2]


def read_availability(path, clients: int, workers: int) -> np.ndarray:
  """An availability trace: a CSV of 0 and 1, one row per client and one
  column per round of a period that repeats (client c can be drawn in round
  r when row c, column r mod P is 1); every column must make at least
  ``workers`` clients available. Returns bool (M, P); errors name
  ``availability``.

  Example:
    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.csv")
    >>> np.savetxt(path, np.ones((6, 2)), fmt="%d", delimiter=",")
    >>> read_availability(path, clients=6, workers=2).shape
    (6, 2)
  """
  path = _validate.existing_file("availability", path, "a CSV file of 0 and "
                                 "1, one row per client")
  try:
    table = np.loadtxt(path, delimiter=",", ndmin=2)
  except ValueError as e:
    raise _validate.fail("availability", path, f"expected a CSV of 0 and 1, "
                         f"one row per client ({e})") from None
  if table.shape[0] != clients:
    raise _validate.fail("availability", path, f"has {table.shape[0]} rows; "
                         f"expected one per client, clients={clients}")
  if not np.isin(table, (0, 1)).all():
    raise _validate.fail("availability", path, "holds values other than 0 "
                         "and 1 (1: the client can be drawn that round)")
  counts = table.sum(axis=0)
  if counts.min() < workers:
    r = int(np.argmin(counts))
    raise _validate.fail("availability", path, f"column {r} makes "
                         f"{int(counts[r])} clients available, fewer than "
                         f"workers={workers} (drawn every round)")
  return table.astype(bool)


def client_shards(source, clients: int, batch_size: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Every client's example indices: ``(idx_M, len_M)``, int32 ``(M, s)``
  (rows padded past ``len_M``) and ``(M,)``.

  The source's sharding splits the N training examples over the M clients
  as it splits them over workers (``shard_indices``: "iid" and "contiguous"
  give each client N // M examples). When that leaves a client fewer
  examples than ``batch_size`` (N < M * batch_size), "iid" and
  "contiguous" clients share examples instead: client c's shard is the
  ``batch_size`` examples at positions ``c*b .. c*b + b - 1`` (modulo N) of
  the seeded order of the examples (``np.random.default_rng(seed)
  .permutation(N)`` for "iid", ``0 .. N-1`` for "contiguous"), so each
  example belongs to about M * b / N clients. Other shardings cannot
  overlap: a client left with fewer than ``batch_size`` examples is an
  error naming ``clients``.

  Example:
    >>> from lowbw import data
    >>> idx, n = client_shards(data.digits(), 100_000, 8, seed=0)
    >>> idx.shape, int(n.min())
    ((100000, 8), 8)
  """
  if not isinstance(source, DataSource):
    raise _validate.fail("clients", clients, f"splits a lowbw.data.DataSource "
                         f"over its clients, not a {type(source).__name__}")
  total = source.num_examples()
  if batch_size > total:
    raise _validate.fail("batch_size", batch_size, f"expected at most "
                         f"{total}, the training examples of {source.name!r}")
  if source.sharding in ("iid", "contiguous") and total // clients < batch_size:
    return _overlapping(source.sharding, total, clients, batch_size, seed)
  try:
    shards = _sharding.shard_indices(
        source.sharding, total, clients, int(seed),
        labels=source.groups if source.groups is not None
        else source.train.get("y"), alpha=source.alpha)
  except _validate.ConfigError as e:  # its words are about workers
    raise _validate.fail(
        "clients", clients, f"{source.sharding!r} sharding cannot split "
        f"{source.name!r} over {clients} clients ({e})") from None
  sizes = np.array([len(s) for s in shards])
  if sizes.min() < batch_size:
    c = int(np.argmin(sizes))
    raise _validate.fail(
        "clients", clients, f"{source.sharding!r} sharding gives client {c} "
        f"{sizes[c]} examples, fewer than batch_size={batch_size}; use fewer "
        "clients, a smaller batch_size, or 'iid' sharding (whose clients "
        "share examples when there are too few)")
  return _sharding.pad_shards(shards)


def _overlapping(sharding: str, total: int, clients: int, size: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Client c: positions c*size .. c*size + size - 1 (mod N) of the order."""
  order = (np.random.default_rng(seed).permutation(total)
           if sharding == "iid" else np.arange(total))
  first = np.arange(clients, dtype=np.int64)[:, None] * size
  idx = order[(first + np.arange(size)) % total].astype(np.int32)
  return idx, np.full(clients, size, np.int32)


@dataclasses.dataclass(frozen=True)
class ClientSampler:
  """The W worker slots' batches when M clients own the data.

  Round r (steps ``r*H .. r*H + H - 1``) gives slot w the client
  ``round_clients(key, r, M, w)``; the slot draws its batches from that
  client's shard, in the client's own stream (``WorkerSampler.sample``
  keyed by the client's id, positions by the step). A pytree like
  ``WorkerSampler``: the arrays are leaves, the sizes static.

  Attributes:
    arrays: the training arrays on device (as ``WorkerSampler``'s).
    slot_W: int32 (W,), the global index of each slot (per device under a
      mesh, like a worker's shard).
    shard_idx_M: int32 (M, max_shard), every client's example indices.
    shard_len_M: int32 (M,), every client's example count.
    batch_size, task, seq_len, max_shard: as ``WorkerSampler``'s (static).
    clients: M (static).
    period: H, steps per round (static).
    available_MP: bool (M, P), the availability trace
      (``available_clients``), or None: every client every round.
    workers: W, the slots over all devices (static).

  Example:
    >>> import jax
    >>> from lowbw import data
    >>> sampler = data.client_sampler(data.digits(), clients=50,
    ...     num_workers=4, batch_size=8, seed=0, period=10)
    >>> sampler.sample(jax.random.key(0), 0)["y"].shape
    (4, 8)
  """

  arrays: dict[str, Array]
  slot_W: Array
  shard_idx_M: Array
  shard_len_M: Array
  batch_size: int
  task: str
  seq_len: int | None
  max_shard: int
  clients: int
  period: int
  available_MP: Array | None = None
  workers: int = 0

  @property
  def num_workers(self) -> int:
    return self.slot_W.shape[0]

  def clients_at(self, key: PRNGKey, step: ArrayLike) -> Array:
    """int32 (W,): the client each slot trains at ``step``."""
    round_ = jnp.asarray(step, jnp.uint32) // jnp.uint32(self.period)
    if self.available_MP is None:
      return round_clients(key, round_, self.clients, self.slot_W)
    drawn = available_clients(key, round_, self.clients, self.available_MP,
                              self.workers)
    return drawn[self.slot_W]

  def sample(self, key: PRNGKey, step: ArrayLike,
             worker_offset: ArrayLike = 0) -> Batch:
    """Step ``step``'s batch of every slot, from its client's shard.

    ``worker_offset`` is unused: ``slot_W`` holds the global slot indices.
    """
    del worker_offset
    client_W = self.clients_at(key, step)
    rows = WorkerSampler(
        self.arrays, self.shard_idx_M[client_W], self.shard_len_M[client_W],
        self.batch_size, self.task, self.seq_len, self.max_shard)
    return rows.sample(key, step, streams=client_W)


jax.tree_util.register_dataclass(
    ClientSampler,
    data_fields=["arrays", "slot_W", "shard_idx_M", "shard_len_M",
                 "available_MP"],
    meta_fields=["batch_size", "task", "seq_len", "max_shard", "clients",
                 "period", "workers"],
)


def client_sampler(source, clients: int, num_workers: int, batch_size: int,
                   seed: int, period: int,
                   available: np.ndarray | None = None) -> ClientSampler:
  """``source``'s examples split over ``clients`` clients
  (``client_shards``), of which ``num_workers`` train each round of
  ``period`` steps; moved to device.

  Args:
    source: a ``DataSource``.
    clients: M >= num_workers.
    num_workers: W, the clients sampled per round (the worker slots).
    batch_size: examples per slot per step.
    seed: seeds the sharding (the draw of clients is keyed by the run's
      data key).
    period: H, the strategy's steps per round.
    available: bool (M, P), an availability trace (``read_availability``),
      or None: every client can be drawn every round.

  Returns:
    A ``ClientSampler``.
  """
  clients = _validate.positive_int("clients", clients)
  if clients < num_workers:
    raise _validate.fail("clients", clients, f"must be at least "
                         f"workers={num_workers}, the clients sampled per "
                         "round")
  idx_M, len_M = client_shards(source, clients, batch_size, seed)
  return ClientSampler(
      arrays=jax.device_put(train_arrays(source)),
      slot_W=jax.device_put(np.arange(num_workers, dtype=np.int32)),
      shard_idx_M=jax.device_put(idx_M), shard_len_M=jax.device_put(len_M),
      batch_size=batch_size, task=source.task,
      seq_len=source.seq_len if source.task == "lm" else None,
      max_shard=int(idx_M.shape[1]), clients=clients, period=period,
      available_MP=None if available is None else jax.device_put(
          np.asarray(available, bool)), workers=num_workers)
