"""Reading a local corpus as documents: text files, folders, JSONL, Parquet
and Hugging Face datasets saved with ``save_to_disk`` (Arrow files).

A corpus is read twice by ``lowbw data prepare`` (once to train the
tokenizer, once to encode), so ``documents`` returns a function that starts
a fresh pass each time it is called. Nothing is downloaded: every path is
the user's own.
"""

import codecs
import fnmatch
import json
import os
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

from lowbw import _validate

SPLITS = ("file", "paragraph", "line")
_RECORDS = (".jsonl", ".json", ".parquet", ".arrow")
# Files in a folder that are never text documents.
_SKIP_SUFFIXES = (".bin", ".npy", ".npz", ".gz", ".zip", ".xz", ".tar",
                  ".png", ".jpg", ".jpeg", ".gif", ".pdf", ".pyc", ".so",
                  ".lock")
_SKIP_NAMES = ("dataset_info.json", "state.json", "dataset_dict.json")
# Text files are sniffed before they are read: the first bytes tell a
# binary file (which would otherwise become a corpus of its bytes).
_SNIFF_BYTES = 64 * 2 ** 10
_ARCHIVES = ((b"PK\x03\x04", "a zip archive"), (b"\x1f\x8b", "gzip data"),
             (b"\xfd7zXZ\x00", "xz data"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip "
             "archive"))
# Share of undecodable or control characters above which a file without
# NUL bytes is still binary: random bytes give about 0.5, Latin-1 text read
# as UTF-8 (one odd character per accented letter) well under 0.3.
_BINARY_SHARE = 0.3


class Document(NamedTuple):
  """One document's text and the source it came from (a file name, or the
  value of a metadata column)."""
  text: str
  source: str


def documents(path, *, text_column: str = "text",
              source_column: str | None = None, split_on: str | None = None,
              delimiter: str | None = None, include=None
              ) -> Callable[[], Iterator[Document]]:
  """A function that yields the corpus's documents, in a fixed order.

  Args:
    path: a text file, a JSONL/Parquet/Arrow file, or a folder of any of
      these (read recursively, in sorted order; hidden files skipped). A
      Hugging Face dataset saved with ``save_to_disk`` is such a folder.
    text_column: the field holding the text in JSONL/Parquet/Arrow records.
    source_column: a record field naming each document's source (for
      non-IID sharding by source); default: the file it came from.
    split_on: how a plain text file is cut into documents: ``"file"`` (the
      whole file), ``"paragraph"`` (blank lines) or ``"line"``. Default:
      ``"paragraph"`` for a single file (``"line"`` when it holds one
      paragraph), ``"file"`` for a folder.
    delimiter: a string that separates documents inside text files
      (TinyStories' ``<|endoftext|>``); overrides ``split_on``.
    include: glob patterns (``"*.md"``, ``"docs/**/*.txt"``): of a
      folder, only the files whose name or path inside it matches one.

  A ``.jsonl`` file is JSON Lines (one record per line); a ``.json`` file
  is one JSON document: a list of records, one record, or an object with
  one list of records (``{"data": [...]}``); one that is not a single
  document but JSON Lines is read as such.

  Returns:
    ``passes() -> iterator of Document``.
  """
  root = pathlib.Path(os.fspath(path)).expanduser()
  if not root.exists():
    raise _validate.fail("source", os.fspath(path), "no such file or "
                         "folder; expected a file or folder of text")
  if split_on is not None:
    _validate.one_of("split_on", split_on, SPLITS)
  if delimiter is not None and not delimiter:
    raise _validate.fail("delimiter", delimiter, "expected a non-empty string")
  if not root.is_file() and not root.is_dir():
    raise _validate.fail("source", os.fspath(path), "is not a regular file "
                         "(a device, pipe or socket); expected a file or "
                         "folder of text")
  _refuse_images(root, os.fspath(path))
  files = [root] if root.is_file() else _included(
      _folder_files(root), root, include, os.fspath(path))
  if not files:
    raise _validate.fail("source", os.fspath(path),
                         "expected a folder holding at least one text, "
                         "JSONL, Parquet or Arrow file")
  for file in files:
    if file.suffix.lower() not in (".parquet", ".arrow"):
      _refuse_binary(file)
  split = split_on or ("paragraph" if root.is_file() else "file")
  if split_on is None and root.is_file() and delimiter is None and (
      root.suffix.lower() not in _RECORDS) and _paragraphs(root) < 2:
    split = "line"  # one paragraph: its lines are the documents
  base = root if root.is_dir() else root.parent

  def passes() -> Iterator[Document]:
    for file in files:
      name = file.relative_to(base).as_posix()
      if file.suffix.lower() in _RECORDS:
        yield from _records(file, name, text_column, source_column)
      else:
        yield from _text_documents(file, name, split, delimiter)

  return passes


