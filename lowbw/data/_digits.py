"""The embedded default dataset: scikit-learn's 8x8 handwritten digits."""

import importlib.util
import os

import numpy as np

from lowbw.data import _common
from lowbw.data._source import DataSource

_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _digits_file() -> str | None:
  """scikit-learn's ``digits.csv.gz``, found without importing scikit-learn
  (importing it takes ~0.7 s; reading the file ~5 ms)."""
  spec = importlib.util.find_spec("sklearn")
  for root in (spec.submodule_search_locations or []) if spec else []:
    path = os.path.join(root, "datasets", "data", "digits.csv.gz")
    if os.path.exists(path):
      return path
  return None


def _read() -> tuple[np.ndarray, np.ndarray]:
  """The 8x8 images (float64, 0..16) and labels, as scikit-learn's
  ``load_digits`` gives them."""
  path = _digits_file()
  if path is not None:
    table = np.loadtxt(path, delimiter=",")  # scikit-learn's own reader
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)
  try:
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ModuleNotFoundError(
        "lowbw.data.digits needs scikit-learn, which ships the digits data "
        "set (no download): python -m pip install scikit-learn") from e
  digits = datasets.load_digits()
  return digits.images, digits.target


def _load() -> tuple[np.ndarray, np.ndarray]:
  if "digits" not in _CACHE:
    images, target = _read()
    x = (images / 16.0).astype(np.float32)[..., None]
    y = target.astype(np.int32)
    _CACHE["digits"] = (_common.frozen(x), _common.frozen(y))
  return _CACHE["digits"]


def digits(
    sharding: str = "iid", alpha: float = 0.5, eval_fraction: float = 0.2
) -> DataSource:
  """The UCI handwritten digits (1797 images, 8x8, 10 classes) from scikit-learn.

  The data ships inside scikit-learn, so this needs no download. Pixels are
  scaled to [0, 1]. The eval split comes from a fixed permutation (numpy seed
  0), independent of the run's seed, so every run evaluates on the same images.

  Args:
    sharding: ``"iid"``, ``"contiguous"`` or ``"dirichlet"`` (non-IID by label).
    alpha: Dirichlet concentration for ``"dirichlet"``; smaller is more skewed.
    eval_fraction: fraction of the images held out, in (0, 1).

  Returns:
    A classification ``DataSource``: x float32 (N, 8, 8, 1), y int32 (N,).

  Example:
    >>> from lowbw import data
    >>> source = data.digits(sharding="dirichlet", alpha=0.3)
    >>> source.num_examples(), source.num_classes
    (1438, 10)
  """
  fraction = _common.eval_fraction(eval_fraction)
  x, y = _load()
  order = np.random.default_rng(0).permutation(len(y))
  cut = len(y) - _common.held_out_count(len(y), fraction)
  # Sorted, so that "contiguous" sharding sees the data in its original order.
  train, held_out = np.sort(order[:cut]), np.sort(order[cut:])
  return DataSource(
      name="digits",
      task="classification",
      train={"x": _common.frozen(x[train]), "y": _common.frozen(y[train])},
      eval={"x": _common.frozen(x[held_out]), "y": _common.frozen(y[held_out])},
      sharding=sharding,
      alpha=alpha,
      config={"name": "digits", "sharding": sharding, "alpha": alpha,
              "eval_fraction": eval_fraction},
  )
