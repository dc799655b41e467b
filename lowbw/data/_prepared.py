"""A folder written by ``lowbw data prepare`` as a language-modelling
``DataSource``: the token files memory-mapped, the tokenizer beside them,
and each training window's source for non-IID sharding."""

import json
import os

import numpy as np

from lowbw import _validate
from lowbw.data import _prepare, _tokenizer
from lowbw.data._source import DataSource


# On-disk token types (little-endian), by meta.json's "dtype".
DTYPES = ("uint8", "uint16", "uint32")
# Token ids are checked against the vocabulary when the folder is opened
# (an id beyond it makes the loss NaN). Held-out splits are read whole;
# a training split over this many tokens is checked on evenly spaced
# chunks of that many in all, so a start does not read gigabytes; an id
# the chunks miss stops training with the non-finite-loss error.
_CHECK_TOKENS = 2 ** 28
_CHUNK = 2 ** 22


def is_prepared(path) -> bool:
  """Whether ``path`` is a folder written by ``lowbw data prepare``."""
  return os.path.isfile(os.path.join(os.fspath(path), "meta.json"))


def read_meta(path) -> dict:
  """The folder's ``meta.json``, checked: an object of the right format
  with a positive ``vocab_size``, a known ``dtype`` and a ``tokenizer``
  file inside the folder (the key then holds its full path)."""
  path = os.fspath(path)
  meta_path = os.path.join(path, "meta.json")
  if not os.path.isfile(meta_path):
    raise _validate.fail("data", path, "expected a folder written by "
                         "`lowbw data prepare` (it holds meta.json)")
  meta = _json_object(meta_path, path)
  if meta.get("format") != _prepare.FORMAT or not _version_ok(meta):
    raise _validate.fail("data", path, f"its meta.json is not a "
                         f"{_prepare.FORMAT} version <= {_prepare.VERSION}")
  vocab = meta.get("vocab_size")
  if isinstance(vocab, bool) or not isinstance(vocab, int) or not (
      1 <= vocab < _validate.INT_LIMIT):
    given = (f"vocab_size is {vocab!r}" if "vocab_size" in meta
             else "has no vocab_size")
    raise _validate.fail("data", path, f"its meta.json {given}; expected "
                         "the tokenizer's vocabulary size, an integer >= 1")
  dtype = meta.setdefault("dtype", "uint16")
  if dtype not in DTYPES:
    raise _validate.fail("data", path, f"its meta.json's dtype is {dtype!r}; "
                         "expected one of " + ", ".join(map(repr, DTYPES)))
  meta["tokenizer"] = own_file(path, meta, "tokenizer")
  return meta


def _json_object(meta_path: str, path: str) -> dict:
  try:
    with open(meta_path, encoding="utf-8") as f:
      meta = json.load(f)
  except ValueError as e:  # JSON and UTF-8 errors both
    raise _validate.fail("data", path, "its meta.json is not readable JSON "
                         f"({str(e).splitlines()[0]})") from None
  if not isinstance(meta, dict):
    raise _validate.fail("data", path, "its meta.json holds a JSON "
                         f"{type(meta).__name__}; expected an object with "
                         "format, vocab_size, dtype and tokenizer")
  return meta


def _version_ok(meta: dict) -> bool:
  version = meta.get("version", 0)
  return (isinstance(version, int) and not isinstance(version, bool)
          and version <= _prepare.VERSION)


def own_file(folder: str, meta: dict, key: str) -> str:
  """The file that ``meta[key]`` names, which must lie inside ``folder``:
  a folder someone else wrote must not make lowbw read (and copy into a
  run) a file elsewhere, through ``..``, an absolute path or a link."""
  name = meta.get(key)
  if not isinstance(name, str) or not name:
    raise _validate.fail("data", folder, f"its meta.json's {key} is "
                         f"{name!r}; expected a file name in the folder")
  root = os.path.realpath(folder)
  full = os.path.realpath(os.path.join(folder, name))
  if os.path.isabs(name) or os.path.commonpath([root, full]) != root:
    raise _validate.fail("data", folder, f"its meta.json's {key} {name!r} "
                         "leads out of the folder; expected a file inside it")
  if not os.path.isfile(full):
    raise _validate.fail("data", folder, f"its meta.json's {key} {name!r} "
                         "is not a file in the folder")
  return os.path.join(folder, os.path.normpath(name))


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
  vocab = meta["vocab_size"]
  train = _tokens(path, "train", meta["dtype"])
  held_out = _tokens(path, "val", meta["dtype"])
  _check_ids(path, "val", held_out, vocab, limit=None)
  _check_ids(path, "train", train, vocab, limit=_CHECK_TOKENS)
  for split, tokens in (("train", train), ("val", held_out)):
    if len(tokens) < seq_len + 1:  # said here, not as a count of windows
      raise _validate.fail(
          "data", path, f"its {split}.bin holds {len(tokens)} tokens; "
          f"expected at least seq_len + 1 = {seq_len + 1} (one window): a "
          "shorter seq_len or more text")
  _check_tokenizer(path, meta["tokenizer"], vocab)
  groups = _window_sources(path, "train", seq_len, len(train))
  return DataSource(
      name=os.path.basename(os.path.normpath(path)), task="lm",
      train={"tokens": train}, eval={"tokens": held_out}, sharding=sharding,
      alpha=alpha, seq_len=seq_len, vocab_size=vocab,
      groups=groups, tokenizer=meta["tokenizer"],
      config={"name": "prepared", "path": path, "seq_len": seq_len,
              "sharding": sharding, "alpha": alpha})