def _refuse_images(root: pathlib.Path, shown: str) -> None:
  """An image dataset's folder is not a corpus: it trains as images."""
  from lowbw.data._images import image_kind
  kind = image_kind(root) if root.is_dir() else None
  if kind is not None:
    what = ("MNIST / Fashion-MNIST images (IDX files)" if kind == "mnist"
            else "CIFAR-10 batches")
    raise _validate.fail("source", shown, f"holds {what}, not text; train "
                         f"on the images directly: lowbw train --data {shown}")


def _refuse_binary(file: pathlib.Path) -> None:
  """Refuses a file that is not text, naming it and what it looks like."""
  with open(file, "rb") as f:
    head = f.read(_SNIFF_BYTES)
  for magic, what in _ARCHIVES:
    if head.startswith(magic):
      raise _validate.fail("source", str(file), f"is {what}, not text; "
                           "unpack it and pass the file or folder inside")
  if head[:2] == b"\0\0" and len(head) > 3 and head[2] in (8, 9, 11, 12, 13,
                                                         14):
    raise _validate.fail("source", str(file), "is an IDX file (the MNIST "
                         "image format), not text; train on its folder "
                         f"directly: lowbw train --data {file.parent}")
  if b"\0" in head or _binary_share(head) > _BINARY_SHARE:
    raise _validate.fail("source", str(file), "is binary, not UTF-8 text "
                         f"(its first {len(head):,} bytes hold NUL bytes or "
                         "undecodable ones); pass text, JSONL, Parquet or "
                         "Arrow files")


def _binary_share(head: bytes) -> float:
  # final=False: a character cut at the sniff's end is not a bad one.
  text = codecs.getincrementaldecoder("utf-8")("replace").decode(head)
  odd = sum(1 for c in text if c == "\ufffd" or (
      c < " " and c not in "\t\n\r\f\v\x1b"))
  return odd / max(1, len(text))


def _paragraphs(file: pathlib.Path) -> int:
  text = file.read_text(encoding="utf-8", errors="replace")
  return sum(1 for p in re.split(r"\n\s*\n", text) if p.strip())


def _folder_files(root: pathlib.Path) -> list[pathlib.Path]:
  out = []
  for file in sorted(root.rglob("*")):
    parts = file.relative_to(root).parts
    if (not file.is_file() or any(p.startswith(".") for p in parts)
        or file.suffix.lower() in _SKIP_SUFFIXES
        or file.name in _SKIP_NAMES):
      continue
    out.append(file)
  return out


def _included(files: list, root: pathlib.Path, include, shown: str) -> list:
  """The ``files`` of the folder ``root`` whose name or relative path
  matches one of the ``include`` globs (all of them when None)."""
  if include is None:
    return files
  patterns = [include] if isinstance(include, str) else list(include)
  if not patterns or not all(isinstance(p, str) and p for p in patterns):
    raise _validate.fail("include", include, "expected glob patterns such "
                         "as '*.md'")
  kept = [f for f in files if any(
      fnmatch.fnmatch(f.name, p) or
      fnmatch.fnmatch(f.relative_to(root).as_posix(), p) for p in patterns)]
  if files and not kept:
    names = sorted({"*" + f.suffix if f.suffix else f.name for f in files})
    raise _validate.fail("include", patterns, f"matches no file in {shown} "
                         f"(it holds {', '.join(names[:10])})")
  return kept


def _text_documents(file, name, split, delimiter) -> Iterator[Document]:
  text = file.read_text(encoding="utf-8", errors="replace")
  if delimiter is not None:
    pieces = text.split(delimiter)
  elif split == "file":
    pieces = [text]
  elif split == "paragraph":
    pieces = re.split(r"\n\s*\n", text)
  else:
    pieces = text.splitlines()
  for piece in pieces:
    piece = piece.strip("\n") if split != "file" or delimiter else piece
    if piece.strip():
      yield Document(piece, name)


