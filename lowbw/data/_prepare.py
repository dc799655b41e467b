"""``lowbw data prepare``: a local corpus into a folder of token files.

The folder holds, for each split (``train``, ``val``):

* ``{split}.bin``: the token ids, uint16, every document followed by the
  end-of-text token (read back memory-mapped);
* ``{split}_docs.npy``: int64 offsets of the documents' first tokens, with
  the total length appended (document d is ``tokens[docs[d]:docs[d+1]]``);
* ``{split}_sources.npy``: int32, each document's index into ``sources``;

plus ``tokenizer.json`` and ``meta.json`` (format, vocabulary size, counts,
the sources' names and the settings that made it). Documents go to the
validation split whole (a split by document, never inside one), chosen by a
seeded draw, or by the corpus's own validation files where a recipe knows
them.
"""

import contextlib
import fnmatch
import json
import os
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from lowbw import _validate
from lowbw.data import _corpus, _tokenizer

FORMAT = "lowbw-tokens"
VERSION = 1
SPLITS = ("train", "val")
_BATCH = 256  # documents encoded per call of the tokenizer
_SCAN_LIMIT = 64 * 2 ** 20  # bytes of corpus read once more to fix its split
_VAL_MIN_BYTES = 8 * 2 ** 10  # held-out text a small corpus keeps at least


class Recipe(NamedTuple):
  """A known corpus: where its files are and the settings papers use."""
  name: str
  about: str
  vocab_size: int
  val_fraction: float
  split_on: str | None = None
  delimiter: str | None = None
  text_column: str = "text"
  val_files: str | None = None    # glob of the corpus's own validation files
  train_files: str | None = None  # glob of the files to read (default: all)


RECIPES = {r.name: r for r in (
    Recipe("shakespeare", "Tiny Shakespeare (Karpathy's input.txt, 1.1 MB); "
           "paragraphs are documents, 10% held out as in nanoGPT",
           vocab_size=1024, val_fraction=0.1, split_on="paragraph",
           train_files="*.txt"),
    Recipe("tinystories", "TinyStories (Eldan and Li, arXiv 2305.07759): "
           "TinyStoriesV2-GPT4-{train,valid}.txt, stories separated by "
           "<|endoftext|>; the paper keeps a 10k-token vocabulary",
           vocab_size=10_000, val_fraction=0.0, delimiter="<|endoftext|>",
           val_files="*valid*", train_files="*.txt"),
    Recipe("openwebtext", "OpenWebText as saved by Hugging Face datasets "
           "(save_to_disk), JSONL or Parquet with a 'text' field; GPT-2's "
           "vocabulary size and nanoGPT's 0.05% held out",
           vocab_size=50_257, val_fraction=0.0005),
    Recipe("fineweb-edu", "FineWeb-Edu (Penedo et al., arXiv 2406.17557) "
           "Parquet shards (e.g. sample/10BT) with a 'text' field; GPT-2's "
           "vocabulary size, 0.05% held out",
           vocab_size=50_257, val_fraction=0.0005),
)}


def recipe(name: str) -> Recipe:
  _validate.one_of("recipe", name, tuple(RECIPES))
  return RECIPES[name]


class Settings(NamedTuple):
  vocab_size: int = 4096
  val_fraction: float = 0.05
  seed: int = 0
  text_column: str = "text"
  source_column: str | None = None
  split_on: str | None = None
  delimiter: str | None = None
  tokenizer: str | None = None  # an existing tokenizer.json
  recipe: str | None = None
  include: tuple | None = None  # globs: a folder's files to read


def settings(recipe_name: str | None = None, **given) -> Settings:
  """The recipe's settings (or the defaults) with the given ones on top
  (None: not given)."""
  base = Settings()
  if recipe_name is not None:
    r = recipe(recipe_name)
    base = base._replace(vocab_size=r.vocab_size,
                         val_fraction=r.val_fraction, split_on=r.split_on,
                         delimiter=r.delimiter, text_column=r.text_column,
                         recipe=r.name)
  unknown = sorted(set(given) - set(Settings._fields) - {"recipe"})
  if unknown:
    raise _validate.fail(unknown[0], given[unknown[0]],
                         "not a setting of data prepare; expected one of "
                         + ", ".join(Settings._fields))
  s = base._replace(**{k: v for k, v in given.items() if v is not None})
  own_val = recipe_name is not None and RECIPES[recipe_name].val_files
  if not (own_val and s.val_fraction == 0):
    v = s.val_fraction
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
        0 < v < 1):
      raise _validate.fail("val_fraction", v, "expected a number in (0, 1): "
                           "some documents for validation, some for training")
  _validate.non_negative_int("seed", s.seed)
  if s.tokenizer is None:
    _tokenizer.check_vocab_size(s.vocab_size)
  return s