def _tokens(path: str, split: str, dtype: str) -> np.ndarray:
  file = os.path.join(path, f"{split}.bin")
  if not os.path.isfile(file):
    raise _validate.fail("data", path, f"its {split}.bin is missing; "
                         "prepare the corpus again")
  size, itemsize = os.path.getsize(file), np.dtype(dtype).itemsize
  if size % itemsize:
    raise _validate.fail("data", path, f"its {split}.bin holds {size:,} "
                         f"bytes, not a whole number of {dtype} tokens "
                         f"({itemsize} bytes each); check meta.json's dtype")
  if size == 0:
    return np.zeros(0, dtype)
  return np.memmap(file, np.dtype(dtype).newbyteorder("<"), mode="r")


def _check_ids(path: str, split: str, tokens: np.ndarray, vocab: int,
               limit: int | None) -> None:
  """Every token id (or, past ``limit`` tokens, those of evenly spaced
  chunks) must lie below ``vocab``."""
  starts = range(0, len(tokens), _CHUNK)
  if limit is not None and len(tokens) > limit:
    starts = np.linspace(0, len(tokens) - _CHUNK, limit // _CHUNK).astype(
        np.int64)
  for start in starts:
    chunk = tokens[start:start + _CHUNK]
    if len(chunk) and chunk.max() >= vocab:
      where = int(start) + int(np.argmax(chunk >= vocab))
      raise _validate.fail(
          "data", path, f"its {split}.bin holds token id {int(tokens[where])} "
          f"(token {where:,}); its meta.json's vocab_size is {vocab}, so ids "
          f"must lie in [0, {vocab})")


def _check_tokenizer(path: str, file: str, vocab: int) -> None:
  """The tokenizer is read now, not first by ``lowbw generate`` after the
  run; its ids must fit the vocabulary (which may be padded beyond it)."""
  try:
    size = _tokenizer.load(file).get_vocab_size()
  except _validate.ConfigError as e:
    raise _validate.fail("data", path, f"its tokenizer {file}: "
                         f"{e.allowed}") from None
  if size > vocab:
    raise _validate.fail("data", path, f"its tokenizer has {size} ids; its "
                         f"meta.json's vocab_size is {vocab}; expected at "
                         f"least {size}")


def _window_sources(path: str, split: str, seq_len: int,
                    num_tokens: int) -> np.ndarray:
  """The source of each training window (that of the document holding its
  first token)."""
  offsets = _index(path, f"{split}_docs.npy")
  doc_sources = _index(path, f"{split}_sources.npy")
  if len(offsets) != len(doc_sources) + 1 or not len(doc_sources):
    raise _validate.fail(
        "data", path, f"its {split}_docs.npy ({len(offsets)} offsets) and "
        f"{split}_sources.npy ({len(doc_sources)} documents) disagree; "
        "expected one offset per document plus the total")
  starts = np.arange(max(0, (num_tokens - 1) // seq_len)) * seq_len
  docs = np.searchsorted(offsets, starts, side="right") - 1
  return doc_sources[np.clip(docs, 0, len(doc_sources) - 1)].astype(np.int64)


def _index(path: str, name: str) -> np.ndarray:
  """One of the folder's 1-D integer .npy files."""
  file = os.path.join(path, name)
  if not os.path.isfile(file):
    raise _validate.fail("data", path, f"its {name} is missing; prepare the "
                         "corpus again")
  try:
    array = np.load(file, allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise _validate.fail("data", path, f"its {name} is not a readable .npy "
                         f"file ({str(e).splitlines()[0]})") from None
  if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
    raise _validate.fail("data", path, f"its {name} holds {array.dtype} "
                         f"{array.shape}; expected 1-D integers")
  return array


def tokenizer_of(path):
  """The ``encode_ids``/``decode_ids`` tokenizer of a prepared folder."""
  return _tokenizer.BPE(_tokenizer.load(read_meta(path)["tokenizer"]))
