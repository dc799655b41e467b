"""Image datasets read from files the user downloaded: MNIST, Fashion-MNIST
(IDX files) and CIFAR-10 (its python or binary batches).

Nothing here touches the network: each reader takes a local folder and
returns numpy arrays; the factories (``mnist``, ``fashion_mnist``,
``cifar10``) wrap them in a ``DataSource`` through ``arrays``.
"""

import dataclasses
import gzip
import math
import os
import pickle
import struct
import zlib
from typing import Any

import numpy as np

from lowbw import _validate
from lowbw.data._arrays import arrays
from lowbw.data._source import DataSource

PathLike = str | os.PathLike[str]

# IDX type byte -> big-endian numpy dtype.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4",
             0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def _file_bytes(path: str, field: str) -> bytes:
  """The bytes of ``path``, gunzipped when they are gzip data (recognised by
  the gzip magic, not the name: a browser may have unpacked a ``.gz`` and
  kept its name, or the user gzipped a file without renaming it)."""
  _validate.existing_file(field, path)
  with open(path, "rb") as f:
    raw = f.read()
  if not raw.startswith(_GZIP_MAGIC):
    return raw
  try:
    return gzip.decompress(raw)
  except (OSError, EOFError, zlib.error) as e:
    raise _validate.fail(
        field, path, f"expected a complete gzip file; it could not be "
        f"decompressed ({e}); download it again") from None


def read_idx(path: PathLike) -> np.ndarray:
  """Reads an IDX file, the format of MNIST and Fashion-MNIST.

  An IDX file is two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B
  int16, 0x0C int32, 0x0D float32, 0x0E float64), a byte giving the number
  of dimensions, each dimension's size as a big-endian uint32, then the
  values, big-endian, in row-major order. Gzipped files (``.gz``) are
  decompressed first.

  Args:
    path: the file, plain or gzipped.

  Returns:
    The array, in native byte order, shaped by the header's sizes.

  Raises:
    ValueError: naming the path, when the file does not exist, is not an IDX
      file (bad magic or type byte), or holds fewer or more bytes than its
      header announces (a truncated download).

  Example:
    >>> import gzip, os, struct, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "labels-idx1-ubyte.gz")
    >>> with gzip.open(path, "wb") as f:
    ...   _ = f.write(struct.pack(">BBBBI", 0, 0, 0x08, 1, 3) + bytes([7, 2, 1]))
    >>> read_idx(path)
    array([7, 2, 1], dtype=uint8)
  """
  path = os.fspath(path)
  raw = _file_bytes(path, "path")
  if len(raw) < 4 or raw[:2] != b"\0\0":
    raise _validate.fail(
        "path", path, "expected an IDX file, which starts with two zero "
        f"bytes; it starts with {raw[:4].hex(' ') or 'nothing (empty file)'}")
  if raw[2] not in IDX_TYPES:
    raise _validate.fail(
        "path", path, f"has IDX type byte 0x{raw[2]:02X}; expected one of "
        + ", ".join(f"0x{code:02X}" for code in IDX_TYPES))
  dtype, ndim = np.dtype(IDX_TYPES[raw[2]]), raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise _validate.fail(
        "path", path, f"is truncated: expected a {header}-byte header for "
        f"{ndim} dimensions, found {len(raw)} bytes in all")
  shape = struct.unpack(f">{ndim}I", raw[4:header])
  count = math.prod(shape)
  expected, actual = count * dtype.itemsize, len(raw) - header
  if actual != expected:
    what = "is truncated" if actual < expected else "has trailing bytes"
    raise _validate.fail(
        "path", path, f"{what}: expected {expected:,} bytes of {dtype.name} "
        f"data after the header for shape {shape}, found {actual:,}")
  values = np.frombuffer(raw, dtype, count=count, offset=header)
  return values.astype(dtype.newbyteorder("=")).reshape(shape)


# (key, standard file name) of the four MNIST / Fashion-MNIST files.
MNIST_FILES = (("x", "train-images-idx3-ubyte"),
               ("y", "train-labels-idx1-ubyte"),
               ("eval_x", "t10k-images-idx3-ubyte"),
               ("eval_y", "t10k-labels-idx1-ubyte"))


