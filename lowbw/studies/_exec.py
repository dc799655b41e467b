"""Where a study's points run: in the study's own process (the default), in
N local worker processes (``local:N``), as Ray tasks (``ray``) or as Slurm
jobs through submitit (``slurm``).

Whatever runs them, a unit of work is some points of one compiled shape:
the worker builds their program once and runs them as the study in one
process does (``_run._train``: vmapped batches where they apply), claiming
each batch's points first (``_claims``) and writing each finished point to
the study folder. The study's own process waits for the units, then runs
itself whatever is left unclaimed, then makes the tables.
"""

import math
import os
import pickle
import subprocess

from lowbw import _validate, _cores

ALLOWED = ("None (the study's own process), 'local' (one worker process "
           "per GPU, or per core on a CPU), 'local:N', 'ray' (one task per "
           "GPU or CPU of the Ray instance), 'ray:N', 'slurm' (one job per "
           "compiled shape) or 'slurm:N' (N >= 1: each compiled shape's "
           "points in N parts)")


def parse(executor) -> tuple[str, int | None] | None:
  """``executor`` as (kind, parts of each compiled shape's points; None:
  decided when it runs), or None for the study's own process.

  Raises:
    ConfigError: naming ``executor`` and the values allowed.
  """
  if executor is None:
    return None
  if not isinstance(executor, str):
    raise _validate.fail("executor", executor, f"expected {ALLOWED}")
  kind, sep, count = executor.strip().partition(":")
  if kind not in ("local", "ray", "slurm"):
    raise _validate.fail("executor", executor, f"expected {ALLOWED}")
  if not sep:
    return kind, len(gpus()) or _cores.cores() if kind == "local" else None
  if count.strip().isdigit() and int(count) >= 1:
    return kind, int(count)
  raise _validate.fail("executor", executor, f"expected {ALLOWED}")


def check(executor, out, options) -> tuple | None:
  """The parsed executor, checked with what it needs: a study folder (the
  workers write each point there), its package, and options only where
  they are read (``slurm``: submitit's parameters)."""
  chosen = parse(executor)
  if options is not None and (chosen is None or chosen[0] != "slurm"):
    raise _validate.fail("executor_options", options, "only read by "
                         "the slurm executor (submitit's parameters)")
  if options is not None and not isinstance(options, dict):
    raise _validate.fail("executor_options", options, "expected a dict of "
                         "submitit parameters, e.g. {'slurm_partition': "
                         "'gpu', 'timeout_min': 60}")
  if chosen is None:
    return None
  if out is None:
    raise _validate.fail("executor", executor, "needs out= (the study's "
                         "folder, where each worker writes its points)")
  package = {"ray": "ray", "slurm": "submitit"}.get(chosen[0])
  if package:
    try:
      __import__(package)
    except ImportError:
      raise _validate.fail("executor", executor, f"needs {package}: pip "
                           f"install 'lowbw[{chosen[0]}]'") from None
  return chosen


