"""Datasets the user brings: in-memory or ``.npy``/``.npz`` arrays, token files."""

import os
import zipfile
from typing import Any

import numpy as np

from lowbw import _validate
from lowbw.data import _common
from lowbw.data._source import DataSource, check_label_range

PathOrArray = str | os.PathLike[str] | np.ndarray


def _existing(path: Any, field: str = "path") -> str:
  return _validate.existing_file(field, path)


def _is_path(value: Any) -> bool:
  return isinstance(value, (str, os.PathLike))


def _read(path: Any, field: str = "path"):
  """``np.load`` of a file the user named; anything unreadable (not an
  .npy/.npz, truncated, or holding Python objects) is a ValueError naming
  it, never a suggestion to allow pickles."""
  path = _existing(path, field)
  try:
    return np.load(path, allow_pickle=False)
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
    dtype = None
    if "pickle" in str(e):  # numpy's guess for any file it cannot parse
      with open(path, "rb") as f:
        dtype = _stored_dtype(f)
    if dtype is not None:
      raise _validate.fail(field, os.fspath(path), _NOT_NUMERIC.format(
          what="it holds an array", dtype=dtype)) from None
    reason = ("neither an .npz archive nor an .npy array" if "pickle" in
              str(e) else str(e).splitlines()[0])
    raise _validate.fail(field, os.fspath(path), "not a readable .npy or "
                         f".npz file of numeric arrays ({reason})") from None


_NOT_NUMERIC = ("{what} of dtype {dtype}; expected a numeric array "
                "(integers, floats or booleans; a ragged list of rows is "
                "stored as Python objects, which lowbw does not load: pad "
                "the rows to one length)")


def _stored_dtype(f) -> str | None:
  """The dtype in an .npy header, read without loading the array (None:
  the file has no .npy header)."""
  try:
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    return str(read(f)[2])
  except (ValueError, OSError, EOFError):
    return None  # not an .npy at all


NPZ_KEYS = ("x", "y", "x_eval", "y_eval")


def _npz_arrays(path: str) -> dict[str, np.ndarray]:
  """The arrays of an .npz of ``NPZ_KEYS``, each checked to be numeric
  before it is used; any other key is an error (a misspelt ``x_eval``
  would otherwise be dropped silently)."""
  archive = _read(path)
  if isinstance(archive, np.ndarray):
    raise _validate.fail("path", path, "expected an .npz archive with keys "
                         "'x' and 'y' (this is an .npy array)")
  with archive:
    keys = list(archive.files)
    unknown = [k for k in keys if k not in NPZ_KEYS]
    missing = [k for k in ("x", "y") if k not in keys]
    if unknown or missing:
      problem = (f"unknown key(s) {unknown}" if unknown else
                 f"no key(s) {missing}")
      raise _validate.fail(
          "path", path, f"expected an .npz with keys 'x' and 'y', and "
          f"optionally 'x_eval' and 'y_eval'; it has {problem} (found "
          f"{sorted(keys)})")
    return {k: _npz_array(archive, path, k) for k in keys}


def _npz_array(archive, path: str, key: str) -> np.ndarray:
  try:
    array = archive[key]
  except ValueError as e:
    if "pickle" not in str(e):
      raise _validate.fail("path", path, f"key {key!r} is not a readable "
                           f"array ({str(e).splitlines()[0]})") from None
    with archive.zip.open(key + ".npy") as f:
      dtype = _stored_dtype(f) or "object"
    raise _validate.fail("path", path, _NOT_NUMERIC.format(
        what=f"key {key!r} is an array", dtype=dtype)) from None
  if not _numeric(array.dtype):
    raise _validate.fail("path", path, _NOT_NUMERIC.format(
        what=f"key {key!r} is an array {array.shape}", dtype=array.dtype))
  return array


def _numeric(dtype) -> bool:
  return (np.issubdtype(dtype, np.integer) or
          np.issubdtype(dtype, np.floating) or dtype == bool)


def _load(value: Any) -> np.ndarray:
  if _is_path(value):
    loaded = _read(value)
    if not isinstance(loaded, np.ndarray):
      loaded.close()
      raise _validate.fail("path", os.fspath(value),
                           "expected an .npy file of one array here")
    return loaded
  return np.asarray(value)


def _features(x: np.ndarray, field: str) -> np.ndarray:
  if x.ndim < 2 or not _numeric(x.dtype):
    raise _validate.fail(
        field, f"<array {x.dtype} {x.shape}>",
        "expected a real-valued array shaped (N, features...)")
  described = f"<array {x.dtype} {x.shape}>"
  # Refused here, by name: later an empty axis fails far from its cause
  # (numpy's reshape, or a zero-fan-in initializer dividing by zero).
  if not len(x):
    raise _validate.fail(field, described, "expected at least 1 example")
  if 0 in x.shape[1:]:
    raise _validate.fail(
        field, described, "expected at least 1 feature (every axis after "
        "the first must be non-empty)")
  x = x.astype(np.float32)
  bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
  if bad.size:
    raise _validate.fail(
        field, described,
        f"expected finite features; {bad.size} example(s) hold NaN or "
        f"infinite values (or values beyond float32), the first is "
        f"example {bad[0]}")
  return x


