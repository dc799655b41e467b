"""Splitting a dataset's examples among W workers (numpy, at build time).

Sharding runs once, on the host, when a run is built: it only decides which
example indices each worker owns. Sampling from the shards happens on device,
inside the jitted round (see ``_sampler.py``).
"""

import numpy as np

from lowbw import _validate

SHARDINGS = ("iid", "contiguous", "dirichlet", "source", "assigned")
# Shardings that need a group (class label or source) per example.
GROUPED = ("dirichlet", "source", "assigned")


def shard_indices(
    sharding: str,
    num_examples: int,
    num_workers: int,
    seed: int,
    labels: np.ndarray | None = None,
    alpha: float = 0.5,
) -> list[np.ndarray]:
  """Returns the example indices owned by each worker.

  ``"iid"`` and ``"contiguous"`` give every worker ``num_examples // num_workers``
  examples and drop the remainder, so that every worker sees an epoch in the
  same number of steps. ``"dirichlet"`` keeps every example and gives shards of
  different sizes (the usual non-IID benchmark of Hsu et al., 2019,
  arXiv:1909.06335): for each class, worker proportions are drawn from
  ``Dirichlet(alpha * ones(W))`` and the class's shuffled examples are cut by
  those proportions. Small ``alpha`` gives each worker few classes.

  Args:
    sharding: ``"iid"``, ``"contiguous"``, ``"dirichlet"``, ``"source"``
      (each group, a class or a text source, whole to one worker) or
      ``"assigned"`` (group w is worker w's: ``data.per_worker``).
    num_examples: N, the number of training examples.
    num_workers: W.
    seed: seeds ``np.random.default_rng`` (unused by ``"contiguous"``).
    labels: int class labels of shape (N,); required by ``"dirichlet"``.
    alpha: Dirichlet concentration, > 0.

  Returns:
    A list of W sorted int64 index arrays, pairwise disjoint.

  Example:
    >>> [s.tolist() for s in shard_indices("contiguous", 7, 3, seed=0)]
    [[0, 1], [2, 3], [4, 5]]
  """
  _validate.one_of("sharding", sharding, SHARDINGS)
  rng = np.random.default_rng(seed)
  if sharding in GROUPED:
    if labels is None:
      raise _validate.fail(
          "sharding", sharding,
          f"{sharding!r} needs class labels or sources; use 'iid' or "
          "'contiguous'")
    if sharding == "source":
      return _by_group(np.asarray(labels), num_workers)
    if sharding == "assigned":
      return _assigned(np.asarray(labels), num_workers)
    return _dirichlet(np.asarray(labels), num_workers, alpha, rng)
  per_worker = num_examples // num_workers
  if sharding == "iid":
    order = rng.permutation(num_examples)
  else:
    order = np.arange(num_examples)
  blocks = order[: per_worker * num_workers].reshape(num_workers, per_worker)
  return [np.sort(block) for block in blocks]


def _dirichlet(
    labels: np.ndarray, num_workers: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
  pieces = [[] for _ in range(num_workers)]
  for label in np.unique(labels):
    members = rng.permutation(np.flatnonzero(labels == label))
    proportions = rng.dirichlet(np.full(num_workers, alpha))
    cuts = np.floor(np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
    for worker, part in enumerate(np.split(members, cuts)):
      pieces[worker].append(part)
  return [np.sort(np.concatenate(p)).astype(np.int64) for p in pieces]


def _by_group(labels: np.ndarray, num_workers: int) -> list[np.ndarray]:
  """Every group whole to one worker: largest groups first, each to the
  worker holding fewest examples so far (ties: the lowest index)."""
  groups, sizes = np.unique(labels, return_counts=True)
  if len(groups) < num_workers:
    raise _validate.fail(
        "sharding", "source", f"gives each worker whole sources, and there "
        f"are {len(groups)} for {num_workers} workers; use fewer workers or "
        "'dirichlet'")
  held = np.zeros(num_workers, np.int64)
  pieces = [[] for _ in range(num_workers)]
  for i in np.argsort(-sizes, kind="stable"):
    worker = int(np.argmin(held))
    pieces[worker].append(np.flatnonzero(labels == groups[i]))
    held[worker] += sizes[i]
  return [np.sort(np.concatenate(p)).astype(np.int64) for p in pieces]


def _assigned(groups: np.ndarray, num_workers: int) -> list[np.ndarray]:
  """Worker w owns the examples of group w (``data.per_worker``); a group
  of -1 belongs to no one."""
  count = int(groups.max(initial=-1)) + 1
  if count != num_workers:
    raise _validate.fail(
        "workers", num_workers, f"this data gives {count} workers their "
        "own datasets (data.per_worker); run it with that many workers")
  return [np.flatnonzero(groups == w).astype(np.int64)
          for w in range(num_workers)]


def pad_shards(shards: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Stacks shards of different sizes into ``(idx_W, len_W)`` int32 arrays.

  Padding repeats index 0; the sampler never reads past ``len_W[w]``.
  """
  lengths = np.array([len(s) for s in shards], np.int32)
  idx = np.zeros((len(shards), max(1, int(lengths.max()))), np.int32)
  for worker, shard in enumerate(shards):
    idx[worker, : len(shard)] = shard
  return idx, lengths
