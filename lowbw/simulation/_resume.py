"""Checkpoints of a single run: what may change on resume, and restoring."""

import json
import os

import jax

from lowbw import _validate, telemetry
from lowbw import network as net_lib
from lowbw.telemetry import _checkpoint

# What a resumed run may change; everything else must match the checkpoint.
MAY_CHANGE = ("steps", "eval_every", "log_every", "checkpoint_every",
              "eval_examples", "metadata", "jax_version", "backend",
              "devices", "processes", "worker_batch", "memory")


def check_paths(log_dir, checkpoint_every, resume_from) -> None:
  if checkpoint_every and log_dir is None:
    raise _validate.fail("checkpoint_every", checkpoint_every,
                         "needs a log folder, out (checkpoints go to "
                         "out/checkpoints)")
  if resume_from is not None and not os.path.isdir(resume_from):
    raise _validate.fail("resume_from", resume_from, "no such directory")


def continues(log_dir, resume_from) -> bool:
  """The run resumed from ``resume_from`` goes on logging in its folder."""
  return (resume_from is not None and log_dir is not None and
          os.path.abspath(resume_from) == os.path.abspath(log_dir))


def saver(log_dir: str, track):
  """``save(step, state, wall_s)``: a checkpoint of the state and of
  ``track``'s host bookkeeping (rows, byte counters, clock, config) under
  ``log_dir/checkpoints``; ``restore`` reads it back. A save that cannot be
  written raises ``telemetry.WriteError`` (an ``OSError``) at once, naming
  the checkpoint; the checkpoints before it stay, to resume from."""

  def save(step, state, wall):
    meta = {"history": track.history.state_dict(), "wall_time_s": wall,
            "clock": track.clock.state_dict(), "config": track.config}
    _checkpoint.save(os.path.join(log_dir, telemetry.CHECKPOINTS), step, state,
                   meta)

  return save


def _checkpoint_dir(root):
  sub = os.path.join(root, telemetry.CHECKPOINTS)
  return sub if os.path.isdir(sub) else root


# What follows from the settings (a change of W changes them all): named
# only when no setting differs.
_DERIVED = ("channels", "num_params", "network")
# The settings a user may change on resume, as the message lists them.
_SHOWN = ("steps", "eval_every", "log_every", "checkpoint_every",
          "eval_examples", "devices", "worker_batch")


# config.json's keys that are not the setting's name (kept, so that runs
# written before still resume) -> the setting.
_SETTING = {"num_workers": "workers"}


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _check_same(resume_from, saved: dict, current: dict) -> None:
  current = _as_written_before(saved, json.loads(json.dumps(current,
                                                             default=repr)))
  differ = [key for key in sorted(set(saved) | set(current))
            if key not in MAY_CHANGE and saved.get(key) != current.get(key)]
  if not differ:
    return
  key = ([k for k in differ if k not in _DERIVED] or differ)[0]
  name, was, now = _first_difference(saved.get(key), current.get(key),
                                     _SETTING.get(key, key))
  raise _validate.fail(
      "resume_from", resume_from,
      f"the checkpoint was made with {name}={_short(was)} but this "
      f"run has {name}={_short(now)}; only "
      f"{', '.join(_SHOWN)} may change on resume")


def _as_written_before(saved: dict, current: dict) -> dict:
  """``current`` as an older lowbw wrote it, when ``saved`` is older: a run
  from before network profiles (its network has no profile: it ran on the
  ideal clock, which ``current`` must use too), or before a profile's term
  (which ``current`` leaves out)."""
  net, now = saved.get("network"), current.get("network")
  if not (isinstance(net, dict) and isinstance(now, dict)):
    return current
  if ("profile" not in net
      and now.get("profile") == net_lib.profile("ideal").describe()):
    return {**current, "network": {k: v for k, v in now.items()
                                   if k != "profile"}}
  was, profile = net.get("profile"), now.get("profile")
  if isinstance(was, dict) and isinstance(profile, dict):
    profile = {k: v for k, v in profile.items() if k in was}
    return {**current, "network": {**now, "profile": profile}}
  return current


def _first_difference(was, now, path: str) -> tuple:
  """The first path inside two tables where they differ, and its values."""
  if isinstance(was, dict) and isinstance(now, dict):
    for key in sorted(set(was) | set(now), key=str):
      if was.get(key) != now.get(key):
        return _first_difference(was.get(key), now.get(key), f"{path}.{key}")
  return path, was, now


def _damaged(resume_from, step, e: Exception):
  """The error of a checkpoint a part of which is missing or unreadable."""
  first = (str(e).strip().strip("'\"").splitlines()
           or [type(e).__name__])[0][:200]
  return _validate.fail(
      "resume_from", resume_from,
      f"its checkpoint at step {step} cannot be read ({first}); if it is "
      "damaged, delete that step's folder under checkpoints/ to resume "
      "from the one before")


def restore(sim, resume_from, track, initial_state, log_every_given: bool):
  """The checkpointed state (in ``initial_state``'s shardings) and wall
  seconds so far; ``track``'s history and clock continue from it."""
  directory = _checkpoint_dir(resume_from)
  if telemetry.latest_step(directory) is None:
    raise _validate.fail("resume_from", resume_from, "holds no checkpoint")
  step = telemetry.latest_step(directory)
  try:
    step, meta = _checkpoint.read_meta(directory, step)
    config = meta["config"]
  except Exception as e:  # a part of the checkpoint missing or damaged
    raise _damaged(resume_from, step, e) from e
  _check_same(resume_from, config, track.config)
  # Restore straight into this run's placement (the devices' slices under a
  # mesh, one device without): a checkpoint from any device count resumes.
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                     sharding=getattr(x, "sharding", None)),
      initial_state)
  del initial_state
  try:
    step, state, meta = _checkpoint.restore(directory, abstract, step)
  except Exception as e:  # same configuration: the files are damaged
    raise _damaged(resume_from, step, e) from e
  c = sim.config
  if step > c.steps:
    raise _validate.fail("steps", c.steps,
                         f"the checkpoint is already at step {step}")
  if step % c.period:
    raise _validate.fail("resume_from", resume_from,
                         f"checkpoint step {step} is not a round boundary")
  track.history.load_state_dict(meta["history"])
  if "clock" in meta:
    track.clock.load_state_dict(meta["clock"])
  if not log_every_given:
    _continue_spacing(track, meta["history"])
  return state, float(meta.get("wall_time_s", 0.0))


def _continue_spacing(track, saved: dict) -> None:
  """Without ``log_every``: a first run's default spacing becomes this run's
  default (its rows re-spaced as if logged so from the start, so extending a
  run logs what one uninterrupted run does); a spacing the first run was
  given is kept."""
  h, spacing = track.history, int(saved["log_every"])
  default = h.log_every
  h.log_every = spacing
  if (not saved.get("spacing_given", True) and "windows" in saved
      and default % spacing == 0):
    h.respace(default)
  else:
    h.spacing_given = saved.get("spacing_given", True)
  track.config["log_every"] = h.log_every