def _labels(y: np.ndarray | None, field: str, num_examples: int) -> np.ndarray:
  if y is None:
    raise _validate.fail(field, None, "expected integer class labels (N,)")
  described = f"<array {y.dtype} {y.shape}>"
  whole = np.issubdtype(y.dtype, np.integer)
  if y.ndim != 1 or not (whole or np.issubdtype(y.dtype, np.floating)):
    raise _validate.fail(field, described,
                         "expected integer class labels shaped (N,)")
  if not whole:  # labels saved as floats: fine if each is a whole number
    bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
    if bad.size:
      raise _validate.fail(
          field, described, f"expected integer class labels; {bad.size} "
          f"label(s) are not whole numbers, the first is {y[bad[0]].item()!r} "
          f"(example {bad[0]})")
  check_label_range(field, y)  # before the cast: a huge float would wrap
  if len(y) != num_examples:
    raise _validate.fail(
        field, f"<{len(y)} labels>",
        f"expected one label per example of x ({num_examples})")
  return y.astype(np.int32)


def _describe(value: Any) -> Any:
  """Config entry: paths as str, in-memory arrays as a short description."""
  if value is None:
    return None
  if _is_path(value):
    return os.fspath(value)
  if isinstance(value, (tuple, list)):
    return [_describe(v) for v in value]
  array = np.asarray(value)
  return f"<array {array.dtype} {array.shape}>"


def _given(x, y, eval):  # pylint: disable=redefined-builtin
  """(x, y, the .npz's own eval pair or None) as the user gave them: an
  .npz file's arrays, or each of ``x`` and ``y`` loaded."""
  if not (_is_path(x) and os.fspath(x).endswith(".npz")):
    return _load(x), None if y is None else _load(y), None
  if y is not None:
    raise _validate.fail(
        "y", _describe(y), "expected None when x is an .npz file (it holds 'y')")
  contents = _npz_arrays(os.fspath(x))
  if "x_eval" not in contents and "y_eval" not in contents:
    return contents["x"], contents["y"], None
  if eval is not None:
    raise _validate.fail(
        "eval", _describe(eval),
        "expected None: the .npz already holds 'x_eval' and 'y_eval'")
  pair = (contents.get("x_eval"), contents.get("y_eval"))
  if pair[0] is None or pair[1] is None:
    raise _validate.fail(
        "path", os.fspath(x), "expected both 'x_eval' and 'y_eval', or neither")
  return contents["x"], contents["y"], pair


def _hold_out(x_train: np.ndarray, y_train: np.ndarray, eval_fraction):
  """(x_train, y_train, x_eval, y_eval): the last ``eval_fraction`` of the
  examples after a fixed (seed 0) permutation held out, so the split does
  not depend on the run's seed."""
  fraction = _common.eval_fraction(eval_fraction)
  if len(y_train) < 2:
    raise _validate.fail(
        "x", f"<array {x_train.shape}>",
        "expected at least 2 examples to hold some out for eval")
  order = np.random.default_rng(0).permutation(len(y_train))
  cut = len(order) - _common.held_out_count(len(order), fraction)
  # Sorted, so that "contiguous" sharding keeps the user's order.
  keep, held = np.sort(order[:cut]), np.sort(order[cut:])
  return x_train[keep], y_train[keep], x_train[held], y_train[held]


