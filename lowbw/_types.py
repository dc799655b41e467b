"""Type aliases shared by every lowbw module.

Names ending in ``_W`` carry the worker axis (size W) as axis 0 of every leaf.
"""

from typing import Any

import jax

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
PRNGKey = jax.Array
PyTree = Any
Params = Any
Batch = Any
