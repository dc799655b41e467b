"""The model contract: a NamedTuple of pure ``init``/``loss`` functions (and,
for the built-in and wrapped models, ``apply``).

Every model lowbw trains is a :class:`Model`. The simulator never looks inside
it: it vmaps ``init`` and ``loss`` over the worker axis, so both must be pure
functions of arrays (no Python state, no host syncs).
"""

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from lowbw import _validate
from lowbw._types import Array, Batch, Params, PRNGKey, PyTree

TASKS = ("classification", "lm")


class Model(NamedTuple):
  """A model as pure functions plus a description.

  Attributes:
    init: ``init(key, batch) -> params``; ``batch`` is an example batch of ONE
      worker (numpy or jax arrays); only its shapes and dtypes matter.
    loss: ``loss(params, batch, key) -> (loss, metrics)``: a scalar float32
      mean loss and a dict of scalar metrics. ``key`` is for stochastic models
      (dropout); the built-in models are deterministic and ignore it.
    task: ``"classification"`` (batch ``{"x": (b, ...), "y": int (b,)}``),
      ``"lm"`` (batch ``{"tokens": int (b, seq_len + 1)}``) or ``"custom"``.
    name: ``"mlp"``, ``"cnn"``, ``"gpt"``, a flax module's class name, or
      ``"custom"``.
    config: JSON-serialisable ``{"name": name, **factory kwargs}``; a run
      writes it to its ``config.json``.
    apply: ``apply(params, inputs) -> logits``, the forward pass that
      ``loss`` scores, or None (a custom ``(init, loss)`` pair). For ``"lm"``
      models ``inputs`` are int tokens (b, T) with T <= the model's
      ``seq_len`` and the logits are float (b, T, vocab); for
      ``"classification"`` ``inputs`` are ``x`` (b, ...) and the logits are
      (b, classes). Last and optional, so ``Model(init, loss, task, name,
      config)`` still builds one.
    pooled: True when ``loss`` is the mean of its examples' losses (and
      metrics the mean of theirs) and examples do not interact, so that a
      stack of W batches of b examples scores as one batch of W*b (the
      built-in mlp, cnn and gpt). DDP then differentiates one replica on the
      W*b examples as one batch, as a single-replica loop would. Default
      False: each worker's batch is scored on its own.
  """
  init: Callable[[PRNGKey, Batch], Params]
  loss: Callable[[Params, Batch, PRNGKey], tuple[Array, dict[str, Array]]]
  task: str
  name: str
  config: dict[str, Any]
  apply: Callable[[Params, Array], Array] | None = None
  pooled: bool = False


def param_count(params: PyTree) -> int:
  """Number of scalars in ``params`` (a stacked ``params_W`` counts W times).

  Works on arrays and on ``jax.eval_shape`` results alike.
  """
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))


def positive_ints(field: str, values: Any) -> tuple[int, ...]:
  """Validates a sequence of layer sizes (empty allowed)."""
  if isinstance(values, (str, bytes)) or not isinstance(values, (tuple, list)):
    raise _validate.fail(field, values, "expected a list of integers >= 1")
  return tuple(_validate.positive_int(f"{field}[{i}]", v)
               for i, v in enumerate(values))


def _batch_array(batch: Batch, field: str, task: str) -> Any:
  if not isinstance(batch, Mapping) or field not in batch:
    got = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
    raise _validate.fail(
        "batch", got, f"a {task} batch must be a dict with key {field!r}")
  return batch[field]


def _lm_split(batch: Batch) -> tuple[Array, Array]:
  """Splits ``tokens`` (b, T + 1) into inputs and next-token targets (b, T)."""
  tokens = _batch_array(batch, "tokens", "lm")
  shape = tuple(jnp.shape(tokens))
  if len(shape) != 2 or shape[1] < 2:
    raise _validate.fail(
        "batch['tokens'].shape", shape,
        "expected (batch, seq_len + 1) with seq_len >= 1")
  tokens = jnp.asarray(tokens)
  return tokens[:, :-1], tokens[:, 1:]


def _inputs_and_labels(batch: Batch, task: str) -> tuple[Array, Array]:
  if task == "lm":
    return _lm_split(batch)
  return (jnp.asarray(_batch_array(batch, "x", task)),
          jnp.asarray(_batch_array(batch, "y", task)))


def _cross_entropy(
    logits: Array, labels: Array
) -> tuple[Array, dict[str, Array]]:
  """Mean softmax cross-entropy and accuracy over every leading axis.

  Serves both tasks: (b, C) logits with (b,) labels, and (b, T, V) logits with
  (b, T) next-token labels.
  """
  if logits.shape[:-1] != labels.shape:
    raise _validate.fail(
        "logits.shape", logits.shape,
        f"the model must return logits shaped labels.shape + (classes,) = "
        f"{labels.shape} + (classes,)")
  # float32 even for low-precision logits: the mean over many examples is
  # what the non-finite check and the logs read.
  logits = logits.astype(jnp.float32)
  labels = labels.astype(jnp.int32)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  hits = jnp.argmax(logits, axis=-1) == labels
  return loss, {"accuracy": hits.astype(jnp.float32).mean()}


