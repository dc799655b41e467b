"""``data.per_worker``: each worker trains on a dataset of its own (a
client's data in federated learning, a site's corpus), one ``DataSource``
per worker, joined into one whose shards are exactly those datasets."""

import dataclasses

import numpy as np

from lowbw import _validate
from lowbw.data._source import DataSource


def per_worker(sources: list[DataSource]) -> DataSource:
  """One dataset per worker: worker w samples only ``sources[w]``'s
  training examples; the evaluation set is all of theirs together.

  Args:
    sources: W sources of one task (all classification with the same
      example shape, or all text with the same ``seq_len`` and tokenizer),
      or their ``config`` dicts; run with ``workers=len(sources)``.

  Returns:
    A ``DataSource`` with ``sharding="assigned"``. Text windows never
    cross from one worker's tokens into the next's.

  Example:
    >>> import numpy as np
    >>> from lowbw import data
    >>> rng = np.random.default_rng(0)
    >>> parts = [data.arrays(rng.normal(size=(40, 3)), np.full(40, k % 2))
    ...          for k in range(3)]
    >>> joined = data.per_worker(parts)
    >>> sampler = joined.build(num_workers=3, batch_size=4, seed=0)
    >>> [int(n) for n in sampler.shard_len_W]
    [36, 36, 36]
  """
  from lowbw.data import get  # a config's sources are rebuilt by name
  sources = [get(**s) if isinstance(s, dict) else s for s in sources]
  if not sources or not all(isinstance(s, DataSource) for s in sources):
    raise _validate.fail("sources", sources, "expected a list of DataSource, "
                         "one per worker")
  task = sources[0].task
  for k, s in enumerate(sources):
    if s.task != task:
      raise _validate.fail(f"sources[{k}]", s.name, f"is {s.task} data; "
                           f"sources[0] is {task}")
  joined = _text(sources) if task == "lm" else _labelled(sources)
  return dataclasses.replace(
      joined, name="per_worker(" + ", ".join(s.name for s in sources) + ")",
      sharding="assigned",
      config={"name": "per_worker",
              "sources": [s.config for s in sources]})


def _labelled(sources: list[DataSource]) -> DataSource:
  shape = sources[0].train["x"].shape[1:]
  for k, s in enumerate(sources):
    if s.train["x"].shape[1:] != shape:
      raise _validate.fail(f"sources[{k}]", s.name, f"has examples shaped "
                           f"{s.train['x'].shape[1:]}; sources[0]'s are "
                           f"{shape}")
  join = lambda part, key: np.concatenate(  # noqa: E731
      [getattr(s, part)[key] for s in sources])
  groups = np.concatenate([np.full(len(s.train["y"]), k, np.int64)
                           for k, s in enumerate(sources)])
  return DataSource(
      name="", task="classification",
      train={"x": join("train", "x"), "y": join("train", "y")},
      eval={"x": join("eval", "x"), "y": join("eval", "y")},
      sharding="assigned", groups=groups)


def _text(sources: list[DataSource]) -> DataSource:
  """Token streams laid end to end, each padded to whole windows so that
  window i starts at i * seq_len for every source; the window that would
  straddle two sources is nobody's (group -1)."""
  seq_len = sources[0].seq_len
  pieces, groups = [], []
  for k, s in enumerate(sources):
    if s.seq_len != seq_len:
      raise _validate.fail(f"sources[{k}]", s.name, f"has seq_len "
                           f"{s.seq_len}; sources[0]'s is {seq_len}")
    windows = s.num_examples()
    tokens = np.asarray(s.train["tokens"][:windows * seq_len + 1])
    pad = np.zeros(seq_len - 1, tokens.dtype)
    pieces.append(np.concatenate([tokens, pad]))  # windows + 1 windows long
    groups.append(np.concatenate([np.full(windows, k), [-1]]))
  tokens = np.concatenate(pieces + [np.zeros(1, pieces[0].dtype)])
  held_out = np.concatenate([np.asarray(s.eval["tokens"]) for s in sources])
  tokenizers = {_read(s.tokenizer) for s in sources}
  if len(tokenizers) > 1:
    raise _validate.fail("sources", [s.name for s in sources], "were "
                         "tokenized differently (their tokenizer.json "
                         "differ), so their token ids mean different things")
  return DataSource(
      name="", task="lm", train={"tokens": tokens},
      eval={"tokens": held_out}, sharding="assigned", seq_len=seq_len,
      vocab_size=max(s.vocab_size for s in sources),
      groups=np.concatenate(groups).astype(np.int64),
      tokenizer=sources[0].tokenizer)


def _read(path: str | None) -> bytes | None:
  if path is None:
    return None
  with open(path, "rb") as f:
    return f.read()
