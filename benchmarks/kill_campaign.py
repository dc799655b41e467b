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
  """A study table's rows, wall and compile seconds aside. study.csv as
  numbers by column name: a resumed study's points come back from their
  metrics.csv (columns in its order, every number a float), so its
  study.csv says ``8.0`` where an uninterrupted study's says ``8``."""
  rows = [{k: v for k, v in r.items() if not k.startswith(
      ("wall_time_s", "compile_s"))} for r in csv_rows(path)]
  if os.path.basename(path) != "study.csv":
    return rows
  return [{k: _number(v) for k, v in sorted(r.items())} for r in rows]


def _number(text):
  try:
    return float(text)
  except ValueError:
    return text


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
      rc, err, wall = run(CONFIGS[name] + ["--out", folder],
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
    _, _, wall = run(CONFIGS[name] + ["--out", folder + "-warm"])
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


def _commit():
  try:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))
                          ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def _report(campaign, chains, start, argv):
  import jax
  return {
      "command": "python benchmarks/kill_campaign.py " + " ".join(
          sys.argv[1:] if argv is None else argv),
      "commit": campaign.commit,
      "kills": campaign.kills, "chains": chains,
      "kills_by_config": dict(sorted(campaign.by_config.items())),
      "kills_by_kind": dict(sorted(campaign.by_kind.items())),
      "counts": dict(sorted(campaign.counts.items())),
      "failures": campaign.failures,
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
  index = 0
  while campaign.kills < args.kills:
    name = names[index % len(names)]
    campaign.chain(name, index, campaign.rng.randint(1, args.chain_kills))
    index += 1
    print(f"chain {index} ({name}): {campaign.kills} kills, "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    # After every chain: a campaign cut short still leaves its figures.
    report = _report(campaign, index, start, argv)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
  for outcome, n in sorted(campaign.counts.items()):
    print(f"{n:5d}  {outcome}")
  print(f"{len(campaign.failures)} failures, {campaign.kills} kills in "
        f"{index} chains, {time.perf_counter() - start:.0f} s")
  if not args.work:
    shutil.rmtree(work, ignore_errors=True)
  return 1 if campaign.failures else 0


if __name__ == "__main__":
  sys.exit(main())