def prepare(source, out, progress: bool = False, overwrite: bool = False,
            recipe_name: str | None = None, **given) -> dict:
  """Tokenizes the corpus at ``source`` into the folder ``out``.

  Args:
    source: a file or folder (see ``_corpus.documents``).
    out: the output folder; created; refused if it holds a prepared corpus
      unless ``overwrite``.
    progress: progress bars on stderr.
    recipe_name: a known corpus's settings (``RECIPES``).
    **given: ``Settings`` fields (``vocab_size``, ``val_fraction``, ``seed``,
      ``text_column``, ``source_column``, ``split_on``, ``delimiter``,
      ``tokenizer``).

  Returns:
    The metadata written to ``meta.json``.
  """
  s = settings(recipe_name, **given)
  out = os.fspath(out)
  _check_out(out, overwrite)
  train_docs, val_docs = _passes(source, s)
  tokenizer = _tokenizer_for(s, train_docs, progress)
  try:
    return _write(out, source, s, tokenizer, train_docs, val_docs, progress)
  except OSError as e:
    # A full disk or a permission: numpy's and the tokenizer's words name
    # neither the file nor what to do.
    where = getattr(e, "filename", None) or out
    why = e.strerror or str(e)
    raise _validate.fail("out", out, f"cannot be written ({where}: {why}); "
                         "free space or fix the permission, then prepare "
                         "again (meta.json, written last, is not there, so "
                         "the folder is not taken for a prepared "
                         "corpus)") from None


def _write(out, source, s: Settings, tokenizer, train_docs, val_docs,
           progress) -> dict:
  """The corpus's files; ``meta.json`` last and atomically, so that a
  folder holds a prepared corpus only once every file is whole."""
  os.makedirs(out, exist_ok=True)
  tokenizer.save(os.path.join(out, "tokenizer.json"))
  eos = _tokenizer.eos_id(tokenizer)
  sources: dict[str, int] = {}
  counts = {}
  for split, docs in (("train", train_docs), ("val", val_docs)):
    counts[split] = _write_split(out, split, docs(), tokenizer, eos, sources,
                                 progress)
  _check_counts(source, counts, s)
  meta = {"format": FORMAT, "version": VERSION,
          "vocab_size": tokenizer.get_vocab_size(), "dtype": "uint16",
          "eos_id": eos, "tokenizer": "tokenizer.json",
          "sources": list(sources), "source": os.fspath(source),
          **{split: counts[split] for split in SPLITS},
          "settings": s._asdict()}
  path = os.path.join(out, "meta.json")
  with _naming(path + ".part"), open(path + ".part", "w") as f:
    json.dump(meta, f, indent=2)
  os.replace(path + ".part", path)
  return meta


@contextlib.contextmanager
def _naming(path: str):
  """An ``OSError`` of a write that does not say which file (a full disk's)
  names ``path``."""
  try:
    yield
  except OSError as e:
    if not e.filename:
      e.filename = path
    raise


def _check_out(out: str, overwrite: bool) -> None:
  if os.path.isfile(out):
    raise _validate.fail("out", out, "expected a folder, not a file")
  if os.path.exists(os.path.join(out, "meta.json")) and not overwrite:
    raise _validate.fail("out", out, "already holds a prepared corpus; "
                         "choose another folder or pass --overwrite")


def _passes(source, s: Settings):
  """(train_documents, val_documents): functions that each start a pass."""
  read = dict(text_column=s.text_column, source_column=s.source_column,
              split_on=s.split_on, delimiter=s.delimiter)
  if s.include is not None:
    read["include"] = s.include
  r = RECIPES.get(s.recipe)
  if r is not None and r.val_files and os.path.isdir(source):
    return _recipe_split(source, r, read)
  passes = _corpus.documents(source, **read)
  extra = _extra_val(source, passes, s)

  def pick(split: str):
    def docs() -> Iterator[_corpus.Document]:
      rng = np.random.default_rng(s.seed)
      for i, doc in enumerate(passes()):
        held_out = rng.random() < s.val_fraction or i in extra
        if held_out == (split == "val"):
          yield doc
    return docs

  return pick("train"), pick("val")


