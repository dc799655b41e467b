"""Models written for other JAX libraries, as lowbw ``Model``s: a Flax NNX
module (``from_nnx``), an Equinox model (``from_equinox``) and a plain
``(init, apply)`` pair (``from_apply``); and ``as_model``, which turns
whatever a user passes as ``model=`` into a ``Model``.

Each becomes the contract's pure functions: the parameters are a plain
tree of arrays (what the workers stack and the optimizers update), and
``apply`` rebuilds the user's object around them for one forward pass.
Only trainable arrays become parameters; state that changes in a forward
pass (batch statistics, random-number state) is refused, because the
simulator's workers are pure functions of their parameters.
"""

import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw._types import Array, Batch, Params, PRNGKey
from lowbw.models._contract import (TASKS, Model, _cross_entropy,
                                    _inputs_and_labels, from_flax)


def _scored(apply, loss, task: str):
  """The contract's ``loss``: the user's ``loss(forward, batch)`` (its value,
  or ``(value, metrics)``) with ``forward`` the model called on inputs, or,
  without one, the cross-entropy of the logits of the task's inputs."""

  def scored(params: Params, batch: Batch, key: PRNGKey | None = None):
    del key  # the wrapped models are deterministic
    if loss is None:
      inputs, labels = _inputs_and_labels(batch, task)
      return _cross_entropy(apply(params, inputs), labels)
    out = loss(lambda inputs: apply(params, inputs), batch)
    value, metrics = out if isinstance(out, tuple) else (out, {})
    return jnp.asarray(value, jnp.float32), dict(metrics)

  return scored


def _copied(params: Params) -> Params:
  """Fresh arrays: a run donates its state's buffers, which must never be
  the user's model's own."""
  return jax.tree.map(jnp.copy, params)


def _checked(task: str, loss, flops_per_token) -> dict:
  _validate.one_of("task", task, TASKS)
  if loss is not None and not callable(loss):
    raise _validate.fail("loss", type(loss).__name__, "a function "
                         "loss(forward, batch) -> loss or (loss, metrics)")
  extra = {}
  if flops_per_token is not None:
    extra["flops_per_token"] = float(_validate.positive_float(
        "flops_per_token", flops_per_token))
  return extra


def from_nnx(module: Any, loss: Callable | None = None,
             task: str = "classification",
             flops_per_token: float | None = None) -> Model:
  """Wraps a Flax NNX module (``flax.nnx.Module``) whose ``__call__(inputs)``
  returns logits.

  The parameters are the module's ``nnx.Param`` variables as a plain dict
  (``nnx.State.to_pure_dict``); every worker starts from the values the
  module was built with (its own ``nnx.Rngs`` seeded them), so the run's
  seed does not redraw them. Other state (batch statistics, dropout's
  random-number state) is refused.

  Args:
    module: the module instance.
    loss: ``loss(forward, batch) -> loss`` or ``(loss, metrics)``, with
      ``forward(inputs)`` the module's call on the current parameters; None:
      the cross-entropy of the logits of ``batch["x"]`` (classification) or
      ``batch["tokens"][:, :-1]`` (lm), with accuracy.
    task: ``"classification"`` or ``"lm"`` (the default loss's batches).
    flops_per_token: the forward and backward FLOPs of one example (one
      token for lm) that the clock charges; None: 6 x parameters.

  Example:
    >>> from flax import nnx
    >>> model = lowbw.models.from_nnx(nnx.Linear(64, 10, rngs=nnx.Rngs(0)))
  """
  from flax import nnx
  if not isinstance(module, nnx.Module):
    raise _validate.fail("module", type(module).__name__,
                         "a flax.nnx.Module instance")
  extra = _checked(task, loss, flops_per_token)
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  others = sorted({type(v).__name__ for v in jax.tree.leaves(
      rest, is_leaf=lambda x: isinstance(x, nnx.Variable))})
  if others:
    raise _validate.fail(
        "module", type(module).__name__, f"a module whose state is "
        f"nnx.Param only; it has {others} (write init/loss functions for "
        "stateful models)")
  start = nnx.to_pure_dict(params)

  def apply(p: Params, inputs: Array) -> Array:
    state = jax.tree.map(lambda x: x, params)
    nnx.replace_by_pure_dict(state, p)
    return nnx.merge(graphdef, state, rest)(inputs)

  name = type(module).__name__
  return Model(init=lambda key, batch: _copied(start),
               loss=_scored(apply, loss, task), task=task, name=name,
               config={"name": name, "task": task, "library": "flax.nnx",
                       **extra}, apply=apply)


