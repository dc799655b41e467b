"""A folder written by ``lowbw data prepare`` as a language-modelling
``DataSource``: the token files memory-mapped, the tokenizer beside them,
and each training window's source for non-IID sharding."""

import json
import os

import numpy as np

from lowbw import _validate
from lowbw.data import _prepare, _tokenizer
from lowbw.data._source import DataSource


def is_prepared(path) -> bool:
  """Whether ``path`` is a folder written by ``lowbw data prepare``."""
  return os.path.isfile(os.path.join(os.fspath(path), "meta.json"))


def read_meta(path) -> dict:
  path = os.fspath(path)
  meta_path = os.path.join(path, "meta.json")
  if not os.path.isfile(meta_path):
    raise _validate.fail("data", path, "expected a folder written by "
                         "`lowbw data prepare` (it holds meta.json)")
  with open(meta_path) as f:
    meta = json.load(f)
  if meta.get("format") != _prepare.FORMAT or meta.get("version", 0) > (
      _prepare.VERSION):
    raise _validate.fail("data", path, f"its meta.json is not a "
                         f"{_prepare.FORMAT} version <= {_prepare.VERSION}")
  return meta


def prepared(path, seq_len: int = 128, sharding: str = "iid",
             alpha: float = 0.5) -> DataSource:
  """Language modelling on a corpus prepared by ``lowbw data prepare``.

  Args:
    path: the prepared folder.
    seq_len: tokens per example (each example is ``seq_len + 1`` tokens).
    sharding: ``"iid"`` (random windows), ``"contiguous"`` (worker w takes
      the w-th block of windows in corpus order, so whole runs of
      documents), ``"source"`` (every source's windows whole to one worker)
      or ``"dirichlet"`` (each source's windows split over workers by
      Dirichlet(alpha) proportions).
    alpha: the Dirichlet concentration.

  Returns:
    An lm ``DataSource`` of uint16 tokens, memory-mapped; its
    ``vocab_size`` is the tokenizer's and its ``groups`` are the training
    windows' sources.

  Example:
    >>> import os, tempfile
    >>> from lowbw import data
    >>> root = tempfile.mkdtemp()
    >>> with open(os.path.join(root, "a.txt"), "w") as f:
    ...   _ = f.write("\\n\\n".join(f"Paragraph {i} of a small corpus." * 20
    ...                           for i in range(40)))
    >>> meta = data.prepare(os.path.join(root, "a.txt"),
    ...                     os.path.join(root, "out"), vocab_size=300)
    >>> source = data.prepared(os.path.join(root, "out"), seq_len=16)
    >>> source.vocab_size
    300
  """
  path = os.fspath(path)
  meta = read_meta(path)
  _validate.positive_int("seq_len", seq_len)
  train = _tokens(path, "train")
  held_out = _tokens(path, "val")
  groups = _window_sources(path, "train", seq_len, len(train))
  return DataSource(
      name=os.path.basename(os.path.normpath(path)), task="lm",
      train={"tokens": train}, eval={"tokens": held_out}, sharding=sharding,
      alpha=alpha, seq_len=seq_len, vocab_size=int(meta["vocab_size"]),
      groups=groups, tokenizer=os.path.join(path, meta["tokenizer"]),
      config={"name": "prepared", "path": path, "seq_len": seq_len,
              "sharding": sharding, "alpha": alpha})


def _tokens(path: str, split: str) -> np.ndarray:
  file = os.path.join(path, f"{split}.bin")
  if not os.path.isfile(file):
    raise _validate.fail("data", path, f"its {split}.bin is missing; "
                         "prepare the corpus again")
  if os.path.getsize(file) == 0:
    return np.zeros(0, np.uint16)
  return np.memmap(file, np.uint16, mode="r")


def _window_sources(path: str, split: str, seq_len: int,
                    num_tokens: int) -> np.ndarray:
  """The source of each training window (that of the document holding its
  first token)."""
  offsets = np.load(os.path.join(path, f"{split}_docs.npy"))
  doc_sources = np.load(os.path.join(path, f"{split}_sources.npy"))
  starts = np.arange(max(0, (num_tokens - 1) // seq_len)) * seq_len
  docs = np.searchsorted(offsets, starts, side="right") - 1
  return doc_sources[np.clip(docs, 0, len(doc_sources) - 1)].astype(np.int64)


def tokenizer_of(path):
  """The ``encode_ids``/``decode_ids`` tokenizer of a prepared folder."""
  meta = read_meta(path)
  return _tokenizer.BPE(_tokenizer.load(
      os.path.join(os.fspath(path), meta["tokenizer"])))
