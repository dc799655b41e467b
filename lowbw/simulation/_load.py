"""``lowbw.load(RUN_DIR)``: a finished run's model, parameters, history and
tokenizer back out of its folder."""

import csv
import json
import math
import os
from typing import Any, NamedTuple

import jax
import numpy as np

from lowbw import _validate, telemetry
from lowbw.telemetry import _checkpoint
from lowbw.config import Config
from lowbw.data import _tokenizer
from lowbw import models as models_lib


class SavedRun(NamedTuple):
  """A run read back from its folder.

  Attributes:
    config: the run's ``config.json`` (model, data, strategy, network,
      seed, ...).
    model: the ``Model`` rebuilt from ``config["model"]``: ``model.apply(
      params, inputs)`` gives logits.
    params: the global parameters: the final ones (``params.npz``), or a
      checkpoint's at the step asked for.
    step: the step those parameters are from.
    history: ``metrics.csv`` as ``{column: np.ndarray}`` (NaN where a row
      has no value).
    summary: ``summary.json``.
    tokenizer: for language models, an object with ``encode_ids(text)``,
      ``decode_ids(ids)`` and ``eos_id()``: the run's BPE (``tokenizer.json`` in the folder)
      or bytes; None for classification.
    run_dir: the folder.
  """
  config: dict[str, Any]
  model: Any
  params: Any
  step: int
  history: dict[str, np.ndarray]
  summary: dict[str, Any]
  tokenizer: Any
  run_dir: str


def load(run_dir: str, step: int | None = None) -> SavedRun:
  """Reads a finished run.

  Args:
    run_dir: a ``lowbw train --out`` / ``lowbw.simulate(out=...)``
      folder.
    step: None for the final parameters; or a step the run checkpointed
      (``checkpoint_every``), restored by rebuilding the run from its
      ``config.yaml``.

  Returns:
    A ``SavedRun``.

  Example:
    >>> import lowbw, tempfile, numpy as np
    >>> folder = tempfile.mkdtemp()
    >>> _ = lowbw.simulate(lowbw.Config(data="digits", strategy="ddp",
    ...                                 steps=5, workers=2, out=folder))
    >>> run = lowbw.load(folder)
    >>> run.model.apply(run.params, np.zeros((1, 8, 8, 1))).shape
    (1, 10)
  """
  run_dir = os.fspath(run_dir)
  config = _json(run_dir, "config.json")
  model = models_lib.get(**config["model"])
  if step is None:
    params = telemetry.load_params(run_dir)
    step = int(config.get("steps", 0))
  else:
    params = _checkpoint_params(run_dir, step)
  summary = (_json(run_dir, "summary.json")
             if os.path.isfile(os.path.join(run_dir, "summary.json")) else {})
  return SavedRun(config, model, params, step, read_history(run_dir), summary,
                  tokenizer_of(run_dir, model), run_dir)


def _json(run_dir: str, name: str) -> dict:
  path = os.path.join(run_dir, name)
  if not os.path.isdir(run_dir):
    raise _validate.fail("run_dir", run_dir, "is not a folder: expected the "
                         "folder of a lowbw run (lowbw train --out)")
  if not os.path.isfile(path):
    raise _validate.fail("run_dir", run_dir, f"has no {name}: expected the "
                         "folder of a lowbw run (lowbw train --out)")
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except ValueError as e:  # JSON's words name no file
    raise _validate.fail("run_dir", run_dir, f"its {name} is not readable "
                         f"JSON ({str(e).splitlines()[0]})") from None
  except RecursionError:  # the reader recurses once per level
    raise _validate.fail("run_dir", run_dir, f"its {name} nests lists or "
                         "objects too deeply to read; lowbw writes flat "
                         "ones") from None
  if not isinstance(value, dict):
    raise _validate.fail("run_dir", run_dir, f"its {name} holds a JSON "
                         f"{type(value).__name__}; expected an object")
  return value


def read_history(run_dir: str) -> dict[str, np.ndarray]:
  """``metrics.csv`` as float columns ({} without one)."""
  path = os.path.join(run_dir, "metrics.csv")
  if not os.path.isfile(path):
    return {}
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    rows = list(reader)
    columns = reader.fieldnames or []
  return {c: np.array([_float(r.get(c)) for r in rows]) for c in columns}


def _float(text) -> float:
  try:
    return float(text)
  except (TypeError, ValueError):
    return math.nan


def tokenizer_of(run_dir: str, model):
  """The run's tokenizer: its ``tokenizer.json``, else bytes (lm models);
  None for other models."""
  if model.task != "lm":
    return None
  path = os.path.join(run_dir, "tokenizer.json")
  if os.path.isfile(path):
    return _tokenizer.BPE(_tokenizer.load(path))
  return _tokenizer.Bytes()


def _checkpoint_params(run_dir: str, step: int):
  """A checkpoint's global parameters: the run rebuilt from its
  ``config.yaml``, its state restored at ``step``."""
  yaml_path = os.path.join(run_dir, "config.yaml")
  checkpoints = os.path.join(run_dir, telemetry.CHECKPOINTS)
  if not os.path.isdir(checkpoints):
    raise _validate.fail("step", step, "this run kept no checkpoints "
                         "(checkpoint_every); only its final parameters "
                         "(step=None) can be loaded")
  if not os.path.isfile(yaml_path):
    raise _validate.fail("step", step, "the run has no config.yaml to "
                         "rebuild it from (it was given Python objects)")
  with open(os.path.join(run_dir, "config.json")) as f:
    seed = json.load(f).get("seed", 0)
  saved = _checkpoint_steps(checkpoints)
  if step not in saved:
    raise _validate.fail("step", step, "no checkpoint at that step; the run "
                         f"kept steps {saved}")
  from lowbw.simulation._api import build_config  # _api builds through us
  sim = build_config(Config.load(yaml_path), compile=False)
  state, sampler, net, _ = sim.initial(seed)
  _, state, _ = _checkpoint.restore(checkpoints, state, step)
  exe, state = sim.executables(state, sampler, net)
  return jax.device_get(exe.global_params(state))


def _checkpoint_steps(checkpoints: str) -> list[int]:
  return sorted(int(name) for name in os.listdir(checkpoints)
                if name.isdigit())