def _mnist_names(name: str) -> list[str]:
  """The spellings of one MNIST file: the standard one, the dotted one some
  mirrors use (``train-images.idx3-ubyte``), each plain or gzipped."""
  dotted = name.replace("-idx", ".idx")
  return [name, dotted, name + ".gz", dotted + ".gz"]


def _find(folder: str, names: list[str]) -> str | None:
  """The first of ``names`` in ``folder``; a folder of that name holding the
  file (as some archives unpack) also counts."""
  for name in names:
    path = os.path.join(folder, name)
    if os.path.isfile(path):
      return path
    if os.path.isfile(os.path.join(path, name)):
      return os.path.join(path, name)
  return None


def _folder(folder: Any) -> str:
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise _validate.fail("folder", folder, "expected an existing folder" + (
        "; this is a file" if os.path.exists(folder) else ""))
  return folder


def _listing(folder: str) -> str:
  found = sorted(os.listdir(folder))
  shown = ", ".join(found[:12]) + (", ..." if len(found) > 12 else "")
  return f"it holds: {shown}" if found else "it is empty"


def mnist_arrays(folder: PathLike) -> dict[str, np.ndarray]:
  """Reads MNIST (or Fashion-MNIST, whose files have the same names).

  ``folder`` holds the four official files, plain or gzipped:
  ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (the dotted
  spelling ``train-images.idx3-ubyte`` also works).

  Args:
    folder: the folder holding the files.

  Returns:
    ``{"x": float32 (N, 28, 28, 1) in [0, 1], "y": int32 (N,), "eval_x",
    "eval_y"}``: the 60,000 training and 10,000 test images of the official
    split.

  Raises:
    ValueError: naming the folder and every file it lacks, or naming a file
      that is not what its name says.
  """
  folder = _folder(folder)
  paths = {key: _find(folder, _mnist_names(name)) for key, name in MNIST_FILES}
  missing = [name for key, name in MNIST_FILES if paths[key] is None]
  if missing:
    raise _validate.fail(
        "folder", folder, "expected the MNIST / Fashion-MNIST files in it; "
        "missing " + ", ".join(f"{name}[.gz]" for name in missing)
        + " (the dotted spelling, e.g. train-images.idx3-ubyte, also works); "
        + _listing(folder))
  out = {}
  for images, labels in (("x", "y"), ("eval_x", "eval_y")):
    out[images], out[labels] = _mnist_pair(paths[images], paths[labels])
  if out["x"].shape[1:] != out["eval_x"].shape[1:]:
    raise _validate.fail(
        "path", paths["eval_x"], f"holds images of {out['eval_x'].shape[1:3]} "
        f"pixels; expected {out['x'].shape[1:3]}, as in {paths['x']}")
  return out


def _mnist_pair(images_path: str,
                labels_path: str) -> tuple[np.ndarray, np.ndarray]:
  """One split's images (float32 (N, H, W, 1) in [0, 1]) and labels."""
  images, labels = read_idx(images_path), read_idx(labels_path)
  if images.dtype != np.uint8 or images.ndim != 3:
    raise _validate.fail(
        "path", images_path, f"holds {images.dtype} {images.shape}; expected "
        "uint8 images shaped (N, height, width) (type byte 0x08, 3 "
        "dimensions)")
  if not np.issubdtype(labels.dtype, np.integer) or labels.ndim != 1:
    raise _validate.fail(
        "path", labels_path, f"holds {labels.dtype} {labels.shape}; expected "
        "integer labels shaped (N,) (1 dimension)")
  if len(labels) != len(images):
    raise _validate.fail(
        "path", labels_path, f"holds {len(labels):,} labels; expected one per "
        f"image of {images_path} ({len(images):,})")
  x = images.astype(np.float32)
  x /= 255.0  # in place: one float copy of the images, not two
  return x[..., None], labels.astype(np.int32)


CIFAR10_SUBFOLDERS = ("cifar-10-batches-py", "cifar-10-batches-bin")
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_PIXELS = 3 * 32 * 32


