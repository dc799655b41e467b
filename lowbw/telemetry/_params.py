"""A run's final global parameters as one ``params.npz`` in its folder:
every leaf under its path in the tree (``['block_0']['attn']['qkv']
['kernel']``), readable with numpy alone."""

import io
import os
import re
import zipfile

import jax
import numpy as np

from lowbw import _validate
from lowbw.telemetry._writers import write_bytes

PARAMS = "params.npz"


def save_params(run_dir: str, params) -> str:
  """Writes ``params`` (a pytree of arrays) to ``run_dir/params.npz``,
  atomically; returns the path."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  arrays = {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf))
            for path, leaf in leaves}
  path = os.path.join(run_dir, PARAMS)
  data = io.BytesIO()
  np.savez(data, **arrays)
  # The one atomic write (a temporary file renamed over the old one), with
  # its WriteError on a full disk and its kill point.
  write_bytes(path, data.getvalue())
  return path


def load_params(run_dir: str, like=None):
  """The parameters in ``run_dir/params.npz``: nested dicts (the built-in
  models' trees), or the structure of ``like`` (a pytree of arrays or
  ``jax.ShapeDtypeStruct``, e.g. the model's ``jax.eval_shape(init, ...)``),
  whose shapes must match."""
  path = os.path.join(run_dir, PARAMS)
  if not os.path.isfile(path):
    raise _validate.fail("run_dir", run_dir, f"has no {PARAMS} (runs write "
                         "it when they finish; an interrupted run has none)")
  try:
    with np.load(path, allow_pickle=False) as saved:
      stored = {k: saved[k] for k in saved.files}
  except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
    # numpy's and zipfile's words name neither the run nor the file.
    raise _validate.fail("run_dir", run_dir, f"its {PARAMS} is not a "
                         f"readable .npz ({str(e).splitlines()[0]}); was it "
                         "cut short or overwritten?") from None
  if like is None:
    return _nested(stored, path)
  paths, tree = jax.tree_util.tree_flatten_with_path(like)
  out = []
  for key_path, leaf in paths:
    key = jax.tree_util.keystr(key_path)
    if key not in stored:
      raise _validate.fail("run_dir", run_dir, f"its {PARAMS} lacks {key}; "
                           "it was written by another model")
    value = stored.pop(key)
    if value.shape != tuple(leaf.shape):
      raise _validate.fail("run_dir", run_dir, f"{key} has shape "
                           f"{value.shape} in {PARAMS}; the model's is "
                           f"{tuple(leaf.shape)}")
    out.append(value.astype(leaf.dtype))
  if stored:
    raise _validate.fail("run_dir", run_dir, f"its {PARAMS} holds "
                         f"{sorted(stored)[0]}, which the model has not")
  return jax.tree_util.tree_unflatten(tree, out)


def _nested(stored: dict, path: str) -> dict:
  """``{"['a']['b']": x}`` -> ``{"a": {"b": x}}``."""
  out: dict = {}
  for key, value in stored.items():
    names = re.findall(r"\['((?:[^'\\]|\\.)*)'\]", key)
    if "".join(f"['{n}']" for n in names) != key or not names:
      raise _validate.fail("params", path, f"key {key} is not a path of "
                           "dict keys; pass like= (the model's params "
                           "structure) to read it")
    node = out
    for name in names[:-1]:
      node = node.setdefault(name, {})
    node[names[-1]] = value
  return out
