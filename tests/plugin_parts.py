"""A user's own parts, registered the way docs/plugins.md shows: a codec, a
model and a strategy with a parameter of its own. tests/test_plugins.py
imports it through LOWBW_PLUGINS in a fresh process."""

import jax.numpy as jnp
from lowbw import models, strategies, transforms

def encode(x, key, worker):
  step = jnp.max(jnp.abs(x)) / 127 + 1e-12
  return {"codes": jnp.round(x / step).astype(jnp.int8), "step": step.astype(jnp.float32)}

def decode(payload, key):
  return payload.data["codes"].astype(jnp.float32) * payload.data["step"]

transforms.register_codec("absmax8", transforms.make_codec("absmax8", encode, decode))
models.register("tiny_mlp", lambda: models.mlp(hidden=(4,), num_classes=10))

def my_avg(inner=None, H: int = 4, shrink: float = 1.0,
           codec: transforms.Codec | str | None = None):
  """Averaging with a shrunk outer step."""
  return strategies.diloco(inner=inner, H=H, codec=codec,
                           outer=strategies.outer_optimizer(shrink, 0.0))

strategies.register(strategies.make_spec(my_avg, inner=strategies.spec("diloco").inner, outer=None, paper="a test", help={"shrink": "the outer step's rate", "codec": "codec of the pseudo-gradients"}))
