"""A traced quantizer bit width: one build runs every width of a linear
quantizer (``lowbw.build(config, traced=("bits",))``), and a study over
widths and H builds once; every point equals its single run
(``lowbw.simulate``) bit for bit, and the codec under traced levels equals
the quantizer built at that width."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw.simulation import _exe_store
from lowbw.studies import _grid
from lowbw.transforms import _quantize, parse_codec

HS = (2, 3)
BITS = (1, 2, 4, 8)
STEPS = 7  # a tail of 1 step past the last round at H 2 and 3
BASE = dict(strategy="diloco", data="digits", workers=4, batch_size=8,
            hidden=16, steps=STEPS, progress=False, ef=0.9,
            bandwidth="100Mbps", latency="20ms", hardware="0.01s")
# A chain whose quantizer rounds stochastically, in chunks.
CHAIN = "topk:0.5,quant:{}:stochastic:chunk=32"


def config(H=3, codec="quant:8", **kw):
  return lowbw.Config(H=H, codec=codec, **{**BASE, **kw})


def assert_same(history, reference, label, near=()):
  """Every column but the wall clock, bit for bit (NaN where the
  reference has NaN); those in ``near`` to 1e-6 relative."""
  assert sorted(history) == sorted(reference), label
  for name, want in reference.items():
    got, want = np.asarray(history[name]), np.asarray(want)
    if name in near:
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=0,
                                 err_msg=f"{label}: {name}")
    elif name != "wall_time_s":
      np.testing.assert_array_equal(got, want, f"{label}: {name}")


def assert_same_run(result, reference, label):
  assert_same(result.history, reference.history, label)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(
      np.asarray(a), np.asarray(b), f"{label}: params"),
               result.params, reference.params)
  for key in ("payload_bytes", "wire_bytes", "sim_time_s"):
    assert result.summary[key] == reference.summary[key], (label, key)
  assert result.config["channels"] == reference.config["channels"], label


@pytest.fixture(scope="module")
def references():
  """Each (H, codec)'s single run, built with those."""
  cases = [(h, f"quant:{b}") for h in HS for b in (2, 4, 8)]
  cases += [(3, "quant:1"), (3, CHAIN.format(2))]
  return {(h, codec): lowbw.simulate(config(h, codec)) for h, codec in cases}


@pytest.mark.parametrize("points_per_batch", [None, 2])
def test_a_study_over_widths_and_H_builds_once(references, tmp_path,
                                               points_per_batch):
  """One point at a time (a CPU's default), and vmapped batches of a
  point and its repeat. A vmapped batch's evaluation of the global
  parameters (same parameters, evaluated for two points at once) may
  round its mean loss differently from a single run's by an ulp, with
  nothing traced too (seen on the 2-core CPU: 2.4e-7 in eval_loss, a
  plain build's batch of two learning rates); every other column stays
  bit for bit."""
  study = lowbw.study(dict(BASE), grid={
      "H": list(HS), "codec": [f"quant:{b}" for b in (2, 4, 8)]},
      seeds=[0], out=str(tmp_path / "study"), plots=False,
      points_per_batch=points_per_batch)
  assert study.summary["builds"] == 1
  assert study.summary["groups"] == 1
  assert len(study.points) == 6
  for point in study.points:
    label = f"{point.values}"
    assert not point.summary.get("error"), label
    v = point.values
    ref = references[v["H"], v["codec"]]
    assert_same(point.history, ref.history, label,
                near=("eval_loss",) if points_per_batch else ())
    for key in ("payload_bytes", "wire_bytes", "sim_time_s"):
      assert point.summary[key] == ref.summary[key], (label, key)
    assert point.config.codec == v["codec"]


def test_one_build_runs_every_width_bit_for_bit(references):
  sim = lowbw.build(config(3, "quant:8"), traced=("bits",), compile=False)
  for b in BITS:
    result = sim.run(hparams={"bits": b}, progress=False)
    assert_same_run(result, references[3, f"quant:{b}"], f"bits={b}")
    assert result.config["strategy"]["codec"] == f"quant:{b}"
  assert sim.compilations == 1


def test_a_chain_with_stochastic_rounding_in_chunks(references):
  """top-k then a stochastic quantizer in chunks: its noise and chunks do
  not depend on the width."""
  sim = lowbw.build(config(3, CHAIN.format(4)), traced=("bits",),
                    compile=False)
  result = sim.run(hparams={"bits": 2}, progress=False)
  assert_same_run(result, references[3, CHAIN.format(2)], "chain")
  assert result.config["strategy"]["codec"] == CHAIN.format(2)


def test_a_view_at_another_H_keeps_its_width():
  sim = lowbw.build(config(3, "quant:8"), traced=("H", "bits"),
                    compile=False)
  view = sim.at(None, None, 2).at_period(2)
  assert view.config.strategy.config["codec"] == "quant:2"
  assert view.channels == sim.at(2, None, 2).channels
  assert view.channels != sim.at(2).channels