def from_equinox(model: Any, loss: Callable | None = None,
                 task: str = "classification",
                 flops_per_token: float | None = None,
                 batched: bool = False) -> Model:
  """Wraps an Equinox model (an ``equinox.Module``) that maps one example's
  inputs to its logits (Equinox's convention; ``batched=True``: the whole
  batch's).

  The parameters are the model's inexact arrays
  (``equinox.partition(model, equinox.is_inexact_array)``), every worker
  starting from the values the model was built with; the rest (integer
  arrays, functions, sizes) stays fixed. ``apply`` calls the model on each
  example with ``jax.vmap`` unless ``batched``.

  Args:
    model: the model instance.
    loss: ``loss(forward, batch) -> loss`` or ``(loss, metrics)``, with
      ``forward(inputs)`` the batch's logits; None: the cross-entropy of the
      task's logits, with accuracy.
    task: ``"classification"`` or ``"lm"`` (the default loss's batches).
    flops_per_token: as for ``from_nnx``; None: 6 x parameters.
    batched: the model takes a batch rather than one example.

  Example:
    >>> import equinox as eqx
    >>> mlp = eqx.nn.MLP(64, 10, 32, 2, key=jax.random.key(0))
    >>> model = lowbw.models.from_equinox(mlp)
  """
  import equinox as eqx
  if not isinstance(model, eqx.Module):
    raise _validate.fail("model", type(model).__name__,
                         "an equinox.Module instance")
  extra = _checked(task, loss, flops_per_token)
  _validate.boolean("batched", batched)
  start, static = eqx.partition(model, eqx.is_inexact_array)

  def apply(p: Params, inputs: Array) -> Array:
    built = eqx.combine(p, static)
    return built(inputs) if batched else jax.vmap(built)(inputs)

  name = type(model).__name__
  return Model(init=lambda key, batch: _copied(start),
               loss=_scored(apply, loss, task), task=task, name=name,
               config={"name": name, "task": task, "library": "equinox",
                       **extra}, apply=apply)


def from_apply(init: Callable, apply: Callable, loss: Callable | None = None,
               task: str = "classification",
               flops_per_token: float | None = None) -> Model:
  """A model from an ``(init, apply)`` pair, as Haiku's ``transform`` or
  a hand-written network gives: ``init(key, inputs) -> params`` and
  ``apply(params, inputs) -> logits``, scored by the task's cross-entropy
  (or ``loss(forward, batch)`` as for ``from_nnx``).

  Example:
    >>> init = lambda key, x: {"w": jax.random.normal(key, (x.shape[-1], 3))}
    >>> model = lowbw.models.from_apply(init, lambda p, x: x @ p["w"])
  """
  for field, fn in (("init", init), ("apply", apply)):
    if not callable(fn):
      raise _validate.fail(field, type(fn).__name__, "a function")
  extra = _checked(task, loss, flops_per_token)

  def init_params(key: PRNGKey, batch: Batch) -> Params:
    return _copied(init(key, _inputs_and_labels(batch, task)[0]))

  return Model(init=init_params, loss=_scored(apply, loss, task), task=task,
               name="custom", config={"name": "custom", "task": task,
                                      **extra}, apply=apply)


def as_model(obj: Any) -> Model:
  """Turns what a user passes as ``model=`` into a :class:`Model`.

  Args:
    obj: a :class:`Model` (returned as is); a ``flax.linen.Module`` instance
      (wrapped by :func:`from_flax` as a classifier); or a pair
      ``(init, loss)`` of functions following the :class:`Model` contract
      (task and name ``"custom"``, no ``apply``).

  Returns:
    A :class:`Model`.

  Raises:
    ValueError: naming field ``model`` for anything else.

  Example:
    >>> model = as_model((my_init, my_loss))  # doctest: +SKIP
  """
  # Model is itself a tuple, so it must be matched before the pair case.
  if isinstance(obj, Model):
    return obj
  if isinstance(obj, nn.Module):
    return from_flax(obj)
  foreign = _foreign_model(obj)
  if foreign is not None:
    return foreign
  if (isinstance(obj, (tuple, list)) and len(obj) == 2
      and all(callable(f) for f in obj)):
    init, loss = obj
    return Model(init=init, loss=loss, task="custom", name="custom",
                 config={"name": "custom"})
  # A long repr (a params tree, an array) would bury the message.
  shown = obj if isinstance(obj, (str, int, float, type(None))) else (
      f"<{type(obj).__name__}>")
  raise _validate.fail(
      "model", shown, "expected a lowbw Model, a flax.linen.Module, a "
      "flax.nnx.Module or an equinox.Module instance, or an (init, loss) "
      "pair of functions")


def _foreign_model(obj: Any) -> Model | None:
  """A Flax NNX module or an Equinox model, wrapped as a classifier; None
  for anything else (neither library is imported for the check unless the
  user's program has)."""
  nnx = sys.modules.get("flax.nnx")
  if nnx is not None and isinstance(obj, nnx.Module):
    return from_nnx(obj)
  eqx = sys.modules.get("equinox")
  if eqx is not None and isinstance(obj, eqx.Module):
    return from_equinox(obj)
  return None
