"""Kill anywhere: SIGKILL ``lowbw train --checkpoint-every`` and ``lowbw
sweep`` at random points, resume them, and check what a resumed run
promises.

Each chain starts a run (or a study), kills it, resumes it (``--resume``; a
study: the same ``lowbw sweep`` again), kills the resumed process, and so on
1 to ``--chain-kills`` times, then lets it finish. A kill is one of:

* ``row`` / ``replace`` / ``checkpoint`` / ``checkpoint_saved`` / ``table``:
  the process kills itself at the N-th time it reaches that point of its
  writes (``LOWBW_KILL_AT``, N drawn from the counts of an uninterrupted
  run, scaled for a resumed one by what it has left to do): a row in
  metrics.csv but not yet in TensorBoard, a JSON, parameter or table file
  written but not yet renamed over the old one, a checkpoint about to be
  saved or just saved, a study table about to be written;
* ``checkpoint+delay``: 0-300 ms after a save begins, from a timer thread,
  so inside orbax's write and commit of the checkpoint;
* ``random time``: the campaign kills the process after a random delay up
  to the uninterrupted process's wall time (start-up, steps, evaluation,
  writes, anywhere).

After every kill: every checkpoint that is visible (a step folder) is
readable, the rows in metrics.csv are the uninterrupted run's first
rows, and a study table that is there is whole. After the chain: metrics.csv and the TensorBoard scalars (read as
TensorBoard reads them: a resumed run's purge drops earlier events) equal
the uninterrupted run's, no row lost or twice, and the final parameters are
the same bits; a study's final.csv, points.csv, each point's record and
``lowbw.studies.load(OUT).final()`` equal an uninterrupted study's (wall
and compile seconds aside).

    python benchmarks/kill_campaign.py --kills 200 --json kill.json

Before the kills, ``--cases N`` runs each case of ``Cases`` N times (two
writers at once, a resume of a running run, a full disk on a small tmpfs,
a file-size limit) and counts cases run, silent losses (a finished folder
that differs from the uninterrupted run's), tracebacks, duplicated rows
and unexpected ends (0, 0, 0, 0 is the target):

    python benchmarks/kill_campaign.py --kills 0 --configs ddp,sweep --cases 3

One chain runs at a time, every process sharing one compilation cache
(``--compile-cache``), and each configuration's uninterrupted run is made
once. Counts per outcome, per configuration and per kind of kill are
printed and written to ``--json`` after every chain. Any outcome other
than a kill, a finished process or a passed check is a failure: a process
that ends by itself other than with exit 0 (an abort, a traceback) is
reported with the end of its stderr.
"""

import argparse
import collections
import csv
import glob
import json
import math
import os
import platform
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

TINY = ["--data", "digits", "--hidden", "8", "--workers", "2",
        "--batch-size", "4", "--eval-examples", "32", "--no-progress"]