def _cifar10_files(folder: str) -> tuple[str, list[str], list[str]]:
  """("python" or "binary", train batch paths, test batch paths): the first
  complete set in ``folder`` or its ``cifar-10-batches-py`` / ``-bin``
  subfolder, python batches first."""
  names = _CIFAR_TRAIN + ("test_batch",)
  places = [folder] + [os.path.join(folder, s) for s in CIFAR10_SUBFOLDERS]
  for place in places:
    for version, suffix in (("python", ""), ("binary", ".bin")):
      paths = [os.path.join(place, name + suffix) for name in names]
      if all(os.path.isfile(p) for p in paths):
        return version, paths[:5], paths[5:]
  raise _validate.fail(
      "folder", folder, "expected the CIFAR-10 batches data_batch_1 .. "
      "data_batch_5 and test_batch (python version), or the same names with "
      ".bin (binary version), in it or in a subfolder "
      + " or ".join(CIFAR10_SUBFOLDERS) + "; found no complete set ("
      + _listing(folder) + ")")


def _cifar_python_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(uint8 (N, 3072), labels (N,)) of one pickled python-version batch."""
  try:
    with open(path, "rb") as f:
      # Unpickling can run code; these pickles are files from the user's own
      # disk, named by the user, which they chose to trust (they are the
      # official CIFAR-10 format, only available as pickles).
      batch = pickle.load(f, encoding="bytes")
  except Exception as e:  # pylint: disable=broad-except
    raise _validate.fail(
        "path", path, "expected a CIFAR-10 python batch (a pickled dict); it "
        f"could not be unpickled ({type(e).__name__}: {e})") from None
  if not isinstance(batch, dict):
    raise _validate.fail(
        "path", path, f"holds a pickled {type(batch).__name__}; expected a "
        "dict with keys b'data' and b'labels'")
  data = batch.get(b"data", batch.get("data"))
  labels = batch.get(b"labels", batch.get("labels"))
  if data is None or labels is None:
    raise _validate.fail(
        "path", path, "expected a dict with keys b'data' and b'labels'; it "
        f"has {sorted(map(repr, batch))}")
  return np.asarray(data), np.asarray(labels)


def _cifar_binary_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(uint8 (N, 3072), labels (N,)) of one binary-version batch: records of
  one label byte then 3072 pixel bytes."""
  record = 1 + _CIFAR_PIXELS
  size = os.path.getsize(path)
  if size == 0 or size % record:
    raise _validate.fail(
        "path", path, f"holds {size:,} bytes; expected a whole number of "
        f"{record}-byte records (1 label byte + {_CIFAR_PIXELS} pixel bytes), "
        f"e.g. {max(1, size // record) * record:,} bytes (truncated "
        "download?)")
  records = np.fromfile(path, np.uint8).reshape(-1, record)
  return records[:, 1:], records[:, 0]


def _cifar_split(paths: list[str], version: str):
  """float32 (N, 32, 32, 3) in [0, 1] and int32 labels of several batches."""
  read = _cifar_python_batch if version == "python" else _cifar_binary_batch
  xs, ys = [], []
  for path in paths:
    data, labels = read(path)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _CIFAR_PIXELS:
      raise _validate.fail(
          "path", path, f"holds data {data.dtype} {data.shape}; expected "
          f"uint8 (N, {_CIFAR_PIXELS}) (3 x 32 x 32 pixels per row)")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
      raise _validate.fail(
          "path", path, f"holds labels {labels.dtype} {labels.shape}; "
          f"expected {len(data)} integer labels, one per image")
    if labels.size and not 0 <= labels.min() <= labels.max() <= 9:
      raise _validate.fail(
          "path", path, f"holds labels from {labels.min()} to {labels.max()}; "
          "expected CIFAR-10's classes 0..9 (CIFAR-100 is not this format)")
    # Rows are channel-first (3, 32, 32); the models take channel-last.
    xs.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    ys.append(labels.astype(np.int32))
  x = np.concatenate(xs).astype(np.float32)
  x /= 255.0  # in place: one float copy of the images, not two
  return x, np.concatenate(ys)