def arrays(
    x: PathOrArray,
    y: PathOrArray | None = None,
    sharding: str = "iid",
    alpha: float = 0.5,
    eval: tuple[PathOrArray, PathOrArray] | None = None,  # pylint: disable=redefined-builtin
    eval_fraction: float = 0.1,
) -> DataSource:
  """A classification dataset from your arrays.

  ``x`` and ``y`` may be numpy arrays or paths to ``.npy`` files; or ``x`` may
  be a path to an ``.npz`` file (``y`` None) holding ``"x"``, ``"y"`` and
  optionally ``"x_eval"``, ``"y_eval"``. Without explicit eval data, the last
  ``eval_fraction`` of the examples, after a fixed (seed 0) permutation, is
  held out, so the split does not depend on the run's seed. Features become
  float32.

  Args:
    x: features shaped (N, ...), or a path to ``.npy`` / ``.npz``.
    y: integer class labels shaped (N,) (values >= 0), or a path to ``.npy``.
    sharding: ``"iid"``, ``"contiguous"`` or ``"dirichlet"`` (by label).
    alpha: Dirichlet concentration for ``"dirichlet"``.
    eval: optional held-out ``(x_eval, y_eval)``, arrays or ``.npy`` paths.
    eval_fraction: fraction held out when no eval data is given, in (0, 1).

  Returns:
    A classification ``DataSource``.

  Example:
    >>> import numpy as np
    >>> from lowbw import data
    >>> x = np.random.default_rng(0).normal(size=(200, 5))
    >>> source = data.arrays(x, (x[:, 0] > 0).astype(int))
    >>> source.num_examples(), len(source.eval["y"])
    (180, 20)
  """
  config = {"name": "arrays", "x": _describe(x), "y": _describe(y),
            "sharding": sharding, "alpha": alpha, "eval": _describe(eval),
            "eval_fraction": eval_fraction}
  name = os.path.basename(os.fspath(x)) if _is_path(x) else "arrays"
  x_train, y_train, pair = _given(x, y, eval)
  x_train = _features(x_train, "x")
  y_train = _labels(y_train, "y", len(x_train))
  if eval is not None:
    if not isinstance(eval, (tuple, list)) or len(eval) != 2:
      raise _validate.fail(
          "eval", _describe(eval), "expected None or a pair (x_eval, y_eval)")
    pair = (_load(eval[0]), _load(eval[1]))
  if pair is not None:
    x_eval = _features(pair[0], "x_eval")
    y_eval = _labels(pair[1], "y_eval", len(x_eval))
  else:
    x_train, y_train, x_eval, y_eval = _hold_out(x_train, y_train,
                                                 eval_fraction)
  return DataSource(
      name=name,
      task="classification",
      train={"x": x_train, "y": y_train},
      eval={"x": x_eval, "y": y_eval},
      sharding=sharding,
      alpha=alpha,
      config=config,
  )


def _tokens(path: str, field: str) -> np.ndarray:
  path = _existing(path, field)
  size = os.path.getsize(path)
  if size % 2:
    raise _validate.fail(
        field, path, "expected a raw uint16 token file (its size is odd)")
  if size // 2 >= 2**31:  # checked before reading gigabytes for nothing
    raise _validate.fail(
        field, path, f"holds {size // 2:,} tokens; expected fewer than 2**31 "
        "(int32 offsets on device)")
  # Little-endian on disk whatever the machine, native in memory.
  return np.fromfile(path, dtype="<u2").astype(np.uint16, copy=False)


def token_file(
    path: str | os.PathLike[str],
    seq_len: int = 128,
    eval_path: str | os.PathLike[str] | None = None,
    eval_fraction: float = 0.05,
    sharding: str = "iid",
) -> DataSource:
  """Language modelling on a raw uint16 token file (nanoGPT's ``train.bin``).

  Args:
    path: a file of little-endian uint16 token ids, as written by
      ``np.array(ids, np.uint16).tofile(path)``.
    seq_len: tokens per example; each example is ``seq_len + 1`` tokens.
    eval_path: an optional held-out token file (nanoGPT's ``val.bin``);
      without it the last ``eval_fraction`` of ``path``'s tokens is held out.
    eval_fraction: used without ``eval_path``, in (0, 1).
    sharding: ``"iid"`` or ``"contiguous"``.

  Returns:
    An lm ``DataSource`` of uint16 tokens; ``vocab_size`` is the largest token
    id (train or eval) + 1.

  Example:
    >>> import numpy as np, tempfile, os
    >>> from lowbw import data
    >>> path = os.path.join(tempfile.mkdtemp(), "train.bin")
    >>> np.arange(5000, dtype=np.uint16).tofile(path)
    >>> source = data.token_file(path, seq_len=64)
    >>> source.vocab_size, source.num_examples()
    (5000, 74)
  """
  _validate.positive_int("seq_len", seq_len)
  tokens = _tokens(path, "path")
  if eval_path is not None:
    train, held_out = tokens, _tokens(eval_path, "eval_path")
  else:
    fraction = _common.eval_fraction(eval_fraction)
    if len(tokens) < 2:
      raise _validate.fail(
          "path", os.fspath(path), "expected a token file of at least 2 tokens")
    cut = len(tokens) - _common.held_out_count(len(tokens), fraction)
    train, held_out = tokens[:cut], tokens[cut:]
  vocab_size = int(max(train.max(initial=0), held_out.max(initial=0))) + 1
  return DataSource(
      name=os.path.basename(os.fspath(path)),
      task="lm",
      train={"tokens": train},
      eval={"tokens": held_out},
      sharding=sharding,
      seq_len=seq_len,
      vocab_size=vocab_size,
      config={"name": "token_file", "path": os.fspath(path), "seq_len": seq_len,
              "eval_path": None if eval_path is None else os.fspath(eval_path),
              "eval_fraction": eval_fraction, "sharding": sharding},
  )