CONFIGS = {
    "diloco": ["train", *TINY, "--strategy", "diloco", "--H", "5",
               "--steps", "30", "--eval-every", "10", "--checkpoint-every",
               "5", "--log-every", "1", "--no-plot"],
    "async_diloco": ["train", *TINY, "--strategy", "async_diloco", "--H",
                     "5", "--steps", "30", "--eval-every", "10",
                     "--checkpoint-every", "5", "--log-every", "1",
                     "--no-plot"],
    "diloco_quant4_ef": ["train", *TINY, "--strategy", "diloco", "--H", "5",
                         "--codec", "quant:4", "--ef", "0.9", "--steps",
                         "30", "--eval-every", "10", "--checkpoint-every",
                         "10", "--log-every", "2", "--no-plot"],
    # Longer and asynchronous: an earlier campaign saw one such run abort by
    # itself (SIGABRT in XLA:CPU's thread pool) near step 140.
    "async_diloco_long": ["train", *TINY, "--strategy", "async_diloco",
                          "--H", "5", "--steps", "160", "--eval-every", "40",
                          "--checkpoint-every", "20", "--log-every", "5",
                          "--no-plot"],
    "ddp": ["train", *TINY, "--strategy", "ddp", "--steps", "24",
            "--eval-every", "8", "--checkpoint-every", "4", "--log-every",
            "1", "--no-plot"],
    # The grid's fields out of alphabetical order, on purpose.
    "sweep": ["sweep", *TINY, "--strategy", "diloco", "--steps", "20",
              "--eval-every", "10", "--grid", "outer_lr=0.5,0.7", "--grid",
              "H=5,10", "--seeds", "0"],
}
# The cases' own (``Cases``): a run long enough that a second process,
# whose start-up (import, build, loading the compiled programs) takes
# seconds, meets it still writing after its first checkpoint.
CASE_CONFIGS = {
    "ddp_long": ["train", *TINY, "--strategy", "ddp", "--steps", "200000",
                 "--eval-every", "50000", "--checkpoint-every", "50000",
                 "--log-every", "2000", "--no-plot"],
}
ALL = {**CONFIGS, **CASE_CONFIGS}
# What a resumed run may legitimately write otherwise: wall-clock figures.
WALL = ("wall_time_s",)
SUMMARY_WALL = ("compile_s", "wall_time_s", "steps_per_s", "examples_per_s",
                "tokens_per_s", "startup", "log_dir")


# Where a process ran that this campaign did not kill: the end of its stderr.
TAIL = 3000
# Points reached all along a run (so fewer of them remain after a resume),
# unlike ``replace`` and ``table`` (mostly at its start and end).
ALONG = ("row", "checkpoint", "checkpoint_saved")


def run(argv, env_extra=None, kill_after=None):
  """Runs ``lowbw ARGV``; returns (returncode, stderr, wall)."""
  env = {**os.environ, **(env_extra or {})}
  cmd = [sys.executable, "-m", "lowbw", *argv]
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=env, text=True)
  try:
    _, err = proc.communicate(timeout=kill_after)
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
  return proc.returncode, err, time.perf_counter() - start


# Starts lowbw under a file-size limit (argv[1] bytes), SIGXFSZ ignored so
# that a write past it fails with EFBIG; set in the child itself, as a
# preexec_fn would run in a fork of this multithreaded (JAX) process.
LIMITED = """
import os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
os.execv(sys.executable, [sys.executable, "-m", "lowbw", *sys.argv[2:]])
"""


def start(argv, env_extra=None, file_limit=None):
  """Starts ``lowbw ARGV`` (stdout dropped, stderr to a temporary file, so
  that processes run side by side never block on a full pipe), under a
  file-size limit of ``file_limit`` bytes if given; returns the process,
  whose end ``_ended`` reads."""
  env = {**os.environ, **(env_extra or {})}
  err = tempfile.TemporaryFile("w+")
  head = (["-m", "lowbw"] if file_limit is None else
          ["-c", LIMITED, str(file_limit)])
  proc = subprocess.Popen([sys.executable, *head, *argv],
                          stdout=subprocess.DEVNULL, stderr=err, env=env,
                          text=True)
  proc.err_file = err
  return proc


def _ended(proc):
  """(returncode, stderr) of a process ``start`` started, once it ends."""
  rc = proc.wait()
  proc.err_file.seek(0)
  text = proc.err_file.read()
  proc.err_file.close()
  return rc, text


def csv_rows(path):
  if not os.path.isfile(path):
    return []
  with open(path, newline="") as f:
    return [{k: v for k, v in r.items() if k not in WALL}
            for r in csv.DictReader(f)]