def cifar10_arrays(folder: PathLike) -> dict[str, np.ndarray]:
  """Reads CIFAR-10 from its python or binary batches.

  ``folder`` (or its subfolder ``cifar-10-batches-py`` or
  ``cifar-10-batches-bin``, as the official archives unpack) holds
  ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` (the python
  version: pickled dicts), or the same names ending in ``.bin`` (the binary
  version: records of 1 label byte and 3072 pixel bytes). The python version
  is used when both are there.

  Args:
    folder: the folder holding the batches, or their parent.

  Returns:
    ``{"x": float32 (N, 32, 32, 3) in [0, 1] (channel-last), "y": int32
    (N,), "eval_x", "eval_y"}``: the 50,000 training and 10,000 test images.

  Raises:
    ValueError: naming the folder when it holds no complete set of batches,
      or naming a batch that is not what its name says.
  """
  folder = _folder(folder)
  version, train, test = _cifar10_files(folder)
  x, y = _cifar_split(train, version)
  eval_x, eval_y = _cifar_split(test, version)
  return {"x": x, "y": y, "eval_x": eval_x, "eval_y": eval_y}


def _source(factory: str, reader, path: PathLike, sharding: str,
            alpha: float) -> DataSource:
  """``arrays`` of ``reader(path)``'s official split, named and configured
  as ``factory`` so that ``data.get(**source.config)`` rebuilds it."""
  try:
    split = reader(path)
  except _validate.ConfigError as e:
    raise _validate.renamed(e, {"folder": "path"}) from None
  source = arrays(split["x"], split["y"], sharding=sharding, alpha=alpha,
                  eval=(split["eval_x"], split["eval_y"]))
  return dataclasses.replace(
      source, name=factory,
      config={"name": factory, "path": os.fspath(path), "sharding": sharding,
              "alpha": alpha})


def mnist(path: PathLike, sharding: str = "iid",
          alpha: float = 0.5) -> DataSource:
  """MNIST from a folder of its four official files (see ``mnist_arrays``).

  The user downloads the files; nothing is fetched. Training uses the 60,000
  training images, evaluation the 10,000 test images.

  Args:
    path: the folder holding ``train-images-idx3-ubyte[.gz]`` and the others.
    sharding: ``"iid"``, ``"contiguous"`` or ``"dirichlet"`` (by label).
    alpha: Dirichlet concentration for ``"dirichlet"``.

  Returns:
    A classification ``DataSource`` of float32 (28, 28, 1) images, 10 classes.
  """
  return _source("mnist", mnist_arrays, path, sharding, alpha)


def fashion_mnist(path: PathLike, sharding: str = "iid",
                  alpha: float = 0.5) -> DataSource:
  """Fashion-MNIST from a folder of its four files, named as MNIST's.

  Args:
    path: the folder holding ``train-images-idx3-ubyte[.gz]`` and the others.
    sharding: ``"iid"``, ``"contiguous"`` or ``"dirichlet"`` (by label).
    alpha: Dirichlet concentration for ``"dirichlet"``.

  Returns:
    A classification ``DataSource`` of float32 (28, 28, 1) images, 10 classes.
  """
  return _source("fashion_mnist", mnist_arrays, path, sharding, alpha)


def cifar10(path: PathLike, sharding: str = "iid",
            alpha: float = 0.5) -> DataSource:
  """CIFAR-10 from a folder of its batches (see ``cifar10_arrays``).

  Args:
    path: the folder holding the python or binary batches, or their parent.
    sharding: ``"iid"``, ``"contiguous"`` or ``"dirichlet"`` (by label).
    alpha: Dirichlet concentration for ``"dirichlet"``.

  Returns:
    A classification ``DataSource`` of float32 (32, 32, 3) images, 10 classes.
  """
  return _source("cifar10", cifar10_arrays, path, sharding, alpha)


def image_kind(folder: PathLike) -> str | None:
  """``"mnist"`` when ``folder`` holds the MNIST/Fashion-MNIST training
  images, ``"cifar10"`` when it holds CIFAR-10 batches, else None (the
  CLI's ``--data DIR`` picks the reader by it)."""
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    return None
  if _find(folder, _mnist_names(MNIST_FILES[0][1])) is not None:
    return "mnist"
  try:
    _cifar10_files(folder)
  except _validate.ConfigError:
    return None
  return "cifar10"
