"""A traced top-k density: one build runs every fraction of a top-k codec
(``lowbw.build(config, traced=("density",))``), and a study over densities
and H builds once per strategy; every point equals its single run
(``lowbw.simulate``), and the codec under a traced count equals top-k at
that fraction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
import test_traced_period as traced_period
from lowbw.simulation import _exe_store
from lowbw.transforms import _topk
from lowbw.transforms._sparse import sparse_count

HS = (2, 3)
DENSITIES = (0.05, 0.1, 0.3)
STEPS = 11  # a tail of 1 and 2 steps past the last round
BASE = dict(data="digits", workers=2, batch_size=8, hidden=16, steps=STEPS,
            progress=False,
            bandwidth="100Mbps", latency="20ms", hardware="0.01s")
EXACT = ("payload_bytes", "wire_bytes", "sent_bytes", "received_bytes",
         "sim_time_s", "step", "examples")


def config(strategy="diloco", H=3, density=0.3, **kw):
  return lowbw.Config(strategy=strategy, H=H, codec=f"topk:{density}",
                      **{**BASE, **kw})


def assert_same(history, reference, label):
  """As a traced H's test checks a point, with every byte counter exact."""
  traced_period.assert_same(history, reference, label, EXACT)


@pytest.fixture(scope="module")
def references():
  """Each (strategy, H, density)'s single run, built with those."""
  return {(s, h, d): lowbw.simulate(config(s, h, d))
          for s in ("diloco", "sparseloco") for h in HS for d in DENSITIES}


def test_a_study_over_densities_and_H_builds_once_per_strategy(
    references, tmp_path):
  study = lowbw.study(dict(BASE), grid={
      "strategy": ["diloco", "sparseloco"], "H": list(HS),
      "codec": [f"topk:{d}" for d in DENSITIES]},
      seeds=[0], out=str(tmp_path / "study"), plots=False,
      points_per_batch=2)  # vmapped batches (one point and its repeat)
  assert study.summary["builds"] == 2
  assert study.summary["groups"] == 2
  assert len(study.points) == 12
  for point in study.points:
    label = f"{point.values}"
    assert not point.summary.get("error"), label
    v = point.values
    ref = references[v["strategy"], v["H"], float(v["codec"][5:])]
    assert_same(point.history, ref.history, label)
    for key in ("payload_bytes", "wire_bytes", "sim_time_s"):
      assert point.summary[key] == ref.summary[key], (label, key)
    assert point.config.codec == v["codec"]


def test_one_build_runs_every_density_and_H_without_compiling_again(
    references):
  sim = lowbw.build(config("sparseloco", 3, 0.3), traced=("H", "density"),
                    compile=False)
  for h in HS:
    for d in DENSITIES:
      result = sim.run(hparams={"H": h, "density": d}, progress=False)
      ref = references["sparseloco", h, d]
      assert_same(result.history, ref.history, f"H={h}, density={d}")
      assert result.summary["payload_bytes"] == ref.summary["payload_bytes"]
      assert result.config["strategy"]["codec"] == f"topk:{d}"
      assert result.config["channels"] == ref.config["channels"]
  assert sim.compilations == 1
  # A view at another H keeps its density (the host's bytes are its own).
  view = sim.at(None, 0.05).at_period(2)
  assert view.channels == sim.at(2, 0.05).channels
  assert view.channels != sim.at(2).channels


def _roundtrip(codec, x, counts=None):
  @jax.jit
  def go(x, counts):
    with _topk.keeping(counts):
      return codec.decode(codec.encode(x))
  return np.asarray(go(x, counts))