def tensorboard(folder):
  """(step, tag, value) as TensorBoard shows them (see the module doc)."""
  from tensorboardX.proto.event_pb2 import Event
  seen = []
  for path in sorted(glob.glob(os.path.join(folder, "tensorboard",
                                            "events.out.tfevents.*"))):
    raw, i = open(path, "rb").read(), 0
    while i + 12 <= len(raw):
      (n,) = struct.unpack("<Q", raw[i:i + 8])
      if i + 16 + n > len(raw):
        raise ValueError(f"{path}: a record cut short at byte {i}")
      event = Event.FromString(raw[i + 12:i + 12 + n])
      i += 16 + n
      if event.HasField("session_log") and event.session_log.status == 1:
        seen = [s for s in seen if s[0] < event.step]
      seen += [(event.step, v.tag, v.simple_value)
               for v in event.summary.value if v.tag not in WALL]
  return seen


def params(folder):
  import numpy as np
  path = os.path.join(folder, "params.npz")
  with np.load(path) as f:
    return {k: f[k].tobytes() + str(f[k].dtype).encode() for k in f.files}


def checkpoints_readable(folder):
  """The visible checkpoints (step folders) that cannot be read."""
  import orbax.checkpoint as ocp
  from lowbw import telemetry
  directory = os.path.join(folder, telemetry.CHECKPOINTS)
  bad = []
  if not os.path.isdir(directory):
    return bad
  for name in sorted(os.listdir(directory)):
    if not name.isdigit():
      continue  # orbax's temporary folder: invisible to a resume
    try:
      with telemetry.quiet_logs(), ocp.CheckpointManager(
          os.path.abspath(directory)) as m:
        m.restore(int(name), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001  (any failure is the finding)
      bad.append(f"{name}: {str(e).splitlines()[0][:120]}")
  return bad


def _table(path):
  """A study table's rows as written (text), the wall-clock columns
  aside: an interrupted study's tables are byte for byte an uninterrupted
  one's otherwise."""
  return [{k: v for k, v in r.items() if not k.startswith(
      ("wall_time_s", "compile_s"))} for r in csv_rows(path)]


def study_tables(out):
  """What a study folder says: its tables, records and reloaded final."""
  import lowbw
  tables = {}
  for name in ("study.csv", "final.csv", "points.csv"):
    tables[name] = _table(os.path.join(out, name))
  for path in sorted(glob.glob(os.path.join(out, "points", "*",
                                            "point.json"))):
    with open(path) as f:
      record = json.load(f)
    record["summary"] = {k: v for k, v in record["summary"].items()
                         if k not in SUMMARY_WALL}
    key = os.path.relpath(os.path.dirname(path), out)
    tables[key] = record
    tables[key + "/metrics.csv"] = csv_rows(os.path.join(
        os.path.dirname(path), "metrics.csv"))
  final = lowbw.studies.load(out).final(frame=False)
  tables["load().final()"] = {k: [None if isinstance(x, float) and
                                  math.isnan(x) else x for x in v]
                              for k, v in final.items()
                              if not k.startswith(("wall_time_s",
                                                   "compile_s"))}
  return tables


class Campaign:

  def __init__(self, work, seed):
    self.work, self.rng = work, random.Random(seed)
    self.counts = collections.Counter()
    self.failures = []
    self.ref = {}
    self.kills = 0
    self.by_config = collections.Counter()
    self.by_kind = collections.Counter()
    self.commit = _commit()  # at the start: others may commit meanwhile

  def note(self, outcome, detail=None):
    self.counts[outcome] += 1
    if detail is not None:
      self.failures.append({"outcome": outcome, "detail": detail})
      print(f"  FAIL {outcome}: {detail}", flush=True)

  def reference(self, name, tries=3):
    """The uninterrupted run, once per configuration (every chain compares
    with it). One that fails is a failure; it is tried again."""
    folder = os.path.join(self.work, "ref", name)
    counts = os.path.join(self.work, f"{name}.counts")
    for _ in range(tries):
      shutil.rmtree(folder, ignore_errors=True)
      if os.path.exists(counts):
        os.remove(counts)
      rc, err, wall = run(ALL[name] + ["--out", folder],
                          {"LOWBW_KILL_COUNTS": counts})
      if rc == 0:
        break
      self.note(f"process failed (rc {rc})", self.failed(
          name, "reference", folder, {}, rc, err))
    else:
      raise SystemExit(f"the uninterrupted {name} run failed {tries} times")
    with open(counts) as f:
      points = collections.Counter(f.read().split())
    # Random-time kills are drawn up to a process's wall time with its
    # programs in the cache, as every later process finds them.
    _, _, wall = run(ALL[name] + ["--out", folder + "-warm"])
    self.ref[name] = {"folder": folder, "points": points, "wall": wall}
    print(f"reference {name}: {wall:.1f} s, kill points {dict(points)}",
          flush=True)

  def plan(self, name, left):
    """(environment, kill_after seconds, outcome name) of one kill;
    ``left``: the share of the run still to do (a resumed run reaches
    fewer of the points reached all along, so N is drawn among those)."""
    ref = self.ref[name]
    modes = [p for p in ref["points"]] + ["random time"]
    if "checkpoint" in ref["points"]:
      modes.append("checkpoint+delay")
    mode = self.rng.choice(modes)
    if mode == "random time":
      return {}, self.rng.uniform(0.5, ref["wall"]), mode
    point = "checkpoint" if mode == "checkpoint+delay" else mode
    count = ref["points"][point]
    if point in ALONG:
      count = max(1, math.ceil(count * left))
    n = self.rng.randint(1, count)
    if mode == "checkpoint+delay":
      delay = self.rng.uniform(0.0, 0.3)
      return {"LOWBW_KILL_AT": f"checkpoint:{n}:{delay:.3f}"}, None, mode
    return {"LOWBW_KILL_AT": f"{mode}:{n}"}, None, mode

  def left(self, name, folder, sweep):
    """The share of the run or study that a resume still has to do."""
    if sweep:
      done = len(glob.glob(os.path.join(folder, "points", "*", "point.json")))
      total = len(glob.glob(os.path.join(self.ref[name]["folder"], "points",
                                         "*", "point.json")))
      return 1 - done / max(total, 1)
    from lowbw import telemetry
    if not telemetry.has_checkpoint(folder):
      return 1.0
    argv = CONFIGS[name]
    steps = int(argv[argv.index("--steps") + 1])
    step = telemetry.latest_step(os.path.join(folder, telemetry.CHECKPOINTS))
    return 1 - (step or 0) / steps

  def failed(self, name, what, folder, env, rc, err):
    """A failure's record: a process that ended other than by our kill or
    by finishing (an abort, a traceback), with the end of its stderr."""
    how = (f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}")
    return {"config": name, "process": what, "folder": folder, "env": env,
            "ended": how, "stderr_tail": err[-TAIL:]}

  def chain(self, name, index, most):
    """Up to ``most`` kills of one run or study, then its end, compared."""
    folder = os.path.join(self.work, "chains", f"{name}-{index:03d}")
    argv, sweep = CONFIGS[name], name == "sweep"
    started = False
    for _ in range(most):
      env, after, mode = self.plan(name, self.left(name, folder, sweep)
                                   if started else 1.0)
      rc, err = self.step(argv, folder, sweep, started, env, after)
      started = True
      if rc == -signal.SIGKILL:
        self.kills += 1
        self.by_config[name] += 1
        self.by_kind[mode] += 1
        self.note(f"{'sweep' if sweep else 'train'} killed: {mode}")
        self.after_kill(name, folder, sweep)
      elif rc == 0:
        self.note("finished before its kill point")
        break
      else:
        self.note(f"process failed (rc {rc})", self.failed(
            name, "killed chain", folder, env, rc, err))
        return
    else:
      rc, err = self.step(argv, folder, sweep, started, {}, None)
      if rc != 0:
        self.note(f"resume failed (rc {rc})", self.failed(
            name, "last resume", folder, {}, rc, err))
        return
    self.compare(name, folder, sweep)

  def step(self, argv, folder, sweep, started, env, after):
    """Starts the run, or resumes it: a study is run again with the same
    folder; a run resumes from its checkpoint, or starts over when it was
    killed before its first."""
    from lowbw import telemetry
    if sweep or not started:
      cmd = argv + ["--out", folder]
    elif telemetry.has_checkpoint(folder):
      cmd = ["train", "--resume", folder, "--no-progress", "--no-plot"]
    else:
      self.note("restarted: killed before its first checkpoint")
      cmd = argv + ["--out", folder, "--overwrite"]
    rc, err, _ = run(cmd, env, after)
    return rc, err

  def after_kill(self, name, folder, sweep):
    if sweep:
      ref = self.ref[name]["folder"]
      # Tables are written once every point has finished: one that is
      # there is the uninterrupted study's, whole (never cut short).
      for table in ("study.csv", "final.csv", "points.csv"):
        path = os.path.join(folder, table)
        if os.path.exists(path) and _table(path) != _table(
            os.path.join(ref, table)):
          self.note("study table cut short or wrong", f"{folder} {table}")
      for path in glob.glob(os.path.join(folder, "points", "*",
                                         "point.json")):
        point = os.path.dirname(os.path.relpath(path, folder))
        if csv_rows(os.path.join(folder, point, "metrics.csv")) != csv_rows(
            os.path.join(ref, point, "metrics.csv")):
          self.note("finished point's rows differ", f"{folder} {point}")
      return
    bad = checkpoints_readable(folder)
    if bad:
      self.note("visible checkpoint unreadable", f"{folder}: {bad}")
    rows = csv_rows(os.path.join(folder, "metrics.csv"))
    whole = csv_rows(os.path.join(self.ref[name]["folder"], "metrics.csv"))
    if rows != whole[:len(rows)]:
      self.note("killed run's rows are not the first rows", folder)

  def compare(self, name, folder, sweep):
    ref = self.ref[name]["folder"]
    if sweep:
      mine, theirs = study_tables(folder), study_tables(ref)
      differ = sorted(k for k in set(mine) | set(theirs)
                      if mine.get(k) != theirs.get(k))
      if differ:
        self.note("study differs from the uninterrupted one",
                  f"{folder}: {differ[:5]}")
      else:
        self.note("study equal to the uninterrupted one")
      return
    checks = {
        "metrics.csv": (csv_rows(os.path.join(folder, "metrics.csv")),
                        csv_rows(os.path.join(ref, "metrics.csv"))),
        "tensorboard": (tensorboard(folder), tensorboard(ref)),
        "params": (params(folder), params(ref)),
    }
    differ = [k for k, (a, b) in checks.items() if a != b]
    if differ:
      self.note("resumed run differs from the uninterrupted one",
                f"{folder}: {differ}")
    else:
      self.note("resumed run bit-identical to the uninterrupted one")


def _one_line(rc, err):
  """A refusal or a fault said as the command line promises: exit 2, one
  line, no traceback."""
  return rc == 2 and err.count("\n") == 1 and err.startswith("lowbw: error:")


def _traceback(err):
  return "Traceback" in err or "Event loop is closed" in err


def _duplicated_rows(folder, sweep):
  """Rows written twice: metrics.csv's steps, or study.csv's (point,
  step) pairs and points.csv's points."""
  if not sweep:
    keys = [r["step"] for r in csv_rows(os.path.join(folder, "metrics.csv"))]
    return len(keys) - len(set(keys))
  pairs = [(r["point"], r["step"])
           for r in csv_rows(os.path.join(folder, "study.csv"))]
  points = [r["point"] for r in csv_rows(os.path.join(folder, "points.csv"))]
  return len(pairs) - len(set(pairs)) + len(points) - len(set(points))


def _differences(ref, folder, sweep):
  """What the finished folder says otherwise than the uninterrupted
  run's (or study's): a loss unless a process said so."""
  if sweep:
    mine, theirs = study_tables(folder), study_tables(ref)
    return sorted(k for k in set(mine) | set(theirs)
                  if mine.get(k) != theirs.get(k))
  if not os.path.isfile(os.path.join(folder, "params.npz")):
    return ["params.npz missing"]
  checks = {"metrics.csv": (csv_rows(os.path.join(folder, "metrics.csv")),
                            csv_rows(os.path.join(ref, "metrics.csv"))),
            "tensorboard": (tensorboard(folder), tensorboard(ref)),
            "params": (params(folder), params(ref))}
  return [k for k, (a, b) in checks.items() if a != b]


def _folder_bytes(folder):
  return sum(os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(folder) for f in files)


def _largest_file(folder):
  return max(os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(folder) for f in files)


class Cases:
  """Two writers at once and disks that fail, each case checked against
  the uninterrupted run: a process refused or failed says so in one line
  (exit 2, no traceback), and the folder that ends up finished holds the
  uninterrupted run's rows, once each, and its parameters.

  * ``two_trains``: two ``lowbw train`` with one new ``--out``, together;
  * ``resume_while_running``: ``lowbw train --resume`` of a run that is
    writing (started once the run has its first checkpoint);
  * ``two_sweeps``: two ``lowbw sweep`` with one new ``--out``, together
    (they share the study's points; both finish);
  * ``disk_full``: a run on a tmpfs of a random size below what the run
    writes; the tmpfs is then enlarged ("free space") and the run resumed
    as its error says (``--resume``, or ``--overwrite`` when it had no
    checkpoint yet);
  * ``file_size_limit``: a run under a random ``ulimit -f`` below its
    largest file (SIGXFSZ ignored, so writes fail with EFBIG), then
    resumed without the limit.
  """

  def __init__(self, campaign):
    self.c = campaign
    self.work = os.path.join(campaign.work, "cases")
    self.figures = collections.Counter()
    self.by_case = collections.Counter()
    self.failures = []
    self.ends = []  # each case's processes: exit code, last stderr line

  def check(self, case, folder, sweep, name, procs):
    """Counts the case's figures; ``procs``: (rc, stderr, expected) of
    each process, ``expected``: "ok", "refused" or "either"."""
    self.by_case[case] += 1
    self.figures["cases"] += 1
    self.ends.append({"case": case, "ends": [
        [rc, (err.strip().splitlines() or [""])[-1][:400]]
        for rc, err, _ in procs]})
    bad = []
    for rc, err, expected in procs:
      if _traceback(err):
        self.figures["tracebacks"] += 1
        bad.append(f"traceback: {err[-TAIL:]}")
      elif not (rc == 0 and expected in ("ok", "either") or
                _one_line(rc, err) and expected in ("refused", "either")):
        self.figures["unexpected ends"] += 1
        bad.append(f"rc {rc}, expected {expected}: {err[-TAIL:]}")
    differ = _differences(self.c.ref[name]["folder"], folder, sweep)
    if differ:
      self.figures["silent losses"] += 1
      bad.append(f"differs from the uninterrupted run: {differ[:5]}")
    dup = _duplicated_rows(folder, sweep)
    self.figures["duplicated rows"] += dup
    if dup:
      bad.append(f"{dup} duplicated rows")
    for detail in bad:
      self.failures.append({"case": case, "folder": folder,
                            "detail": detail})
      print(f"  FAIL {case}: {detail[:300]}", flush=True)
    print(f"case {case}: {'ok' if not bad else 'FAILED'}", flush=True)

  def together(self, case, name, index):
    """Two processes of ``name`` with one new folder, started together."""
    folder = os.path.join(self.work, f"{case}-{index:03d}")
    sweep = name == "sweep"
    procs = [start(ALL[name] + ["--out", folder]) for _ in range(2)]
    ends = [_ended(p) for p in procs]
    rcs = sorted(rc for rc, _ in ends)
    if not sweep and rcs != [0, 2]:
      self.figures["unexpected ends"] += 1
      self.failures.append({"case": case, "folder": folder,
                            "detail": f"exit codes {rcs}: one must win"})
    self.check(case, folder, sweep, name,
               [(rc, err, "ok" if sweep else "either") for rc, err in ends])

  def resume_while_running(self, name, index):
    from lowbw import telemetry
    folder = os.path.join(self.work, f"resume_while_running-{index:03d}")
    first = start(ALL[name] + ["--out", folder])
    while first.poll() is None and not telemetry.has_checkpoint(folder):
      time.sleep(0.02)
    ended = first.poll() is not None
    if ended:  # then the resume of a finished run must change nothing
      self.figures["resume_while_running: the run ended first"] += 1
    rc2, err2 = _ended(start(["train", "--resume", folder, "--no-progress",
                              "--no-plot"]))
    rc1, err1 = _ended(first)
    self.check("resume_while_running", folder, False, name,
               [(rc1, err1, "ok"),
                (rc2, err2, "either" if ended else "refused")])

  def faulted(self, case, name, folder, file_limit=None, fix=None):
    """A run under a fault, then, once ``fix()`` has removed it, resumed
    as its error line says."""
    rc, err = _ended(start(ALL[name] + ["--out", folder],
                           file_limit=file_limit))
    procs = [(rc, err, "either")]
    if fix is not None:
      fix()
    if rc != 0:
      from lowbw import telemetry
      again = (["train", "--resume", folder, "--no-progress", "--no-plot"]
               if telemetry.has_checkpoint(folder) else
               ALL[name] + ["--out", folder, "--overwrite"])
      if "--resume" in again and "resume" not in err:
        self.failures.append({"case": case, "folder": folder,
                              "detail": f"no resume named: {err[-TAIL:]}"})
      rc2, err2 = _ended(start(again))
      procs.append((rc2, err2, "ok"))
    else:
      self.figures[f"{case}: the fault did not meet a write"] += 1
    self.check(case, folder, False, name, procs)

  def disk_full(self, name, index):
    mount = os.path.join(self.work, f"disk_full-{index:03d}")
    os.makedirs(mount)
    need = _folder_bytes(self.c.ref[name]["folder"])
    size = max(4096, int(self.c.rng.uniform(0.02, 1.0) * need))
    try:
      subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                      mount], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
      self.figures["disk_full: no tmpfs (needs root)"] += 1
      return
    try:
      self.faulted("disk_full", name, os.path.join(mount, "run"),
                   fix=lambda: subprocess.run(
                       ["mount", "-o", "remount,size=256m", mount],
                       check=True))
    finally:
      subprocess.run(["umount", "-l", mount], capture_output=True)

  def file_size_limit(self, name, index):
    limit = int(self.c.rng.uniform(0.02, 1.0) * _largest_file(
        self.c.ref[name]["folder"]))
    self.faulted("file_size_limit", name,
                 os.path.join(self.work, f"file_size_limit-{index:03d}"),
                 file_limit=limit)

  def run(self, repeats, names):
    for name in ("ddp", "ddp_long", *(["sweep"] if "sweep" in names else [])):
      if name not in self.c.ref:
        self.c.reference(name)
    for i in range(repeats):
      self.together("two_trains", "ddp", i)
      self.resume_while_running("ddp_long", i)
      if "sweep" in names:
        self.together("two_sweeps", "sweep", i)
      self.disk_full("ddp", i)
      self.file_size_limit("ddp", i)


