"""A build's compiled programs, cached by their arguments' shapes, and the
start-up seconds (building, tracing, compiling) not yet in a run's
summary."""

import functools
import json
import os
import time

import jax

from lowbw import _validate

from lowbw.telemetry._activity import busy
from lowbw.telemetry._startup import import_s
from lowbw.simulation import _exe_store
from lowbw.simulation._loop import Executables


# XLA's quickest settings (no LLVM optimisation or expensive passes, the
# older elemental emitters, one LLVM module): on a CPU a small run's
# programs compile 4-5x faster and run about 2x slower; the digits MLP
# under DiLoCo with a codec chain: 7.8 s -> 1.7 s to compile, 6.5 -> 13.4 ms
# a round (benchmarks/variant_latency.py, docs/performance.md).
FAST_OPTIONS = {"xla_backend_optimization_level": 0,
                "xla_llvm_disable_expensive_passes": True,
                "xla_cpu_use_fusion_emitters": False,
                "xla_cpu_parallel_codegen_split_count": 1}
# "auto" compiles quickly below this much work (all workers' FLOPs over one
# run's steps): about where 2x slower steps cost what the quicker compile
# saves (the MLP's break-even is near 6e10, the default GPT's 4e11).
FAST_WORK_FLOPS = 1e11
EFFORTS = ("auto", "fast", "full")


def check_effort(effort) -> str:
  """``compile_effort``: one of ``EFFORTS``; ``auto`` may be set for a
  process by ``LOWBW_COMPILE_EFFORT`` (``--compile-effort``)."""
  if effort not in EFFORTS:
    raise _validate.fail("compile_effort", effort,
                         f"expected one of {', '.join(EFFORTS)}")
  if effort == "auto":
    effort = os.environ.get("LOWBW_COMPILE_EFFORT", "auto")
    if effort not in EFFORTS:
      raise _validate.fail("LOWBW_COMPILE_EFFORT", effort,
                           f"expected one of {', '.join(EFFORTS)}")
  return effort


def compiler_options(effort: str, work_flops: float) -> dict | None:
  """XLA's options for a build: ``FAST_OPTIONS`` for ``fast``, and for
  ``auto`` on a CPU when the work is under ``FAST_WORK_FLOPS``; else None
  (XLA's defaults, or what ``XLA_FLAGS`` says)."""
  effort = check_effort(effort)
  if effort == "fast" or (effort == "auto" and jax.default_backend() == "cpu"
                          and work_flops < FAST_WORK_FLOPS):
    return dict(FAST_OPTIONS)
  return None