@pytest.mark.parametrize("layout", [{}, {"chunk": 24}, {"block": 8}])
def test_the_codec_under_a_traced_count_is_top_k_at_that_fraction(layout):
  """Whole tensors, flat chunks (the last one padded) and 2-D blocks; ties
  (repeated magnitudes) keep the lower position in both."""
  x = jax.random.normal(jax.random.PRNGKey(3), (20, 13))
  x = x.at[0, :6].set(0.5).at[3, :4].set(-0.5)   # ties
  big = _topk.top_k(0.5, **layout)
  for d in (0.01, 0.05, 0.1, 0.25, 0.5):
    counts = _topk.keep_counts(big, [x.shape], d)
    want = _roundtrip(_topk.top_k(d, **layout), x)
    np.testing.assert_array_equal(_roundtrip(big, x, counts), want,
                                  err_msg=f"{layout} {d}")
    for n, k in counts.items():
      assert int(k) == sparse_count(int(n), d)


def test_counts_are_the_untraced_codecs_at_half_way_edges():
  """k = max(1, round(d n)) in float64 on the host, as the codec counts it
  (0.05 x 10 = 0.5 rounds to 1; 0.25 x 10 = 2.5 to 2; 0.35 x 10 to 4)."""
  codec = _topk.top_k(1.0)
  for d in (0.05, 0.15, 0.25, 0.35, 0.45):
    counts = _topk.keep_counts(codec, [(10,), (30,), (7, 9)], d)
    for n in (10, 30, 63):
      payload = _topk.top_k(d).encode(jnp.arange(1.0, n + 1))
      assert int(counts[str(n)]) == payload.data["values"].size, (d, n)


@pytest.mark.parametrize("kw, traced, message", [
    (dict(codec="topk:0.1,quant:4"), ("density",),
     r"^traced=\('density',\) is invalid: not supported with codec "
     r"'topk:0.1,quant:4' \(a traced density is the fraction of a top-k "
     r"codec alone"),
    (dict(codec="quant:4"), ("H", "density"),
     r"^traced=\('density',\) is invalid: not supported with codec "
     r"'quant:4'"),
    (dict(strategy="diloco", outer_delay=1), ("density",),
     r"^traced=\('density',\) is invalid: not supported with strategy "
     r"'diloco' as configured .* a traced top-k density supports diloco"),
])
def test_a_build_refuses_a_density_it_cannot_trace(kw, traced, message):
  c = config().replace(**kw)
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.build(c, traced=traced, compile=False)


def test_a_traced_density_build_keeps_no_executables_on_disk(monkeypatch):
  """``_density``'s docstring says why; the same config traced on H alone
  has its recipe."""
  monkeypatch.setenv("LOWBW_EXECUTABLE_STORE", "1")
  # A plugin another test of this process registered turns the store off.
  monkeypatch.setattr(_exe_store, "_IMPORTED", _exe_store._names())
  c = config("diloco", 3, 0.1)
  assert lowbw.build(c, traced=("H",), compile=False).compiled.recipe
  assert lowbw.build(c, traced=("H", "density"),
                     compile=False).compiled.recipe is None


def test_a_run_refuses_a_density_the_build_cannot_run():
  sim = lowbw.build(config("diloco", 3, 0.1), traced=("density",),
                    compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^density=0.3 is invalid: "
                     r"at most 0.1, the top-k density this build"):
    sim.run(hparams={"density": 0.3})
  with pytest.raises(lowbw.ConfigError, match=r"^density=0 is invalid"):
    sim.run(hparams={"density": 0})
  with pytest.raises(lowbw.ConfigError, match=r"^hparams='H' is invalid: "
                     r"not a traced hyperparameter"):
    sim.run(hparams={"density": 0.05, "H": 2})
  with pytest.raises(lowbw.ConfigError, match=r"^checkpoint_every=3 is "
                     r"invalid: not supported on a build with a traced "
                     r"top-k density"):
    sim.run(hparams={"density": 0.05}, checkpoint_every=3)
  plain = lowbw.build(config("diloco", 3, 0.1), compile=False)
  with pytest.raises(lowbw.ConfigError, match=r"^hparams='density' is "
                     r"invalid: not a traced hyperparameter"):
    plain.run(hparams={"density": 0.05})
