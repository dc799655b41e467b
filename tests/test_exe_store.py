"""Compiled executables kept on disk (``_exe_store``): a build served from
the store runs bit for bit as a traced one, any change of a key part
misses, and a damaged entry falls back to tracing."""

import hashlib

import jax
from jax.experimental.compilation_cache import compilation_cache
import numpy as np
import pytest

import lowbw
from lowbw.models import _registry
from lowbw.simulation import _exe_store

_CONFIG = lowbw.Config(data="digits", model="mlp", hidden="16",
                       strategy="diloco", workers=2, H=2, steps=4,
                       batch_size=4, eval_every=2)


@pytest.fixture(autouse=True)
def names_now(monkeypatch):
  """The registered names as this test starts count as lowbw's own: a
  plugin another test of this process registered (and left) would turn
  the store off for the rest of the process, as it should for a user."""
  monkeypatch.setattr(_exe_store, "_IMPORTED", _exe_store._names())


@pytest.fixture
def store(tmp_path, monkeypatch):
  """The store on, in a folder of its own; records what each load found.
  JAX's persistent cache off: what it loads is never stored."""
  monkeypatch.setenv(_exe_store.VARIABLE, "1")
  was = jax.config.jax_enable_compilation_cache
  _jax_cache(False)
  monkeypatch.setattr(_exe_store, "folder", lambda: tmp_path)
  monkeypatch.setattr(_exe_store, "_foreign_names", lambda: False)
  found, load = [], _exe_store.load
  def spy(entry):
    result = load(entry)
    found.append(result is not None)
    return result
  monkeypatch.setattr(_exe_store, "load", spy)
  yield tmp_path, found
  _jax_cache(was)


def _jax_cache(on: bool) -> None:
  jax.config.update("jax_enable_compilation_cache", on)
  compilation_cache.reset_cache()   # it remembers whether it was used


def _run():
  result = lowbw.build(_CONFIG).run(seed=3)
  return result, result.summary["startup"]


def _same(a, b):
  assert jax.tree.structure(a.params) == jax.tree.structure(b.params)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert sorted(a.history) == sorted(b.history)
  for name in set(a.history) - {"wall_time_s"}:   # the host's clock
    np.testing.assert_array_equal(a.history[name], b.history[name])


def test_served_from_the_store_equals_traced_and_damage_falls_back(store):
  folder, found = store
  traced, _ = _run()
  assert found == [False] and len(list(folder.glob("*.exe"))) == 1
  served, startup = _run()
  assert found[-1] is True and startup["trace_s"] == 0.0
  _same(traced, served)
  (entry,) = folder.glob("*.exe")
  blob = bytearray(entry.read_bytes())
  blob[len(blob) // 2] ^= 0xFF   # one flipped byte: checksum fails
  entry.write_bytes(bytes(blob))
  fallback, startup = _run()
  assert found[-1] is False and startup["trace_s"] > 0.0
  _same(traced, fallback)
  # The fallback wrote a good entry again, which serves the next build.
  _same(traced, _run()[0])
  assert found[-1] is True


def test_programs_from_jax_persistent_cache_are_not_stored(store,
                                                            monkeypatch):
  folder, found = store
  hits = iter(range(100))   # every compilation "served by JAX's cache"
  monkeypatch.setattr(_exe_store, "cache_hits", lambda: next(hits))
  _run()
  assert found == [False] and not list(folder.glob("*.exe"))


def test_an_entry_with_a_good_checksum_but_bad_contents_is_not_used(store):
  folder, _ = store
  body = b"not a pickle"
  (folder / "x.exe").write_bytes(hashlib.sha256(body).digest() + body)
  assert _exe_store.load("x") is None
  assert _exe_store.load("absent") is None


def test_every_key_part_changes_the_key(monkeypatch):
  monkeypatch.setenv(_exe_store.VARIABLE, "1")
  recipe = _exe_store.recipe(_CONFIG)
  args = (np.zeros((2, 3), np.float32),)
  base = _exe_store.key(recipe, "run", args)
  assert _exe_store.key(recipe, "run", args) == base
  changed = [
      _exe_store.key(_exe_store.recipe(_CONFIG.replace(workers=4)), "run", args),
      _exe_store.key(_exe_store.recipe(_CONFIG, ("H",)), "run", args),
      _exe_store.key(recipe, "initial state", args),
      _exe_store.key(recipe, "run", (np.zeros((2, 4), np.float32),)),
      _exe_store.key(recipe, "run", (np.zeros((2, 3), np.int32),))]
  with monkeypatch.context() as m:
    m.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    changed.append(_exe_store.key(recipe, "run", args))
  with monkeypatch.context() as m:
    m.setattr(jax, "__version__", "0.0.0")
    changed.append(_exe_store.key(recipe, "run", args))
  with monkeypatch.context() as m:
    m.setattr(_exe_store, "source_digest", lambda: "another lowbw")
    changed.append(_exe_store.key(recipe, "run", args))
  assert base not in changed and len(set(changed)) == len(changed)
  # A run's own settings (its folder, its seed) keep the build's programs.
  assert _exe_store.recipe(_CONFIG.replace(seed=7, out="elsewhere")) == (
      recipe)


def test_python_objects_and_plugins_are_never_served(monkeypatch):
  monkeypatch.setenv(_exe_store.VARIABLE, "1")
  assert _exe_store.recipe(_CONFIG) is not None
  mlp = lowbw.models.mlp(hidden=(16,), num_classes=10)
  assert _exe_store.recipe(
      _CONFIG.without("hidden").replace(model=mlp)) is None
  with monkeypatch.context() as m:
    m.setenv("LOWBW_PLUGINS", "my_parts")
    assert _exe_store.recipe(_CONFIG) is None
  lowbw.models.register("store_test_mlp", lambda: mlp)
  try:   # a name registered after import: its code is not lowbw's
    assert _exe_store.recipe(_CONFIG) is None
  finally:
    del _registry._FACTORIES["store_test_mlp"]
  assert _exe_store.recipe(_CONFIG) is not None
  with monkeypatch.context() as m:
    m.setattr(jax, "process_count", lambda: 2)
    assert _exe_store.recipe(_CONFIG) is None
  with monkeypatch.context() as m:
    m.setenv(_exe_store.VARIABLE, "0")
    assert _exe_store.recipe(_CONFIG) is None


def test_the_compile_effort_keys_the_stored_programs(monkeypatch):
  # Programs compiled with XLA's quickest settings are not served to a
  # build asking for its full optimisation, nor the other way round.
  monkeypatch.setenv(_exe_store.VARIABLE, "1")
  fast = lowbw.build(_CONFIG, compile=False, compile_effort="fast")
  full = lowbw.build(_CONFIG, compile=False, compile_effort="full")
  assert fast.compiled.recipe and full.compiled.recipe
  assert fast.compiled.recipe != full.compiled.recipe
