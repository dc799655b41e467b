"""Test-wide JAX settings: strict rank promotion, as DESIGN.md asks, and a
compilation cache for the session, and a backend that compiles fast.

Many tests build the same programs (the same model, strategy and shapes in a
fresh ``lowbw.simulate`` call); the persistent cache lets them share one
compilation. It lives in a fresh temporary folder, so every session starts
cold and nothing leaks between runs.
"""

import atexit
import os
import shutil
import tempfile

# The suite is compile-bound (small models, few steps): the least-optimizing
# CPU backend compiles about 1.3x faster and runs such programs as fast, and
# XLA:CPU's older elemental emitters (no fusion emitters) compile a small
# run's programs in about half the time (2.4 -> 1.2 s for a DiLoCo MLP with
# faults). Tests compare runs compiled alike, or a compiled run with a
# reference to float tolerance. Subprocesses inherit it unless they set
# their own flags.
FAST_COMPILE = ("--xla_backend_optimization_level=0 "
                "--xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false")
# Once: pytest-xdist's workers inherit this process's XLA_FLAGS.
if FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(filter(None, [
      os.environ.get("XLA_FLAGS"), FAST_COMPILE]))
# For tests that give a subprocess flags of their own (several CPU devices).
os.environ["LOWBW_TEST_FAST_COMPILE"] = FAST_COMPILE

# lowbw gives JAX one CPU device per core when it is imported (``_cores``);
# the suite keeps one device, as its references do, and tests the default
# spread in subprocesses (test_cores.py).
os.environ.setdefault("LOWBW_CPU_DEVICES", "1")

import jax  # noqa: E402  (after XLA_FLAGS)

jax.config.update("jax_numpy_rank_promotion", "raise")

# One cache for the session's processes: the test workers (pytest-xdist
# spawns them with this environment) share what either compiled.
_CACHE = os.environ.get("LOWBW_TEST_JAX_CACHE")
if not _CACHE:
  _CACHE = tempfile.mkdtemp(prefix="lowbw-test-jax-cache-")
  os.environ["LOWBW_TEST_JAX_CACHE"] = _CACHE
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
# Subprocesses (the command line, multi-device and multi-process cases) use
# it too, rather than the user's ~/.cache/lowbw/xla.
os.environ.setdefault("LOWBW_COMPILE_CACHE", _CACHE)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