def _commit():
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))
                          ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def _report(campaign, chains, start, argv, cases=None):
  import jax
  figures = {} if cases is None else {
      "cases": {"run": dict(sorted(cases.by_case.items())),
                **{k: cases.figures.get(k, 0) for k in (
                    "cases", "silent losses", "tracebacks",
                    "duplicated rows", "unexpected ends")},
                "notes": {k: v for k, v in sorted(cases.figures.items())
                          if ":" in k},
                "failures": cases.failures, "ends": cases.ends}}
  return {
      "command": "python benchmarks/kill_campaign.py " + " ".join(
          sys.argv[1:] if argv is None else argv),
      "commit": campaign.commit,
      "kills": campaign.kills, "chains": chains,
      "kills_by_config": dict(sorted(campaign.by_config.items())),
      "kills_by_kind": dict(sorted(campaign.by_kind.items())),
      "counts": dict(sorted(campaign.counts.items())),
      "failures": campaign.failures,
      **figures,
      "reference_wall_s": {n: round(r["wall"], 1)
                           for n, r in campaign.ref.items()},
      "wall_s": round(time.perf_counter() - start, 1),
      "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                  "python": platform.python_version(),
                  "jax": jax.__version__},
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--kills", type=int, default=200,
                 help="stop after this many kills (train and sweep)")
  p.add_argument("--configs", default=",".join(CONFIGS),
                 help=f"comma-separated, of {', '.join(CONFIGS)}")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--work", help="folder for the runs (default: a temporary "
                 "one, removed after)")
  p.add_argument("--json", help="write the counts and failures here (after "
                 "every chain)")
  p.add_argument("--chain-kills", type=int, default=5,
                 help="at most this many kills per chain (1 to it)")
  p.add_argument("--cases", type=int, default=1,
                 help="times to run each concurrency and disk-fault case "
                 "(Cases) before the kills; 0: none")
  p.add_argument("--compile-cache", help="the compilation cache every "
                 "process of the campaign shares (default: "
                 "$LOWBW_COMPILE_CACHE, else WORK/xla)")
  args = p.parse_args(argv)
  names = args.configs.split(",")
  unknown = [n for n in names if n not in CONFIGS]
  if unknown:
    p.error(f"--configs={unknown[0]!r} is invalid: expected some of "
            f"{', '.join(CONFIGS)}")
  if args.chain_kills < 1:
    p.error(f"--chain-kills={args.chain_kills} is invalid: expected an "
            "integer >= 1")
  work = args.work or tempfile.mkdtemp(prefix="kill-campaign-")
  # One cache for all: each process after the first of its configuration
  # loads its programs instead of compiling them (seconds per kill).
  os.environ["LOWBW_COMPILE_CACHE"] = (
      args.compile_cache or os.environ.get("LOWBW_COMPILE_CACHE") or
      os.path.join(work, "xla"))
  campaign, start = Campaign(work, args.seed), time.perf_counter()
  for name in names:
    campaign.reference(name)
  cases = Cases(campaign)
  if args.cases:
    cases.run(args.cases, names)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(_report(campaign, 0, start, argv, cases), f, indent=2)
  index = 0
  while campaign.kills < args.kills:
    name = names[index % len(names)]
    campaign.chain(name, index, campaign.rng.randint(1, args.chain_kills))
    index += 1
    print(f"chain {index} ({name}): {campaign.kills} kills, "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    # After every chain: a campaign cut short still leaves its figures.
    report = _report(campaign, index, start, argv, cases)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
  for outcome, n in sorted(campaign.counts.items()):
    print(f"{n:5d}  {outcome}")
  if args.cases:
    f = cases.figures
    print(f"cases: {f['cases']} run {dict(sorted(cases.by_case.items()))}, "
          f"{f['silent losses']} silent losses, {f['tracebacks']} "
          f"tracebacks, {f['duplicated rows']} duplicated rows, "
          f"{f['unexpected ends']} unexpected ends")
  failures = len(campaign.failures) + len(cases.failures)
  print(f"{failures} failures, {campaign.kills} kills in "
        f"{index} chains, {time.perf_counter() - start:.0f} s")
  if not args.work:
    shutil.rmtree(work, ignore_errors=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