def wrap_module(
    module: nn.Module, task: str, name: str, config: dict[str, Any],
    pooled: bool = False
) -> Model:
  """The Model of a linen module mapping inputs to logits: ``apply`` is the
  module's forward and ``loss`` the cross-entropy of its logits. ``pooled``:
  the module treats each example on its own (``Model.pooled``)."""

  def init(key: PRNGKey, batch: Batch) -> Params:
    inputs, _ = _inputs_and_labels(batch, task)
    variables = module.init(key, inputs)
    # Optimizers would treat any other collection (batch_stats, cache) as
    # trainable, silently corrupting it, so refuse rather than drop it.
    extra = sorted(k for k in variables if k != "params")
    if extra:
      raise _validate.fail(
          "model", name, f"module has variable collections {extra}; only "
          "'params' is supported (write init/loss functions for stateful "
          "models)")
    return variables.get("params", {})

  def apply(params: Params, inputs: Array) -> Array:
    return module.apply({"params": params}, inputs)

  def loss(
      params: Params, batch: Batch, key: PRNGKey | None = None
  ) -> tuple[Array, dict[str, Array]]:
    del key  # The wrapped modules are deterministic.
    inputs, labels = _inputs_and_labels(batch, task)
    return _cross_entropy(apply(params, inputs), labels)

  return Model(init=init, loss=loss, task=task, name=name, config=config,
               apply=apply, pooled=pooled)


def from_flax(module: nn.Module, task: str = "classification") -> Model:
  """Wraps a flax linen module whose ``__call__(inputs)`` returns logits.

  The loss is the mean softmax cross-entropy, with metrics ``{"accuracy"}``.
  The module must be deterministic and keep no state besides ``params``.

  Args:
    module: a ``flax.linen.Module`` instance. For ``task="classification"`` it
      is called on ``batch["x"]`` and returns (b, classes) logits; for
      ``task="lm"`` it is called on ``batch["tokens"][:, :-1]`` and returns
      (b, T, vocab) logits.
    task: ``"classification"`` (default) or ``"lm"``.

  Returns:
    A :class:`Model` named after the module's class, with config
    ``{"name": class name, "task": task}``; its ``apply(params, inputs)``
    is ``module.apply({"params": params}, inputs)``.

  Example:
    >>> import flax.linen as nn
    >>> import jax, jax.numpy as jnp
    >>> class Linear(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.Dense(3)(x)
    >>> model = from_flax(Linear())
    >>> batch = {"x": jnp.ones((4, 5)), "y": jnp.zeros((4,), jnp.int32)}
    >>> params = model.init(jax.random.key(0), batch)
    >>> loss, metrics = model.loss(params, batch, jax.random.key(1))
    >>> logits = model.apply(params, batch["x"])  # (4, 3)
  """
  if not isinstance(module, nn.Module):
    raise _validate.fail("module", type(module).__name__,
                         "expected a flax.linen.Module instance")
  _validate.one_of("task", task, TASKS)
  name = type(module).__name__
  return wrap_module(module, task, name, {"name": name, "task": task})


def _shown(tree: Any) -> str:
  """What a function returned, by structure, shape and dtype (no values)."""
  if isinstance(tree, Mapping):
    return "{" + ", ".join(f"{k!r}: {_shown(v)}" for k, v in tree.items()) + "}"
  if isinstance(tree, (tuple, list)):
    inner = ", ".join(_shown(v) for v in tree)
    return f"({inner},)" if len(tree) == 1 else f"({inner})"
  if hasattr(tree, "shape") and hasattr(tree, "dtype"):
    return f"{tree.dtype}{list(tree.shape)}"
  return type(tree).__name__


def _abstract(fn, what: str, model_name: str, *args):
  """``jax.eval_shape(fn, *args)``; an exception from the user's function
  keeps its traceback (a bug is a bug) with a note saying where it came
  from."""
  try:
    return jax.eval_shape(fn, *args)
  except _validate.ConfigError:
    raise
  except Exception as e:
    e.add_note(f"(raised by model={model_name!r}'s {what}, which lowbw "
               "evaluates on one worker's example batch before compiling)")
    raise


_LOSS_CONTRACT = ("loss(params, batch, key) must return (loss, metrics): a "
                  "scalar float loss and a dict of scalar metrics ({} for "
                  "none)")

_NUMBERS = (bool, int, float, complex)


def _array(leaf: Any) -> bool:
  """A jax or numpy array (or numpy scalar) of a type jax can trace."""
  if isinstance(leaf, jax.Array):
    return True
  return (isinstance(leaf, (np.ndarray, np.generic))
          and leaf.dtype.kind in "biufc")


def _kind(leaf: Any) -> str:
  """"Python float", "numpy array of dtype <U1", "Foo"."""
  if isinstance(leaf, (*_NUMBERS, str)):
    return f"Python {type(leaf).__name__}"
  if isinstance(leaf, (np.ndarray, np.generic)):
    return f"numpy array of dtype {leaf.dtype}"
  return type(leaf).__name__


