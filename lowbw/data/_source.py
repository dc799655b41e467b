"""``DataSource``: a dataset in host memory, before it is sharded over workers."""

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from lowbw import _validate
from lowbw.data import _sharding
from lowbw.data._sampler import WorkerSampler

TASKS = ("classification", "lm")
# Class labels index the model's output layer (classes = largest label + 1),
# so a stray huge label silently builds a gigantic one. 2**20 classes is ~50x
# ImageNet-21k's 21,841; beyond that a label is taken for a mistake.
LABEL_LIMIT = 2 ** 20
_EVAL_BATCH_LIMIT = 512
# Text windows per evaluation batch are capped in tokens as well: a long
# context's attention activations grow with T^2, and 512 windows of 1,024
# tokens of a 12-block model need tens of GiB at once.
_EVAL_TOKEN_LIMIT = 65_536
_LM_EVAL_DEFAULT = 256


# eq=False: the fields hold numpy arrays, whose == is element-wise, so the
# generated __eq__ would raise; identity is the useful equality here.
@dataclasses.dataclass(frozen=True, eq=False)
class DataSource:
  """A dataset: train and held-out arrays plus how to shard them over workers.

  Built by the factories (``digits``, ``text_bytes``, ``arrays``,
  ``token_file``); ``build`` turns it into a ``WorkerSampler`` on device.

  Attributes:
    name: a human-readable label.
    task: ``"classification"`` (arrays ``x`` float32 (N, ...), ``y`` int32
      (N,)) or ``"lm"`` (array ``tokens`` uint8/uint16 (N_tokens,)).
    train: the training arrays.
    eval: held-out arrays with the same keys.
    sharding: ``"iid"``, ``"contiguous"``, ``"dirichlet"`` or ``"source"``
      (these two by class label, or by text source where ``groups`` is
      given); see ``build``.
    alpha: Dirichlet concentration (used by ``"dirichlet"``).
    seq_len: tokens per lm example (the model sees ``seq_len + 1`` tokens:
      inputs and shifted targets).
    vocab_size: lm only: 256 for bytes, max token + 1 for token files.
    config: JSON-serialisable ``{"name": factory name, **kwargs}``; arrays
      passed in memory appear as a description string.
    groups: optional: an int group (the source) of each training example
      (text: window), for ``"source"``, ``"dirichlet"`` and ``"assigned"``
      sharding; classification falls back to its labels.
    tokenizer: lm only, optional: the ``tokenizer.json`` the tokens were
      made with (None: bytes).
    notes: what loading left out or changed that a user must hear of (files
      skipped as not text); every run on the source lists them among its
      warnings.

  Example:
    >>> import numpy as np
    >>> source = DataSource(
    ...     name="toy", task="classification",
    ...     train={"x": np.zeros((8, 2), np.float32), "y": np.arange(8) % 2},
    ...     eval={"x": np.zeros((2, 2), np.float32), "y": np.arange(2)})
    >>> source.num_examples()
    8
  """

  name: str
  task: str
  train: dict[str, np.ndarray]
  eval: dict[str, np.ndarray]
  sharding: str = "iid"
  alpha: float = 0.5
  seq_len: int | None = None
  vocab_size: int | None = None
  config: dict[str, Any] = dataclasses.field(default_factory=dict)
  groups: np.ndarray | None = None
  tokenizer: str | None = None
  notes: tuple[str, ...] = ()

  def __post_init__(self):
    self._check()

  def _check(self):
    _validate.one_of("task", self.task, TASKS)
    _validate.one_of("sharding", self.sharding, _sharding.SHARDINGS)
    _validate.positive_float("alpha", self.alpha)
    if self.task == "lm":
      self._check_lm()
    else:
      self._check_classification()

  def _check_lm(self):
    if self.sharding in _sharding.GROUPED and self.groups is None:
      raise _validate.fail(
          "sharding", self.sharding,
          f"{self.sharding!r} splits examples by class label or source, and "
          "this text has neither (a corpus made by `lowbw data prepare` "
          "has sources); expected 'iid' or 'contiguous'")
    _validate.positive_int("seq_len", self.seq_len)
    if self.groups is not None and len(self.groups) != self.num_examples():
      raise _validate.fail(
          "groups", f"<{len(self.groups)} groups>",
          f"expected one per training window ({self.num_examples()})")
    _validate.positive_int("vocab_size", self.vocab_size)
    for part, arrays in (("train", self.train), ("eval", self.eval)):
      tokens = arrays.get("tokens")
      if (tokens is None or tokens.ndim != 1
          or not np.issubdtype(tokens.dtype, np.integer)):
        raise _validate.fail(
            part, {k: getattr(v, "shape", v) for k, v in arrays.items()},
            "expected {'tokens': a 1-D uint8/uint16 array}")
      if len(tokens) < self.seq_len + 1:
        raise _validate.fail(
            f"{part}['tokens']", f"<{len(tokens)} tokens>",
            f"expected at least seq_len + 1 = {self.seq_len + 1} tokens "
            "(one example); use a shorter seq_len or more data")
    if len(self.train["tokens"]) >= 2**31:
      raise _validate.fail(
          "train['tokens']", f"<{len(self.train['tokens'])} tokens>",
          "expected fewer than 2**31 tokens (int32 offsets on device)")

  def _check_classification(self):
    for part, arrays in (("train", self.train), ("eval", self.eval)):
      x, y = arrays.get("x"), arrays.get("y")
      if x is None or y is None or y.ndim != 1 or len(x) != len(y):
        raise _validate.fail(
            part, {k: getattr(v, "shape", v) for k, v in arrays.items()},
            "expected {'x': (N, ...), 'y': (N,)} with the same N")
      if len(y) == 0:
        raise _validate.fail(part, "<0 examples>", "expected at least one")
      if not np.issubdtype(y.dtype, np.integer):
        raise _validate.fail(
            f"{part}['y']", f"<array {y.dtype} {y.shape}>",
            "expected integer class labels")
      check_label_range(f"{part}['y']", y)
    if self.train["x"].shape[1:] != self.eval["x"].shape[1:]:
      raise _validate.fail(
          "eval['x']", self.eval["x"].shape,
          f"expected examples shaped like train's {self.train['x'].shape[1:]}")

  @property
  def tokens_per_example(self) -> int | None:
    """``seq_len`` for lm (tokens predicted per example), None otherwise."""
    return self.seq_len if self.task == "lm" else None

  @property
  def num_classes(self) -> int | None:
    """Classification: largest label (train or eval) + 1; lm: None."""
    if self.task != "classification":
      return None
    return int(max(self.train["y"].max(), self.eval["y"].max())) + 1

  def num_examples(self) -> int:
    """Training examples: rows of ``x``, or lm windows ``(N_tokens - 1) // seq_len``."""
    if self.task == "lm":
      return (len(self.train["tokens"]) - 1) // self.seq_len
    return len(self.train["y"])

  def example_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    """One worker's batch of the first ``batch_size`` training examples (numpy).

    Shapes match what ``WorkerSampler.sample`` gives one worker, so it serves
    to initialise a model.

    Args:
      batch_size: number of examples, at most ``num_examples()``.

    Returns:
      ``{"x": float32 (b, ...), "y": int32 (b,)}`` or
      ``{"tokens": int32 (b, seq_len + 1)}``.

    Example:
      >>> from lowbw import data
      >>> data.digits().example_batch(4)["x"].shape
      (4, 8, 8, 1)
    """
    _validate.positive_int("batch_size", batch_size)
    available = self.num_examples()
    if batch_size > available:
      raise _validate.fail(
          "batch_size", batch_size,
          f"expected at most {available} (the number of training examples)")
    if self.task == "lm":
      return {"tokens": _windows(self.train["tokens"], self.seq_len, batch_size)}
    return {
        "x": np.asarray(self.train["x"][:batch_size], np.float32),
        "y": np.asarray(self.train["y"][:batch_size], np.int32),
    }

  def check_workers(self, num_workers: int) -> None:
    """Every worker needs a training example (the build checks it before
    anything runs; ``build`` again when it shards)."""
    total = self.num_examples()
    if total < num_workers:
      raise _validate.fail(
          "workers", num_workers,
          f"expected at most {total}, the number of training examples of "
          f"{self.name!r}")

  def build(self, num_workers: int, batch_size: int, seed: int) -> WorkerSampler:
    """Shards the training set over workers and moves it to device.

    ``"iid"`` permutes all N examples with ``np.random.default_rng(seed)`` and
    gives each worker ``N // W`` of them; ``"contiguous"`` gives worker w the
    examples ``[w*n, (w+1)*n)`` with ``n = N // W``. Both drop the remaining
    ``N % W`` examples. ``"dirichlet"`` keeps every example, with shards of
    different sizes.

    Args:
      num_workers: W, an int >= 1, at most N.
      batch_size: examples per worker per step, at most the smallest shard.
      seed: an int >= 0 that seeds the sharding.

    Returns:
      A ``WorkerSampler`` whose ``sample(key, step)`` gives (W, b, ...) batches.

    Raises:
      ValueError: naming the field when a value does not fit this dataset.

    Example:
      >>> from lowbw import data
      >>> sampler = data.digits().build(num_workers=4, batch_size=16, seed=0)
      >>> sampler.shard_idx_W.shape
      (4, 359)
    """
    _validate.positive_int("workers", num_workers)
    _validate.positive_int("batch_size", batch_size)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise _validate.fail("seed", seed, "expected an integer >= 0")
    # Also checked at construction; repeated because `build` is the boundary
    # the engine relies on, whatever happened to the source since.
    self._check()
    self.check_workers(num_workers)
    total = self.num_examples()
    shards = _sharding.shard_indices(
        self.sharding, total, num_workers, int(seed),
        labels=self.groups if self.groups is not None
        else self.train.get("y"),
        alpha=self.alpha)
    self._check_batch_fits(shards, batch_size)
    shard_idx_W, shard_len_W = _sharding.pad_shards(shards)
    return WorkerSampler(
        arrays=jax.device_put(train_arrays(self)),
        shard_idx_W=jax.device_put(shard_idx_W),
        shard_len_W=jax.device_put(shard_len_W),
        batch_size=batch_size,
        task=self.task,
        seq_len=self.seq_len if self.task == "lm" else None,
        max_shard=int(shard_idx_W.shape[1]),
    )

  def _check_batch_fits(self, shards: list[np.ndarray], batch_size: int):
    sizes = [len(s) for s in shards]
    worker = int(np.argmin(sizes))
    if batch_size <= sizes[worker]:
      return
    if self.sharding == "dirichlet":
      hint = (f"Dirichlet shards differ in size; raise alpha={self.alpha}, "
              "use fewer workers, or use 'iid' sharding")
    else:
      hint = (f"{self.sharding!r} sharding gives each of {len(shards)} workers "
              f"{self.num_examples()} // {len(shards)} examples; use fewer "
              "workers or a smaller batch_size")
    raise ValueError(
        f"batch_size={batch_size} is larger than worker {worker}'s shard of "
        f"{sizes[worker]} examples; expected batch_size <= {sizes[worker]} "
        f"(the smallest shard). {hint}.")

  def eval_batches(self, max_examples: int | None = None) -> dict[str, np.ndarray]:
    """Held-out data as ``num_batches`` equal batches (numpy).

    Classification uses every eval example (or the first ``max_examples``); lm
    uses ``max_examples`` (default 256) non-overlapping windows of the eval
    tokens, spread evenly over the whole held-out stream (so every held-out
    file is represented, not just the first few). With n examples and a
    limit of L examples per batch (512; for text also at most 65,536
    tokens), ``num_batches = ceil(n / L)`` and
    ``eval_batch = n // num_batches``; the last ``n % num_batches`` examples are
    dropped so every batch has the same shape.

    Args:
      max_examples: optional cap on the number of eval examples.

    Returns:
      The eval arrays with leading axes (num_batches, eval_batch).

    Example:
      >>> from lowbw import data
      >>> data.digits().eval_batches()["x"].shape
      (1, 359, 8, 8, 1)
    """
    _validate.optional_positive_int("max_examples", max_examples)
    if self.task == "lm":
      tokens = self.eval["tokens"]
      available = (len(tokens) - 1) // self.seq_len
      n = min(available, max_examples or _LM_EVAL_DEFAULT)
      arrays = {"tokens": _windows(tokens, self.seq_len, n, spread=True)}
    else:
      n = min(len(self.eval["y"]), max_examples or len(self.eval["y"]))
      arrays = {
          "x": np.asarray(self.eval["x"][:n], np.float32),
          "y": np.asarray(self.eval["y"][:n], np.int32),
      }
    limit = _EVAL_BATCH_LIMIT
    if self.task == "lm":
      limit = min(limit, max(1, _EVAL_TOKEN_LIMIT // self.seq_len))
    num_batches = math.ceil(n / limit)
    per_batch = n // num_batches
    return {
        k: v[: num_batches * per_batch].reshape(num_batches, per_batch, *v.shape[1:])
        for k, v in arrays.items()
    }


def check_label_range(field: str, y: np.ndarray) -> None:
  """Class labels (integers, or floats already checked to be whole) must lie
  in [0, LABEL_LIMIT): the number of classes is the largest label + 1, and
  a negative one indexes nothing."""
  if not len(y):
    return
  low, high = y.min().item(), y.max().item()
  if low >= 0 and high < LABEL_LIMIT:
    return
  where = int(np.argmin(y) if low < 0 else np.argmax(y))
  bad = _label(low if low < 0 else high)
  why = ("is negative" if low < 0 else "would make a model with that many "
         "output classes (classes = largest label + 1)")
  raise _validate.fail(
      field, f"<labels from {_label(low)} to {_label(high)}>",
      f"expected integer class labels in [0, 2**20); label {bad} (example "
      f"{where}) {why}. Number the classes 0..n-1, e.g. "
      "np.unique(y, return_inverse=True)[1]")


def _label(value) -> str:
  return f"{value:.6g}" if abs(value) >= 1e15 else str(int(value))


def _windows(tokens: np.ndarray, seq_len: int, count: int,
             spread: bool = False) -> np.ndarray:
  """``count`` lm examples ``tokens[i*T : i*T + T + 1]`` (int32): the first
  ones, or with ``spread`` window indices i spread evenly over all windows."""
  available = (len(tokens) - 1) // seq_len
  index = (np.linspace(0, available - 1, count).round().astype(np.int64)
           if spread else np.arange(count))
  offsets = index[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
  return tokens[offsets].astype(np.int32)


def train_arrays(source: DataSource) -> dict[str, np.ndarray]:
  """The training arrays a sampler puts on device: ``{"x": float32, "y":
  int32}`` for classification, ``{"tokens"}`` for lm."""
  if source.task == "lm":
    return {"tokens": source.train["tokens"]}
  return {"x": np.asarray(source.train["x"], np.float32),
          "y": np.asarray(source.train["y"], np.int32)}
