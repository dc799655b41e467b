"""Test-wide JAX settings: strict rank promotion, as DESIGN.md asks, and a
compilation cache for the session, and a backend that compiles fast.

Many tests build the same programs (the same model, strategy and shapes in a
fresh ``lowbw.simulate`` call); the persistent cache lets them share one
compilation. It lives in a fresh temporary folder, so every session starts
cold and nothing leaks between runs.
"""

import atexit
import gc
import os
import shutil
import tempfile

# The suite is compile-bound (small models, few steps): the least-optimizing
# CPU backend compiles about 1.3x faster and runs such programs as fast, and
# XLA:CPU's older elemental emitters (no fusion emitters) compile a small
# run's programs in about half the time (2.4 -> 1.2 s for a DiLoCo MLP with
# faults). Tests compare runs compiled alike, or a compiled run with a
# reference to float tolerance. Subprocesses inherit it unless they set
# their own flags. One LLVM module per program (no parallel codegen split):
# both cores already run a test process each, and even with one core free
# four small runs compiled in 3.65 s against 4.05 s (three interleaved
# repeats each, 2-core machine, 2026-11-29).
# The same settings as lowbw.simulation._startup.FAST_OPTIONS (a test keeps
# them equal; JAX must see them before it starts, so they are restated).
FAST_COMPILE = ("--xla_backend_optimization_level=0 "
                "--xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false "
                "--xla_cpu_parallel_codegen_split_count=1")
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
# Compiled executables on disk (``_exe_store``) are keyed by lowbw's source
# files, which a test's monkeypatch does not change: off but in its tests.
os.environ.setdefault("LOWBW_EXECUTABLE_STORE", "0")


# --dist loadfile hands each test process whole modules, by default those
# with the most tests first; a module of a few slow tests (a subprocess, a
# GPT) handed out last keeps one process busy while the other idles. The
# slowest modules go first instead (longest first), so the last ones to be
# handed out are short. Seconds of the modules over 8 s as they ran inside
# the whole suite (-n 2, --durations=0, summed per module; a loaded 2-core
# machine, scaled by 1/2.6 to the suite's unloaded wall time). The earlier
# table (modules timed alone with -n 0) had drifted: test_clock_runs, listed
# at 85 s, took 20 s in the suite, and test_lanes, the slowest module, was
# unlisted and so handed out among the last. A stale entry only changes
# the order, never a result.
SLOW_MODULES = {
    "test_lanes.py": 70, "test_golden.py": 65, "test_golden_2.py": 55,
    "test_retime.py": 50, "test_study.py": 50, "test_decoupled_diloco.py": 35,
    "test_limit_identities.py": 30, "test_worker_dtypes.py": 30,
    "test_shadow.py": 30, "test_nothing_silent.py": 30, "test_docs.py": 70,
    "test_scale.py": 25, "test_async_diloco.py": 25,
    "test_network_profile.py": 20, "test_simulate.py": 20,
    "test_clock_runs.py": 20, "test_compressed_strategies.py": 20,
    "test_robust.py": 20, "test_hierarchical_diloco.py": 20,
    "test_codec.py": 20, "test_stages.py": 20, "test_streaming_diloco.py": 15,
    "test_kill_anywhere.py": 15, "test_examples.py": 15,
    "test_sparseloco.py": 15, "test_engine_pieces.py": 15, "test_cores.py": 15,
    "test_spes.py": 15, "test_saved_runs.py": 15, "test_sweep.py": 15,
    "test_cli.py": 15, "test_determinism.py": 15, "test_gpt_blocks.py": 15,
    "test_clear_failures.py": 10, "test_disk_faults.py": 10,
    "test_fault_bytes.py": 10, "test_models.py": 10, "test_codecs_2025.py": 10,
    "test_strategies.py": 10, "test_trainer_options.py": 10,
    "test_moe_gpt.py": 10, "test_bench.py": 10, "test_config_values.py": 10,
    "test_compressed_runs.py": 10, "test_fleet_traces.py": 10,
    "test_gasloc.py": 10, "test_fedadam.py": 10, "test_advise.py": 10,
    "test_compile_cache.py": 10, "test_network_model.py": 10,
    "test_outer_schedule.py": 10,
    # Added in this session's merges, estimated from their own timings.
    "test_executors.py": 50, "test_first_hour.py": 20, "test_pipeline.py": 15,
    "test_bench_lanes.py": 10, "test_folder_lock.py": 10,
    "test_foreign_models.py": 5, "test_non_finite_end.py": 5,
    "test_clients.py": 25,  # 70 s alone at load 10, scaled by 1/2.6
    # -n 0 at load 8-10 (2026-11-29), scaled by 1/2.6.
    "test_stage_links.py": 12, "test_moe_stages.py": 10,
    "test_backward_cast.py": 5,
    # The suite's own --durations (2026-11-29, quiet; summed per module).
    "test_traced_period.py": 25, "test_non_finite_worker.py": 10,
    "test_study_bytes.py": 8,
    "test_traced_bits.py": 20,  # 31 s alone, -n 0, at load 2-3 (2026-11-29)
}


def pytest_configure(config):
  if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's option
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  # A stable sort: each module's tests stay together and in their order.
  items.sort(key=lambda item: -SLOW_MODULES.get(item.path.name, 0))


# Python's cyclic garbage collector. Tracing makes many short-lived objects,
# so it runs often, and each full collection walks every tracked object:
# late in a test process, with JAX, lowbw, every test module and the
# collected items in memory, that is most of a collection's cost. Objects
# alive once collection is over (imports, module constants, the items)
# live as long as the process, so they are frozen: collections skip them
# (``gc.freeze``; a freed object is still freed by its reference count).
# A young generation of 10,000 objects (700 by default) runs the collector
# a tenth as often. test_strategies.py and test_clock_runs.py in one
# process (-n 0): 11-22 s collecting before, 1.6 s after; the docs' blocks
# (test_docs.py's runner): 14.5 s before, 2.1 s after (a shared, loaded
# 2-core machine, 2026-11-29, where wall times varied more than that).
GC_THRESHOLD = (10_000, 50, 50)


def pytest_collection_finish(session):
  gc.collect()
  gc.freeze()
  gc.set_threshold(*GC_THRESHOLD)