def _checked_init(model: Model) -> Callable:
  """``model.init``, refusing leaves that are not arrays: ``eval_shape``
  would pass a Python float as float32[] and the transforms, which index
  every leaf, would then fail on it; a str is no jax type at all."""

  def init(key: PRNGKey, batch: Batch) -> Params:
    params = model.init(key, batch)
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
      if not _array(leaf):
        raise _validate.fail(
            "model", model.name, f"init returned parameter "
            f"{jax.tree_util.keystr(path) or 'params'} as a "
            f"{_kind(leaf)}; every parameter must be a floating-point "
            "array (jnp.asarray(value, jnp.float32) makes one)")
    return params

  return init


def _checked_loss(model: Model) -> Callable:
  """``model.loss``, refusing outputs jax cannot trace (a str metric) with
  the contract, rather than jax's "not a valid JAX type"."""

  def loss(*args):
    out = model.loss(*args)
    if not all(_array(leaf) or isinstance(leaf, _NUMBERS)
               for leaf in jax.tree.leaves(out)):
      raise _validate.fail("model", model.name, _untraceable(out))
    return out

  return loss


def _untraceable(out: Any) -> str:
  """What is wrong with a loss output holding a non-numeric leaf."""
  if (isinstance(out, (tuple, list)) and len(out) == 2
      and isinstance(out[1], Mapping)):
    for key, value in out[1].items():
      if not (_array(value) or isinstance(value, _NUMBERS)):
        return (f"{_LOSS_CONTRACT}; its metric {key!r} is a "
                f"{_kind(value)}; expected a numeric scalar")
  return f"{_LOSS_CONTRACT}; it returned {_shown(out)}"


def _check_params(params: Params, name: str) -> None:
  """Float parameters, at least one, none float16."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  if not leaves:
    raise _validate.fail(
        "model", name, "init returned no parameters; expected at least one "
        "floating-point array to train")
  for path, leaf in leaves:
    where = jax.tree_util.keystr(path) or "params"
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      raise _validate.fail(
          "model", name, f"init returned parameter {where} of dtype "
          f"{leaf.dtype}; every parameter must be a floating-point array "
          "(optimizers update all of them; keep integer constants out of "
          "params)")
    # Measured: the default AdamW goes NaN at step 2 (its epsilon and small
    # squared gradients underflow in float16); bfloat16 has float32's range.
    if leaf.dtype == jnp.float16:
      raise _validate.fail(
          "model", name, f"init returned parameter {where} of dtype float16; "
          "float16 parameters are not supported (optimizer terms such as "
          "Adam's epsilon underflow and training goes NaN): parameters must "
          "be float32; for low precision use worker_dtype='bfloat16' or "
          "autocast='bfloat16'")


def check_contract(model: Model, batch: Batch,
                   key: PRNGKey) -> tuple[Params, list[str]]:
  """Checks ``model`` against the contract on an abstract evaluation
  (``jax.eval_shape``: nothing runs): float parameter arrays, and a loss
  returning ``(scalar float, {name: scalar})``.

  Returns:
    The abstract parameters and the sorted metric names.

  Raises:
    ValueError: naming ``model``, with what was returned and what is expected.
  """
  name = model.name
  params = _abstract(_checked_init(model), "init(key, batch)", name, key,
                     batch)
  _check_params(params, name)
  out = _abstract(_checked_loss(model), "loss(params, batch, key)", name,
                  params, batch, key)
  if not (isinstance(out, (tuple, list)) and len(out) == 2):
    raise _validate.fail("model", name, f"{_LOSS_CONTRACT}; it returned "
                         f"{_shown(out)}")
  loss, metrics = out
  if isinstance(loss, Mapping) and not isinstance(metrics, Mapping):
    raise _validate.fail("model", name, f"{_LOSS_CONTRACT}; it returned "
                         f"{_shown(out)}: (metrics, loss) in the wrong order?")
  if (not hasattr(loss, "shape") or loss.shape != ()
      or not jnp.issubdtype(loss.dtype, jnp.floating)):
    raise _validate.fail("model", name, f"{_LOSS_CONTRACT}; its loss is "
                         f"{_shown(loss)} (take the mean over the batch)")
  if not isinstance(metrics, Mapping):
    raise _validate.fail("model", name, f"{_LOSS_CONTRACT}; its metrics are "
                         f"{_shown(metrics)}")
  bad = {k: v for k, v in metrics.items()
         if not (isinstance(k, str) and getattr(v, "shape", None) == ())}
  if bad:
    raise _validate.fail("model", name, f"{_LOSS_CONTRACT}; its metrics "
                         f"include {_shown(bad)}")
  return params, sorted(metrics)


def floating(x: Array) -> Array:
  """Model inputs as floats: a floating input keeps its type (bfloat16 under
  ``autocast``, so the first layer computes in it), others become float32."""
  return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
