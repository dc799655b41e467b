"""A small convolutional classifier for images such as digits and MNIST."""

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

from lowbw import _validate
from lowbw._types import Array
from lowbw.models import _contract


class CNN(nn.Module):
  """[3x3 SAME conv -> relu -> 2x2 avg-pool] per channel count, then 2 Dense."""
  channels: tuple[int, ...]
  dense: int
  num_classes: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    if x.ndim == 3:
      x = jnp.expand_dims(x, -1)  # grayscale (b, H, W) -> (b, H, W, 1)
    if x.ndim != 4:
      raise _validate.fail("batch['x'].shape", x.shape,
                           "cnn expects images (b, H, W) or (b, H, W, C)")
    h_BxHxWxC = _contract.floating(x)  # bf16 under autocast
    for c in self.channels:
      h_BxHxWxC = nn.relu(nn.Conv(c, (3, 3), padding="SAME")(h_BxHxWxC))
      # SAME pooling without counting the padding keeps odd sizes (28 -> 14
      # -> 7 -> 4) and tiny images (8x8 through three stages) valid and
      # unbiased at the border.
      h_BxHxWxC = nn.avg_pool(h_BxHxWxC, (2, 2), strides=(2, 2),
                              padding="SAME", count_include_pad=False)
    h_BxD = jnp.reshape(h_BxHxWxC, (h_BxHxWxC.shape[0], -1))
    h_BxD = nn.relu(nn.Dense(self.dense)(h_BxD))
    return nn.Dense(self.num_classes, name="head")(h_BxD)


def cnn(
    channels: Sequence[int] = (16, 32),
    dense: int = 64,
    num_classes: int = 10,
) -> _contract.Model:
  """A small convolutional image classifier.

  For each ``c`` in ``channels``: a 3x3 SAME convolution with ``c`` output
  channels, relu, and a 2x2 average pool (stride 2); then flatten,
  ``Dense(dense) -> relu -> Dense(num_classes)``. Images are ``batch["x"]``
  shaped (b, H, W, C), or (b, H, W) for grayscale; any H, W work (8x8 sklearn
  digits, 28x28 MNIST). ``model.apply(params, x)`` gives the (b,
  num_classes) logits. Loss: mean softmax cross-entropy against
  ``batch["y"]``; metrics: ``{"accuracy"}``.

  Args:
    channels: output channels of the conv stages, default ``(16, 32)``.
    dense: width of the hidden Dense layer, default 64.
    num_classes: number of classes, default 10.

  Returns:
    A classification :class:`~lowbw.models.Model` named ``"cnn"``.

  Example:
    >>> import jax, numpy as np
    >>> model = cnn()
    >>> batch = {"x": np.zeros((16, 28, 28, 1), np.float32),
    ...          "y": np.zeros((16,), np.int32)}
    >>> params = model.init(jax.random.key(0), batch)
    >>> loss, metrics = model.loss(params, batch, jax.random.key(1))
  """
  channels = _contract.positive_ints("channels", channels)
  _validate.positive_int("dense", dense)
  _validate.positive_int("num_classes", num_classes)
  module = CNN(channels=channels, dense=dense, num_classes=num_classes)
  config = {"name": "cnn", "channels": list(channels), "dense": dense,
            "num_classes": num_classes}
  return _contract.wrap_module(module, "classification", "cnn", config,
                               pooled=True)