def gpus() -> list[str]:
  """The GPUs a worker may be given: ``CUDA_VISIBLE_DEVICES`` when set,
  else those ``nvidia-smi`` lists (none without it). JAX is not asked: it
  would take the GPUs for this process."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    return [g for g in visible.split(",") if g.strip() and g != "-1"]
  try:
    text = subprocess.run(["nvidia-smi", "--query-gpu=index",
                           "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=20, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return []
  return [line.strip() for line in text.splitlines() if line.strip()]


def units(groups: list[list], workers: int,
          points_per_batch: int | None) -> list[list]:
  """Each group's points in ``workers`` parts (a part a whole number of
  vmapped batches when ``points_per_batch`` is given), groups in turn."""
  parts = []
  for group in filter(None, groups):
    size = math.ceil(len(group) / workers)
    if points_per_batch:
      size = math.ceil(size / points_per_batch) * points_per_batch
    parts += [group[i:i + size] for i in range(0, len(group), size)]
  return parts


def run(chosen: tuple, work, study: tuple, groups: list[list],
        points_per_batch: int | None, options: dict | None) -> int:
  """Runs ``groups`` (lists of points of one compiled shape) with executor
  ``chosen``, each in parts (``units``), a part being ``work((*study,
  indices, points_per_batch))`` in a worker (``work``: a module's
  function, which pickles by name); returns the builds the workers made.
  ``study``: (base, grid, seeds, out)."""
  kind, width = chosen
  if kind == "ray":
    width = width or _ray_width()
  parts = units(groups, width or 1, points_per_batch)
  if not parts:
    return 0
  jobs = [(*study, [p.index for p in part], points_per_batch)
          for part in parts]
  try:
    pickle.dumps(jobs[0])
  except Exception as e:  # noqa: BLE001 (any object may refuse)
    raise _validate.fail("executor", chosen[0], "needs settings that can "
                         f"be pickled to reach its workers ({e}); give "
                         "Python objects (a model, data, strategy) by "
                         "their names") from None
  if kind == "local":
    return _local(work, jobs, width)
  if kind == "ray":
    return _ray(work, jobs)
  return _slurm(work, jobs, study[3], options or {})


def _local(work, jobs: list, workers: int) -> int:
  """``workers`` new Python processes (``_command``), worker i given jobs
  i, i + N, ... (part i of each group: ``units``) and its GPU or its share
  of the cores (``_slots``). A worker that fails stops the others and
  raises."""
  import threading
  slots = _slots(min(workers, len(jobs)))
  procs, builds, errors = [], [], []

  def one(i, env, cores):
    proc = subprocess.Popen(_command(cores), env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    procs.append(proc)
    out, _ = proc.communicate(pickle.dumps((work, jobs[i::len(slots)])))
    if proc.returncode:
      errors.append(proc.returncode)
    else:
      builds.append(int(out.decode().split()[-1]))

  threads = [threading.Thread(target=one, args=(i, *slot), daemon=True)
             for i, slot in enumerate(slots)]
  try:
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  finally:
    for proc in procs:  # on an error or an interrupt: stop the others
      if proc.poll() is None:
        proc.kill()
  if errors:
    raise RuntimeError(f"a local study worker exited with status "
                       f"{errors[0]} (its messages are above); the points "
                       "it finished are kept: run the study again to "
                       "resume it")
  return sum(builds)


def _command(cores: list | None) -> list[str]:
  """A worker's command line: Python pinned to ``cores`` before lowbw is
  imported, then ``_main`` (no script of the user's is imported again)."""
  import sys
  pin = f"import os; os.sched_setaffinity(0, {cores!r}); " if cores else ""
  return [sys.executable, "-c", pin + "from lowbw.studies import _exec; "
          "_exec._main()"]


def _slots(workers: int) -> list[tuple[dict, list | None]]:
  """(environment, cores) of each local worker: its GPU (in turn; workers
  sharing one GPU split its memory), or on a CPU its own share of the
  cores. Each keeps this process's count of CPU devices, so that its
  programs (and their numbers, and the compilation cache's entries) are
  this process's."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
      _home(), os.environ.get("PYTHONPATH")]))}
  ids = gpus()
  if ids:
    if _PREALLOCATE in _SET_HERE:  # this process's setting, not the user's
      env.pop(_PREALLOCATE, None)
    per_gpu = math.ceil(workers / len(ids))
    if per_gpu > 1 and _FRACTION not in env:
      env[_FRACTION] = f"{0.9 / per_gpu:.3f}"
    return [({**env, "CUDA_VISIBLE_DEVICES": ids[i % len(ids)]}, None)
            for i in range(workers)]
  import jax
  if _cores.ENV not in env and jax.config.jax_num_cpu_devices >= 1:
    env[_cores.ENV] = str(jax.config.jax_num_cpu_devices)
  try:
    cores = sorted(os.sched_getaffinity(0))
  except AttributeError:  # not Linux: the cores stay shared
    return [(env, None)] * workers
  share = max(1, len(cores) // workers)
  return [(env, [cores[(i * share + k) % len(cores)] for k in range(share)])
          for i in range(workers)]


def _home() -> str:
  """The folder this process imports lowbw from: workers import the same
  lowbw."""
  here = os.path.abspath(__file__)  # <home>/lowbw/studies/_exec.py
  return os.path.dirname(os.path.dirname(os.path.dirname(here)))


_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
_SET_HERE: set[str] = set()


def spare_gpus(chosen: tuple | None) -> None:
  """Before a ``local`` study on GPUs starts JAX here: this process takes
  GPU memory as it needs it, not most of it at once (JAX's default), which
  would leave its workers little."""
  from jax._src import xla_bridge
  if (chosen is None or chosen[0] != "local" or _PREALLOCATE in os.environ
      or xla_bridge.backends_are_initialized() or not gpus()):
    return
  os.environ[_PREALLOCATE] = "false"
  _SET_HERE.add(_PREALLOCATE)


def _ray_width() -> int:
  """The Ray instance's GPUs, else its CPUs (started here when none
  runs)."""
  import ray
  if not ray.is_initialized():  # its workers import this process's lowbw
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
        filter(None, [_home(), os.environ.get("PYTHONPATH")]))}})
  resources = ray.cluster_resources()
  return max(1, int(resources.get("GPU", 0) or resources.get("CPU", 1)))


def _ray(work, jobs: list) -> int:
  """One Ray task per job, on the running Ray instance (``ray.init()``
  before the study, or ``RAY_ADDRESS``), else a local one started here; a
  task takes one GPU when the instance has any."""
  import ray
  _ray_width()  # a local instance started here when none runs
  gpu = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
  task = ray.remote(num_cpus=1, num_gpus=gpu, max_retries=0)(work)
  return sum(ray.get([task.remote(j) for j in jobs]))


def slurm_executor(out: str, options: dict):
  """submitit's executor for a study in ``out``: its logs and pickles in
  ``out/slurm``; ``options`` are submitit's parameters (``cluster`` picks
  submitit's ``local`` or ``debug`` cluster in place of Slurm)."""
  import submitit
  options = dict(options)
  executor = submitit.AutoExecutor(folder=os.path.join(out, "slurm"),
                                   cluster=options.pop("cluster", "slurm"))
  executor.update_parameters(**{"name": "lowbw-study", **options})
  return executor


def _slurm(work, jobs: list, out: str, options: dict) -> int:
  """One Slurm array task per job; waits for them all."""
  executor = slurm_executor(out, options)
  submitted = executor.map_array(work, jobs)
  return sum(job.result() for job in submitted)


def _main() -> None:
  """A ``local`` worker: its function and jobs (pickled) from stdin, the
  builds it made to stdout."""
  import sys
  work, jobs = pickle.loads(sys.stdin.buffer.read())
  print(sum(work(job) for job in jobs), flush=True)
