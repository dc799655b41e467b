"""Test-wide JAX settings: strict rank promotion, as DESIGN.md asks."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