def _roundtrip(codec, x, key, levels=None):
  @jax.jit
  def go(x, key, levels):
    with _quantize.leveling(levels):
      return codec.decode(codec.encode(x, key, 1), key)
  return np.asarray(go(x, key, levels))


@pytest.mark.parametrize("spec", ["quant:{}", "quant:{}:chunk=24",
                                  "quant:{}:stochastic", CHAIN])
def test_the_codec_under_traced_levels_is_the_quantizer_at_that_width(spec):
  """The levels are arguments of the compiled program (as in a run's
  state) while the fixed width's are constants: the same bits."""
  x = jax.random.normal(jax.random.PRNGKey(3), (20, 13)) * 3.7
  x = x.at[0, :6].set(0.5).at[3].set(-1.25)  # ties, a constant row
  key = jax.random.PRNGKey(5)
  big = parse_codec(spec.format(8))
  for b in BITS:
    levels = jax.tree.map(jnp.asarray, _quantize.level_numbers(b))
    want = _roundtrip(parse_codec(spec.format(b)), x, key)
    np.testing.assert_array_equal(_roundtrip(big, x, key, levels), want,
                                  f"{spec.format(b)}")


def test_a_study_groups_widths_of_one_quantizer_layout():
  base = config(3, "quant:4")
  points = _grid.expand(base, {"codec": [
      "quant:2", "quant:8", "quant:4:statistical", "quant:2:chunk=64",
      "quant:8:chunk=64", "topk:0.1,quant:4", "topk:0.2,quant:4"]}, [0])
  codecs = [[p.config.codec for p in g] for g in _grid.groups(points)]
  assert codecs == [["quant:2", "quant:8"], ["quant:4:statistical"],
                    ["quant:2:chunk=64", "quant:8:chunk=64"],
                    ["topk:0.1,quant:4"], ["topk:0.2,quant:4"]]


@pytest.mark.parametrize("kw, traced, message", [
    (dict(codec="quant:4:statistical"), ("bits",),
     r"^traced=\('bits',\) is invalid: not supported with codec "
     r"'quant:4:statistical' \(a traced bits value is the width of a linear "
     r"quantizer: quant:B"),
    (dict(codec="int8"), ("H", "bits"),
     r"^traced=\('bits',\) is invalid: not supported with codec 'int8'"),
    (dict(codec="topk:0.1"), ("bits",),
     r"^traced=\('bits',\) is invalid: not supported with codec "
     r"'topk:0.1'"),
    (dict(codec="quant:4"), ("density", "bits"),
     r"^traced=\('density',\) is invalid: not supported with codec "
     r"'quant:4'"),
    (dict(outer_delay=1), ("bits",),
     r"^traced=\('bits',\) is invalid: not supported with strategy "
     r"'diloco' as configured .* a traced quantizer bit width supports diloco"),
])
def test_a_build_refuses_a_width_it_cannot_trace(kw, traced, message):
  c = config(3, "quant:4").replace(**kw)
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.build(c, traced=traced, compile=False)


def test_a_traced_width_build_keeps_no_executables_on_disk(monkeypatch):
  """As a traced density's does not (``_density``'s docstring)."""
  monkeypatch.setenv("LOWBW_EXECUTABLE_STORE", "1")
  # A plugin another test of this process registered turns the store off.
  monkeypatch.setattr(_exe_store, "_IMPORTED", _exe_store._names())
  c = config(3, "quant:4")
  assert lowbw.build(c, traced=("H",), compile=False).compiled.recipe
  assert lowbw.build(c, traced=("H", "bits"),
                     compile=False).compiled.recipe is None


def test_a_run_refuses_a_width_the_build_cannot_run():
  sim = lowbw.build(config(3, "quant:4"), traced=("bits",), compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^bits=8 is invalid: at "
                     r"most 4, the quantizer bit width this build"):
    sim.run(hparams={"bits": 8})
  for bad in (3, 0, True, "2"):
    with pytest.raises(lowbw.ConfigError, match=rf"^bits={bad!r} is "
                       r"invalid: expected one of 1, 2, 4, 8$"):
      sim.run(hparams={"bits": bad})
  with pytest.raises(lowbw.ConfigError, match=r"^hparams='density' is "
                     r"invalid: not a traced hyperparameter"):
    sim.run(hparams={"bits": 2, "density": 0.1})
  with pytest.raises(lowbw.ConfigError, match=r"^checkpoint_every=3 is "
                     r"invalid: not supported on a build with a traced "
                     r"quantizer bit width"):
    sim.run(hparams={"bits": 2}, checkpoint_every=3)
  plain = lowbw.build(config(3, "quant:4"), compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^hparams='bits' is "
                     r"invalid: not a traced hyperparameter"):
    plain.run(hparams={"bits": 2})
