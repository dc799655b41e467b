"""A multilayer perceptron classifier."""

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

from lowbw import _validate
from lowbw._types import Array
from lowbw.models import _contract

_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "tanh": nn.tanh}


class MLP(nn.Module):
  """Flattens each example, then Dense layers with an activation between."""
  hidden: tuple[int, ...]
  num_classes: int
  activation: str

  @nn.compact
  def __call__(self, x: Array) -> Array:
    act = _ACTIVATIONS[self.activation]
    # Floating inputs keep their type (bf16 under autocast), others float32.
    h_BxD = _contract.floating(jnp.reshape(x, (x.shape[0], -1)))
    for width in self.hidden:
      h_BxD = act(nn.Dense(width)(h_BxD))
    return nn.Dense(self.num_classes, name="head")(h_BxD)


def mlp(
    hidden: Sequence[int] = (64,),
    num_classes: int = 10,
    activation: str = "relu",
) -> _contract.Model:
  """A multilayer perceptron classifier.

  Each example of ``batch["x"]`` (any feature shape) is flattened, passed
  through ``Dense(h) -> activation`` for each ``h`` in ``hidden``, then a
  ``Dense(num_classes)`` gives the logits (``model.apply(params, x)``, shaped
  (b, num_classes)). Loss: mean softmax cross-entropy against ``batch["y"]``;
  metrics: ``{"accuracy"}``.

  Args:
    hidden: widths of the hidden layers, default ``(64,)``; ``()`` gives
      multinomial logistic regression.
    num_classes: number of classes, default 10.
    activation: ``"relu"`` (default), ``"gelu"`` or ``"tanh"``.

  Returns:
    A classification :class:`~lowbw.models.Model` named ``"mlp"``.

  Example:
    >>> import jax, numpy as np
    >>> model = mlp(hidden=(32,), num_classes=10)
    >>> batch = {"x": np.zeros((16, 8, 8), np.float32),
    ...          "y": np.zeros((16,), np.int32)}
    >>> params = model.init(jax.random.key(0), batch)
    >>> loss, metrics = model.loss(params, batch, jax.random.key(1))
  """
  hidden = _contract.positive_ints("hidden", hidden)
  _validate.positive_int("num_classes", num_classes)
  _validate.one_of("activation", activation, _ACTIVATIONS)
  module = MLP(hidden=hidden, num_classes=num_classes, activation=activation)
  config = {"name": "mlp", "hidden": list(hidden), "num_classes": num_classes,
            "activation": activation}
  return _contract.wrap_module(module, "classification", "mlp", config,
                               pooled=True)
