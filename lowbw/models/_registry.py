"""Built-in models by name, for the CLI and config files."""

import inspect
from typing import Any

from lowbw import _validate
from lowbw.models import _cnn, _contract, _foreign, _gpt, _mlp, _moe_gpt

_FACTORIES = {"mlp": _mlp.mlp, "cnn": _cnn.cnn, "gpt": _gpt.gpt,
              "moe_gpt": _moe_gpt.moe_gpt}


_BUILT_IN = frozenset(_FACTORIES)


def names() -> tuple[str, ...]:
  """The models a config file or ``--model`` may name: the built-in ones and
  those registered (``register``)."""
  return tuple(sorted(_FACTORIES))


def register(name: str, factory) -> None:
  """Makes ``name`` a model a config file, ``lowbw train --model NAME`` and
  a study's grid can name, as the built-in ones: ``factory()`` (called
  without arguments) returns the ``Model`` (or what ``as_model`` accepts:
  a flax module, an ``(init, loss)`` pair).

  Example:
    >>> lowbw.models.register("wide_mlp", lambda: lowbw.models.mlp(
    ...     hidden=(512, 512)))
  """
  _validate.identifier("name", name, "model")
  if name in _BUILT_IN:
    raise _validate.fail("name", name, "is a built-in model")
  if not callable(factory):
    raise _validate.fail("factory", factory, "expected a function returning "
                         "a lowbw.models.Model")
  _FACTORIES[name] = lambda **kwargs: _foreign.as_model(factory(**kwargs))


def get(name: str, **kwargs: Any) -> _contract.Model:
  """Builds a built-in model by name.

  Args:
    name: ``"mlp"``, ``"cnn"``, ``"gpt"`` or ``"moe_gpt"``.
    **kwargs: arguments of that factory (:func:`mlp`, :func:`cnn`,
      :func:`gpt` with its block options, :func:`moe_gpt`).

  Returns:
    The :class:`Model`; ``get(**model.config)`` rebuilds it.

  Example:
    >>> model = get("gpt", layers=4, d_model=256)
    >>> llama_like = get("gpt", norm="rmsnorm", mlp="swiglu", position="rotary")
  """
  _validate.one_of("model", name, _FACTORIES)
  factory = _FACTORIES[name]
  accepted = list(inspect.signature(factory).parameters)
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    # A TypeError from the call would not say which model or what is allowed.
    raise _validate.fail(
        f"model.{unknown[0]}", kwargs[unknown[0]],
        f"{name} accepts only " + ", ".join(accepted))
  return factory(**kwargs)