def _records(file, name, text_column, source_column) -> Iterator[Document]:
  suffix = file.suffix.lower()
  rows = (_json_rows(file) if suffix in (".jsonl", ".json")
          else _arrow_rows(file, text_column, source_column))
  for i, row in enumerate(rows):
    if not isinstance(row, dict) or text_column not in row:
      keys = sorted(row) if isinstance(row, dict) else type(row).__name__
      raise _validate.fail(
          "text_column", text_column,
          f"record {i} of {name} has fields {keys}; name the text field "
          "with --text-column")
    text = row[text_column]
    if not isinstance(text, str) or not text.strip():
      continue
    source = name if source_column is None else row.get(source_column)
    if source is None:
      raise _validate.fail("source_column", source_column,
                           f"record {i} of {name} has no such field")
    yield Document(text, str(source))


def _json_rows(file) -> Iterator[dict]:
  try:
    yield from _json_lines(file)
  except UnicodeDecodeError as e:  # says neither file nor line otherwise
    raise _validate.fail("source", str(file), f"is not UTF-8 text (byte "
                         f"0x{e.object[e.start]:02x}: {e.reason})") from None


def _json_lines(file) -> Iterator[dict]:
  if file.suffix.lower() == ".json":
    document = _json_document(file)
    if document is not None:
      yield from document
      return
  with open(file, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if line.strip():
        try:
          yield json.loads(line)
        except json.JSONDecodeError as e:
          raise _validate.fail("source", str(file), (
              f"line {number} is not JSON ({e.msg}); a .jsonl file holds "
              "one JSON record per line") if file.suffix.lower() == ".jsonl"
              else _JSON_EXPECTED) from None


_JSON_EXPECTED = ("is neither one JSON document (a list of records, one "
                  "record, or an object holding one list of records) nor "
                  "JSON Lines (one record per line, usually named .jsonl)")


def _json_document(file) -> list | None:
  """The records of a ``.json`` file holding one JSON document; None when
  it holds several (JSON Lines, which Hugging Face writes as .json)."""
  with open(file, encoding="utf-8") as f:
    text = f.read()
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    if e.msg == "Extra data":
      return None  # more than one document: JSON Lines
    raise _validate.fail("source", str(file), f"{_JSON_EXPECTED}: {e.msg} "
                         f"at line {e.lineno}") from None
  if isinstance(value, list):
    return value
  if isinstance(value, dict):
    lists = [v for v in value.values() if isinstance(v, list)
             and v and all(isinstance(r, dict) for r in v)]
    if len(lists) == 1 and not any(isinstance(v, str)
                                   for v in value.values()):
      return lists[0]
    return [value]
  raise _validate.fail("source", str(file), f"holds a JSON "
                       f"{type(value).__name__}; expected a list of records, "
                       "one record, or an object holding one list of "
                       "records")


def _arrow_rows(file, text_column, source_column) -> Iterator[dict]:
  try:
    import pyarrow
    import pyarrow.ipc
    import pyarrow.parquet
  except ModuleNotFoundError:
    raise _validate.fail(
        "source", str(file), "Parquet and Arrow files need pyarrow: "
        "pip install 'lowbw[parquet]'") from None
  kind = "Parquet" if file.suffix.lower() == ".parquet" else "Arrow"
  try:
    yield from _arrow_batches(file, kind, text_column, source_column)
  except (pyarrow.ArrowException, OSError) as e:  # names no file itself
    raise _validate.fail("source", str(file), f"is not a readable {kind} "
                         f"file ({str(e).splitlines()[0]})") from None


def _arrow_batches(file, kind, text_column, source_column) -> Iterator[dict]:
  import pyarrow.ipc
  import pyarrow.parquet
  columns = [c for c in (text_column, source_column) if c]
  if kind == "Parquet":
    parquet = pyarrow.parquet.ParquetFile(file)
    names = parquet.schema_arrow.names
    for field, column in (("text_column", text_column),
                          ("source_column", source_column)):
      if column is not None and column not in names:
        raise _validate.fail(field, column, f"{file.name} has no such "
                             f"column; it has {names}")
    batches = parquet.iter_batches(batch_size=1024, columns=columns)
  else:  # save_to_disk writes Arrow streams; other tools write files
    with open(file, "rb") as f:
      magic = f.read(6)
    reader = (pyarrow.ipc.open_file(file) if magic == b"ARROW1"
              else pyarrow.ipc.open_stream(file))
    batches = (reader.get_batch(i) for i in range(reader.num_record_batches)
               ) if magic == b"ARROW1" else reader
  for batch in batches:
    yield from batch.to_pylist()