def _extra_val(source, passes, s: Settings) -> set[int]:
  """Documents a small corpus holds out beyond its draw, so that validation
  has text to score: the lowest draws first, until the held-out text
  reaches ``_VAL_MIN_BYTES`` (a window of a few hundred tokens at least),
  without passing half of the corpus's text or its last document but one.
  Corpora over ``_SCAN_LIMIT`` bytes are not read for it: any sensible
  ``val_fraction`` holds out plenty of them."""
  if _size(source) > _SCAN_LIMIT:
    return set()
  rng = np.random.default_rng(s.seed)
  draws, sizes = [], []
  for doc in passes():
    draws.append(rng.random())
    sizes.append(len(doc.text.encode("utf-8")))
  draws, sizes = np.array(draws), np.array(sizes)
  held = draws < s.val_fraction
  if not len(draws):  # refused now, not after training a tokenizer
    raise _empty(source, "train", s)
  extra: set[int] = set()
  total = int(sizes[held].sum())
  for i in np.argsort(draws, kind="stable"):
    if held[i]:
      continue
    if held.sum() + len(extra) >= len(draws) - 1 or (
        total >= _VAL_MIN_BYTES) or (
        (held.any() or extra) and total + sizes[i] > sizes.sum() / 2):
      break
    extra.add(int(i))
    total += int(sizes[i])
  if held.sum() + len(extra) == 0:
    raise _empty(source, "val", s)
  return extra


def _size(source) -> int:
  if os.path.isfile(source):
    return os.path.getsize(source)
  return sum(os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(source) for f in files)


def _recipe_split(source, r: Recipe, read: dict):
  """A corpus that ships its own validation files: those are ``val``."""
  names = sorted(os.listdir(source))
  val = [n for n in names if fnmatch.fnmatch(n, r.val_files)]
  train = [n for n in names if n not in val and fnmatch.fnmatch(
      n, r.train_files or "*")]
  if not val or not train:
    raise _validate.fail(
        "source", os.fspath(source), f"the {r.name} recipe expects training "
        f"files ({r.train_files or '*'}) and validation files "
        f"({r.val_files}) in this folder; found {names}")

  def docs(files):
    def run():
      for name in files:
        yield from _corpus.documents(os.path.join(source, name), **read)()
    return run

  return docs(train), docs(val)


def _tokenizer_for(s: Settings, train_docs, progress: bool):
  if s.tokenizer is not None:
    return _tokenizer.load(s.tokenizer)
  texts = (doc.text for doc in train_docs())
  return _tokenizer.train_bpe(texts, s.vocab_size, progress)


def _write_split(out, split, docs, tokenizer, eos, sources, progress) -> dict:
  """Encodes ``docs`` into ``{split}.bin`` in batches; returns the counts."""
  from tqdm.auto import tqdm
  offsets, source_ids, total = [0], [], 0
  path = os.path.join(out, f"{split}.bin")
  bar = tqdm(desc=f"encoding {split}", unit=" docs", disable=not progress)
  with _naming(path + ".part"), open(path + ".part", "wb") as f:
    for batch in _batched(docs, _BATCH):
      encoded = tokenizer.encode_batch([d.text for d in batch],
                                       add_special_tokens=False)
      for doc, enc in zip(batch, encoded):
        ids = enc.ids + ([eos] if eos is not None else [])
        np.asarray(ids, np.uint16).tofile(f)
        total += len(ids)
        offsets.append(total)
        source_ids.append(sources.setdefault(doc.source, len(sources)))
      bar.update(len(batch))
  bar.close()
  os.replace(path + ".part", path)
  np.save(os.path.join(out, f"{split}_docs.npy"), np.asarray(offsets, np.int64))
  np.save(os.path.join(out, f"{split}_sources.npy"),
          np.asarray(source_ids, np.int32))
  return {"documents": len(source_ids), "tokens": total}


def _batched(items, size):
  batch = []
  for item in items:
    batch.append(item)
    if len(batch) == size:
      yield batch
      batch = []
  if batch:
    yield batch


def _check_counts(source, counts: dict, s: Settings) -> None:
  for split in SPLITS:
    if counts[split]["documents"] == 0:
      raise _empty(source, split, s, nothing=not any(
          c["documents"] for c in counts.values()))


def _empty(source, split: str, s: Settings,
           nothing: bool = True) -> _validate.ConfigError:
  """The error for a split without documents (``nothing``: none at all)."""
  if split == "val":
    hint = ("too few documents for val_fraction="
            f"{s.val_fraction:g}; raise it, or cut the text into more "
            "documents (--split-on paragraph or line, --delimiter)")
  elif nothing:
    hint = "the source holds no text (its files are empty or blank)"
  else:
    hint = "no training documents remain; lower val_fraction"
  return _validate.fail("source", os.fspath(source),
                        f"the {split} split is empty: {hint}")

