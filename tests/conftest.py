"""Test-wide JAX settings: strict rank promotion, as DESIGN.md asks, and a
compilation cache for the session.

Many tests build the same programs (the same model, strategy and shapes in a
fresh ``lowbw.simulate`` call); the persistent cache lets them share one
compilation. It lives in a fresh temporary folder, so every session starts
cold and nothing leaks between runs.
"""

import atexit
import shutil
import tempfile

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

_CACHE = tempfile.mkdtemp(prefix="lowbw-test-jax-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
