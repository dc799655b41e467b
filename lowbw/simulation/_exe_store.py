"""Compiled programs kept on disk, so that a warm process skips tracing.

JAX's persistent cache (``_compile_cache``) saves compiling, but a fresh
process still traces and lowers every program to find its cache key (0.8-1.4
s of the digits MLP's start). This store keeps the compiled executables
themselves (``jax.experimental.serialize_executable``) in the folder
``lowbw-executables`` inside the compilation cache's folder, keyed by
everything that decides the programs:

- the bytes of every lowbw source file, the jax and jaxlib versions,
  ``XLA_FLAGS``, the ``LOWBW_*`` variables, JAX's numeric settings, the
  processor's instruction sets and the devices;
- the build's whole configuration as plain values (``recipe``): a build
  whose model, data, strategy or codec is a Python object, or a name a
  plugin registered, has no recipe and never uses the store;
- which programs, and their arguments' shapes, types and shardings.

A hit loads the executables that tracing and compiling would have made: the
same bits. Only programs this process compiled are kept: an executable that
JAX's persistent cache loaded does not serialise again on a CPU (it is
written, and then fails when run: "Function ... not found"), so a build
whose programs all come from that cache fills the store only once the
cache has dropped them, or in a fresh cache folder. Any error reading an entry (a damaged file, another jaxlib's
bytes) falls back to tracing, saying so only in the ``lowbw`` logger's debug
messages; an entry that cannot be written is skipped the same way.

``LOWBW_EXECUTABLE_STORE=0`` turns the store off (as does turning the
compilation cache off); a process that changes lowbw's or a model's code
while it runs (a test's monkeypatch) should, since its source files do not
show the change.
"""

import functools
import hashlib
import json
import logging
import os
import pathlib
import pickle
import platform

import jax

FOLDER = "lowbw-executables"
# Entries kept (the least recently written go first): a digits MLP's two
# (its programs, its initial state's over two devices) are 1.6 MB.
MAX_ENTRIES = 64
# Settings that change what a run writes or where, never its programs (a
# run of another seed reuses a build's programs in one process too).
_RUN_ONLY = ("out", "progress", "wandb_project", "seed")
VARIABLE = "LOWBW_EXECUTABLE_STORE"
_OFF = ("0", "false", "off", "no")
_NOT_KEYS = ("LOWBW_COMPILE_CACHE", VARIABLE)
_CHECK = 32   # bytes of the sha256 that open each entry
_log = logging.getLogger("lowbw")
_HIT = "/jax/compilation_cache/cache_hits"
_hits: list[int] = []   # [programs loaded from JAX's cache] once listening


def _on_event(event: str, *args, **kwargs) -> None:
  if event == _HIT:
    _hits[0] += 1


def cache_hits() -> int:
  """How many programs JAX's persistent cache has served this process
  since this was first asked (programs not to keep: see above)."""
  if not _hits:
    _hits.append(0)
    jax.monitoring.register_event_listener(_on_event)
  return _hits[0]


def recipe(config, traced=()) -> str | None:
  """The build's configuration as plain values (``lowbw.Config``), or None
  when a part of it is a Python object or a plugin's, or the run spans
  several processes (no store then)."""
  # Several processes (``lowbw.initialize``) compile one program together:
  # each keeps its own part, which the key would not tell apart.
  if (os.environ.get(VARIABLE, "").strip().lower() in _OFF
      or jax.process_count() > 1
      or os.environ.get("LOWBW_PLUGINS", "").strip() or _foreign_names()):
    return None
  try:
    values = config.to_dict()
    config.to_yaml()   # fails on any Python object
  except Exception:  # noqa: BLE001 -- no recipe, no store
    return None
  for name in _RUN_ONLY:
    values.pop(name, None)
  return json.dumps([values, list(traced)], sort_keys=True, default=repr)


def _names() -> tuple:
  from lowbw import models, strategies, transforms
  return (tuple(models.model_names()), tuple(sorted(strategies.SPECS)),
          tuple(transforms.codec_forms()))


def _foreign_names() -> bool:
  """Whether a model, strategy or codec stage was registered since lowbw
  was imported (their code is not lowbw's; ``LOWBW_PLUGINS`` ones are
  refused by name)."""
  return _names() != _IMPORTED