class Compiled:
  """The programs of a build, jitted once and compiled per argument
  signature; a second run with other values reuses them.

  Attributes:
    programs: the engine's functions (``_engine.Programs``).
    jitted: them jitted for a single run.
    recipe: the build's configuration as plain values, which keys its
      executables on disk (``_exe_store``); None: none kept there.
  """

  def __init__(self, programs, eval_batches, build_s: float,
               options: dict | None = None, recipe: str | None = None):
    self.programs = programs
    # The executables on disk are keyed by XLA's options too.
    self.recipe = None if recipe is None else json.dumps(
        [recipe, options], sort_keys=True)
    self.eval_batches = eval_batches
    # XLA's options for every program of the build (``compiler_options``).
    self.options = options
    jit = functools.partial(jax.jit, compiler_options=options)
    self.jitted = Executables(
        jit(programs.chunk, donate_argnums=0),
        None if programs.tail is None
        else jit(programs.tail, donate_argnums=0),
        jit(programs.evaluate), jit(programs.global_params))
    self._cache: dict = {}
    self._point_programs: dict = {}
    self._unreported_compile_s = 0.0
    # Start-up seconds not yet in a run's summary (``take_startup``).
    self._unreported_startup = _no_startup(build_s)

  def compile(self, lower, what: str = "the run's programs",
              stored=None) -> tuple[tuple, float]:
    """``(compiled programs, seconds)`` of the programs ``lower()``
    returns (None stays None), their tracing and compiling (or loading)
    counted in the next run's ``compile_s`` and start-up breakdown;
    ``what`` names them for the command line's heartbeat. ``stored``:
    ``(name, arguments)`` of programs the build's executables on disk may
    hold (``_exe_store``): found there, nothing is traced."""
    start = time.perf_counter()
    entry = None
    if stored is not None and self.recipe is not None:
      entry = _exe_store.key(self.recipe, *stored)
      with busy(f"loading {what}"):
        found = _exe_store.load(entry)
      if found is not None:
        seconds = time.perf_counter() - start
        self._unreported_compile_s += seconds
        return found, seconds
      hits = _exe_store.cache_hits()
    with busy(f"tracing {what}"):
      lowered = lower()
    traced = time.perf_counter()
    with busy(f"compiling {what}"):
      compiled = tuple(None if program is None else
                       program.compile(compiler_options=self.options)
                       for program in lowered)
    if entry is not None and _exe_store.cache_hits() == hits:
      _exe_store.save(entry, compiled)   # compiled here, not loaded
    seconds = time.perf_counter() - start
    self._unreported_compile_s += seconds
    self._unreported_startup["trace_s"] += traced - start
    return compiled, seconds

  def compile_init(self, program, key, values: dict):
    """The initial state's ``program`` compiled for ``key`` and traced
    state ``values``, counted as compiling, not as making the state."""
    (compiled,), seconds = self.compile(lambda: (program.lower(key, values),),
                                       "the initial state",
                                       ("initial state", (key, values)))
    self._unreported_startup["init_compile_s"] += seconds
    return compiled

  def executables(self, state, sampler, net, jitted=None, key="run"):
    """``(compiled programs, state)`` for these arguments' shapes (cached).

    A new compilation also loads the executables with a chunk of zero
    rounds (one-off buffer and thread-pool set-up belongs with compiling,
    not with the run's throughput); it donates and returns ``state``
    unchanged. The evaluation is compiled, not run: a run of it is a real
    evaluation (1.1 s of the default GPT's start on a CPU), whose one-off
    set-up (0.1 s) the first evaluation pays.
    """
    stored = (None if jitted is not None else
              (f"run programs {key}", (state, sampler, net,
                                       self.eval_batches)))
    jitted = jitted or self.jitted
    sig = (key, _signature((state, sampler, net)))
    if sig not in self._cache:
      compiled, _ = self.compile(lambda: (
          jitted.chunk.lower(state, sampler, 1, net),
          None if jitted.tail is None
          else jitted.tail.lower(state, sampler, net),
          jitted.evaluate.lower(state, self.eval_batches),
          jitted.global_params.lower(state)),
          "the workers' training chunk and the evaluation", stored)
      exe = Executables(*compiled)
      start = time.perf_counter()
      with busy("loading the compiled programs"):
        state, _ = exe.chunk(state, sampler, 0, net)
        jax.block_until_ready(state)
      self._cache[sig] = exe
      self._unreported_compile_s += time.perf_counter() - start
    return self._cache[sig], state

  def jit_points(self, sampler_axes, net_axes) -> Executables:
    """The programs vmapped over a leading axis of sweep points (state
    always; data and network leaves where ``*_axes`` say 0)."""
    p = self.programs
    jit = functools.partial(jax.jit, compiler_options=self.options)
    key = (str(sampler_axes), str(net_axes))
    if key not in self._point_programs:
      tail = None if p.tail is None else jit(jax.vmap(
          p.tail, in_axes=(0, sampler_axes, net_axes)), donate_argnums=0)
      self._point_programs[key] = Executables(
          jit(jax.vmap(p.chunk, in_axes=(0, sampler_axes, None, net_axes)),
              donate_argnums=0),
          tail,
          jit(jax.vmap(p.evaluate, in_axes=(0, None))),
          jit(jax.vmap(p.global_params)))
    return self._point_programs[key]

  @property
  def compilations(self) -> int:
    """How many argument signatures have been compiled (for tests)."""
    return len(self._cache)

  def take_compile_s(self) -> float:
    """Seconds compiled since the last run reported it (the build's
    compilation is reported by the first run)."""
    seconds, self._unreported_compile_s = self._unreported_compile_s, 0.0
    return seconds

  def take_startup(self, compile_s: float, initial_s: float) -> dict:
    """Where a run's start-up went, in seconds: building the simulator
    (validation, data, memory plan; reported by its first run, 0 after),
    the initial state, tracing the programs and compiling or loading them
    (``compile_s`` less the tracing; 0 when they were compiled before), and
    the process's age when ``import lowbw`` finished (None off Linux)."""
    spent, self._unreported_startup = self._unreported_startup, _no_startup()
    return {"import_s": import_s(), "build_s": spent["build_s"],
            "initial_state_s": max(initial_s - spent["init_compile_s"], 0.0),
            "trace_s": spent["trace_s"],
            "compile_load_s": max(compile_s - spent["trace_s"], 0.0)}


def _no_startup(build_s: float = 0.0) -> dict:
  """Start-up seconds not yet reported: building, tracing, and compiling
  the initial state (inside ``initial_s``, reported as compiling)."""
  return {"build_s": build_s, "trace_s": 0.0, "init_compile_s": 0.0}


def _signature(tree):
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves)
