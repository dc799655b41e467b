"""Byte-level language modelling on a text corpus; by default, Python's stdlib."""

import os
import pathlib
import sysconfig
from typing import NamedTuple

import numpy as np

from lowbw import _validate
from lowbw.data import _common
from lowbw.data._source import DataSource

# Tests, vendored tools and caches would repeat or skew the corpus.
_STDLIB_SKIP = frozenset({
    "site-packages", "dist-packages", "test", "tests", "__pycache__",
    "idlelib", "lib2to3",
})
_SEPARATOR = b"\n"
_SINGLE_FILE_EVAL_FRACTION = 0.05


class Corpus(NamedTuple):
  """A loaded corpus: bytes and the files they came from (posix, relative)."""
  train: np.ndarray
  eval: np.ndarray
  train_files: tuple[str, ...]
  eval_files: tuple[str, ...]
  skipped: tuple[str, ...] = ()  # files under the root that are not UTF-8


# Loading the stdlib reads ~600 files; callers build sources more than once.
_CACHE: dict[tuple[str | None, int], Corpus] = {}


def _stdlib_files() -> list[tuple[str, bytes]]:
  # Skipped folders are pruned, not walked: site-packages alone can hold
  # tens of thousands of files (walking it took 0.3 s of every start).
  root = sysconfig.get_paths()["stdlib"]
  found = []
  for folder, subfolders, names in os.walk(root):
    subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIP]
    for name in names:
      path = pathlib.Path(folder, name)
      if name.endswith(".py") and path.is_file():
        found.append((path.relative_to(root).as_posix(), path.read_bytes()))
  return sorted(found)


def _text_files(root: pathlib.Path) -> tuple[list[tuple[str, bytes]],
                                             tuple[str, ...]]:
  """(name, bytes) of each UTF-8 file under ``root``, and the names of the
  others, which are left out (a folder may hold a few binaries)."""
  paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
  found, skipped = [], []
  for path in paths:
    content = path.read_bytes()
    name = path.name if path == root else path.relative_to(root).as_posix()
    try:
      content.decode("utf-8")
    except UnicodeDecodeError:
      skipped.append(name)
      continue
    found.append((name, content))
  if skipped and root.is_file():
    raise _validate.fail("root", str(root), "is not UTF-8 text; expected a "
                         "text file or a folder of them")
  return sorted(found), tuple(sorted(skipped))


def load_corpus(root: str | None, eval_every_nth_file: int) -> Corpus:
  """Reads (or returns the cached) corpus under ``root``; see ``text_bytes``."""
  if root is not None:
    root = os.path.abspath(os.fspath(root))
  key = (root, eval_every_nth_file)
  if key in _CACHE:
    return _CACHE[key]
  skipped = ()
  if root is None:
    files = _stdlib_files()
  else:
    if not os.path.exists(root):
      raise _validate.fail("root", root, "expected an existing file or folder")
    files, skipped = _text_files(pathlib.Path(root))
  if not files:
    raise _validate.fail(
        "root", root if root is not None else sysconfig.get_paths()["stdlib"],
        "expected at least one UTF-8 text file under it")
  if len(files) < 2:
    name, content = files[0]
    cut = len(content) - int(round(_SINGLE_FILE_EVAL_FRACTION * len(content)))
    train, held_out = content[:cut], content[cut:]
    train_files = eval_files = (name,)
  else:
    held = [f for i, f in enumerate(files) if i % eval_every_nth_file == 0]
    kept = [f for i, f in enumerate(files) if i % eval_every_nth_file != 0]
    if not kept:
      raise _validate.fail(
          "eval_every_nth_file", eval_every_nth_file,
          "expected an integer >= 2 (1 holds out every file)")
    train = _SEPARATOR.join(content for _, content in kept)
    held_out = _SEPARATOR.join(content for _, content in held)
    train_files = tuple(name for name, _ in kept)
    eval_files = tuple(name for name, _ in held)
  corpus = Corpus(
      train=_common.frozen(np.frombuffer(train, np.uint8)),
      eval=_common.frozen(np.frombuffer(held_out, np.uint8)),
      train_files=train_files,
      eval_files=eval_files,
      skipped=skipped,
  )
  _CACHE[key] = corpus
  return corpus


def text_bytes(
    seq_len: int = 128,
    root: str | os.PathLike[str] | None = None,
    sharding: str = "iid",
    eval_every_nth_file: int = 20,
) -> DataSource:
  """Byte-level language modelling (vocabulary of 256) on a folder of text.

  With ``root=None`` the corpus is the running Python's standard library
  sources (``sysconfig.get_paths()["stdlib"]``): every ``*.py`` file outside
  test suites, ``site-packages``, ``idlelib`` and ``lib2to3``, about 11 MB on
  Python 3.11, present wherever Python is, so no download is needed. With a
  ``root``, every regular file under it (recursively) that decodes as UTF-8
  (the others are left out, and every run on the source says how many in
  its warnings); ``root`` may also be a single file, which must be UTF-8
  text.

  Files are sorted by relative posix path, which makes the corpus the same on
  every load. Every ``eval_every_nth_file``-th file (``i % n == 0``) is held out
  for evaluation, so eval text is never trained on; with a single file, its
  last 5% of bytes are held out instead. Files are joined with ``b"\\n"``.
  Loaded corpora are cached per ``(root, eval_every_nth_file)``.

  Args:
    seq_len: tokens per example; each example is ``seq_len + 1`` bytes.
    root: a folder (or file) of text; None for the stdlib sources.
    sharding: ``"iid"`` or ``"contiguous"`` (byte windows have no labels).
    eval_every_nth_file: hold out one file in this many, an int >= 2.

  Returns:
    An lm ``DataSource`` of uint8 tokens with ``vocab_size=256``.

  Example:
    >>> from lowbw import data
    >>> source = data.text_bytes(seq_len=64)
    >>> source.example_batch(2)["tokens"].shape
    (2, 65)
  """
  _validate.positive_int("seq_len", seq_len)
  _validate.positive_int("eval_every_nth_file", eval_every_nth_file)
  corpus = load_corpus(root, eval_every_nth_file)
  return DataSource(
      name="python-stdlib" if root is None else f"text:{os.fspath(root)}",
      task="lm",
      train={"tokens": corpus.train},
      eval={"tokens": corpus.eval},
      sharding=sharding,
      seq_len=seq_len,
      vocab_size=256,
      notes=_skipped_note(root, corpus.skipped),
      config={"name": "text_bytes", "seq_len": seq_len,
              "root": None if root is None else os.fspath(root),
              "sharding": sharding, "eval_every_nth_file": eval_every_nth_file},
  )


def _skipped_note(root, skipped: tuple[str, ...]) -> tuple[str, ...]:
  if not skipped:
    return ()
  return (f"the text under {os.fspath(root)} left out {len(skipped)} "
          f"file(s) that are not UTF-8 text (e.g. {skipped[0]})",)