@functools.cache
def source_digest() -> str:
  """sha256 of every lowbw source file's path and bytes."""
  root = pathlib.Path(__file__).resolve().parent.parent
  digest = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode() + b"\0")
    digest.update(path.read_bytes() + b"\0")
  return digest.hexdigest()


def _environment() -> list:
  import jaxlib
  flags = ("jax_enable_x64", "jax_default_matmul_precision",
           "jax_threefry_partitionable", "jax_default_prng_impl")
  return [source_digest(), jax.__version__, jaxlib.__version__,
          os.environ.get("XLA_FLAGS", ""),
          sorted((k, v) for k, v in os.environ.items()
                 if k.startswith("LOWBW_") and k not in _NOT_KEYS),
          [repr(getattr(jax.config, f, None)) for f in flags],
          [repr(d) for d in jax.devices()],
          jax.devices()[0].client.platform_version, _cpu()]


@functools.cache
def _cpu() -> str:
  """The host's processor and its instruction sets (a CPU executable is
  built for them; a cache folder may be shared between machines)."""
  flags = ""
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line for line in f if line.startswith("flags")), "")
  except OSError:
    pass
  return f"{platform.machine()} {platform.processor()} {flags.strip()}"


def signature(tree) -> list:
  """The structure, shapes, types and shardings of ``tree``'s leaves."""
  leaves, treedef = jax.tree.flatten(tree)
  return [str(treedef)] + [
      [tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x))),
       bool(getattr(x, "weak_type", False)),
       str(getattr(x, "sharding", None))] for x in leaves]


def key(build_recipe: str, what: str, args) -> str:
  """The entry of programs ``what`` of the build ``build_recipe`` for
  arguments like ``args``."""
  text = json.dumps([build_recipe, what, _environment(), signature(args)],
                    default=repr)
  return hashlib.sha256(text.encode()).hexdigest()


def folder() -> pathlib.Path | None:
  """The store's folder, or None while JAX's persistent cache is off."""
  cache = jax.config.jax_compilation_cache_dir
  return pathlib.Path(cache, FOLDER) if cache else None


def load(entry: str) -> tuple | None:
  """The executables saved as ``entry`` (None stays None), or None when
  there are none or they cannot be read."""
  where = folder()
  if where is None:
    return None
  path = where / f"{entry}.exe"
  try:
    blob = path.read_bytes()
  except OSError:
    return None
  try:
    if hashlib.sha256(blob[_CHECK:]).digest() != blob[:_CHECK]:
      raise ValueError("its checksum does not match")
    from jax.experimental import serialize_executable
    return tuple(None if parts is None
                 else serialize_executable.deserialize_and_load(*parts)
                 for parts in pickle.loads(blob[_CHECK:]))
  except Exception as e:  # noqa: BLE001 -- any failure: trace instead
    _log.debug("lowbw: stored executables %s not used (%s: %s); tracing",
               path, type(e).__name__, e)
    return None


def save(entry: str, compiled: tuple) -> None:
  """Keeps ``compiled`` (executables or None) as ``entry``; a failure
  leaves the store as it was."""
  where = folder()
  if where is None:
    return
  try:
    from jax.experimental import serialize_executable
    body = pickle.dumps(tuple(
        None if exe is None else serialize_executable.serialize(exe)
        for exe in compiled))
    where.mkdir(parents=True, exist_ok=True)
    temporary = where / f".{entry}.{os.getpid()}.tmp"
    temporary.write_bytes(hashlib.sha256(body).digest() + body)
    os.replace(temporary, where / f"{entry}.exe")
    _prune(where)
  except Exception as e:  # noqa: BLE001 -- a store is only a shortcut
    _log.debug("lowbw: executables %s not stored (%s: %s)", entry,
               type(e).__name__, e)


def _prune(where: pathlib.Path) -> None:
  entries = sorted(where.glob("*.exe"), key=lambda p: p.stat().st_mtime)
  for path in entries[:max(len(entries) - MAX_ENTRIES, 0)]:
    path.unlink(missing_ok=True)


# The names lowbw's import made (built-in ones).
_IMPORTED = _names()
