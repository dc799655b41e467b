"""Staleness-aware outer transforms (CGAD, arXiv 2605.09126) against plain
Python: the gate's formula, and Adam fed the gated pseudo-gradients one
outer step at a time, whole-model and per fragment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import yaml

import lowbw
from lowbw import cli, telemetry
from lowbw.strategies import _stale

ALPHA, CUTOFF = 0.15, 6.0
LR, B1, B2, EPS = 0.02, 0.9, 0.99, 1e-3


def gate(tau, alpha=ALPHA, cutoff=CUTOFF):
  """sigma(tau) as the paper writes it: a cosine gate reaching 0 at the
  cutoff, times exp(-alpha tau)."""
  gamma = 1.0 if not cutoff else (
      0.5 * (1 + math.cos(math.pi * tau / cutoff)) if tau < cutoff else 0.0)
  return gamma * math.exp(-alpha * tau)


class Adam:
  """Adam in numpy (optax's form: eps outside the square root)."""

  def __init__(self, shape):
    self.m, self.v, self.t = np.zeros(shape), np.zeros(shape), 0

  def step(self, g):
    self.t += 1
    self.m = B1 * self.m + (1 - B1) * g
    self.v = B2 * self.v + (1 - B2) * g * g
    m_hat = self.m / (1 - B1 ** self.t)
    v_hat = self.v / (1 - B2 ** self.t)
    return -LR * m_hat / (np.sqrt(v_hat) + EPS)


@pytest.mark.parametrize("alpha, cutoff", [(ALPHA, CUTOFF), (0.3, 0.0),
                                           (0.0, 4.0), (0.0, 0.0)])
def test_the_gate_is_the_formula(alpha, cutoff):
  for tau in (0, 1, 2, 3.5, 5, 5.99, 6, 9, 30):
    assert float(_stale.cgad_scale(tau, alpha, cutoff)) == pytest.approx(
        gate(tau, alpha, cutoff), rel=1e-5, abs=1e-7)
  assert float(_stale.cgad_scale(0, alpha, cutoff)) == 1.0


def _stream(seed=0, steps=12):
  rng = np.random.default_rng(seed)
  ages = [0, 0, 1, 3, 2, 7, 0, 5, 6, 1, 4, 2][:steps]
  grads = [{"w": rng.normal(size=(3, 2)), "b": rng.normal(size=2)}
           for _ in ages]
  return grads, ages


def test_cgad_is_adam_on_the_gated_pseudo_gradients():
  grads, ages = _stream()
  tx = _stale.cgad(ALPHA, CUTOFF, LR, b1=B1, b2=B2, eps=EPS)
  update = jax.jit(tx.update)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state = tx.init(params)
  ref = {k: Adam(v.shape) for k, v in grads[0].items()}
  for g, tau in zip(grads, ages):
    got, state = update(jax.tree.map(jnp.float32, g), state, params,
                        age=float(tau))
    for k in g:
      want = ref[k].step(gate(tau) * g[k])
      np.testing.assert_allclose(got[k], want, rtol=2e-4, atol=1e-6)


def test_per_fragment_ages_gate_each_fragment_by_its_own():
  """PA-CGAD: an age per fragment (here per tensor), each fragment's Adam
  fed its own gated pseudo-gradient."""
  grads, ages = _stream(seed=1)
  tx = _stale.cgad(ALPHA, CUTOFF, LR, b1=B1, b2=B2, eps=EPS)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state = tx.init(params)
  ref = {k: Adam(v.shape) for k, v in grads[0].items()}
  for i, g in enumerate(grads):
    age = {"w": float(ages[i]), "b": float(ages[-1 - i])}
    got, state = tx.update(jax.tree.map(jnp.float32, g), state, params,
                           age=age)
    for k in g:
      np.testing.assert_allclose(got[k], ref[k].step(gate(age[k]) * g[k]),
                                 rtol=2e-4, atol=1e-6)


def test_no_gate_is_plain_adam_bit_for_bit():
  grads, ages = _stream(seed=2)
  gated = _stale.cgad(0.0, 0.0, LR, b1=B1, b2=B2, eps=EPS)
  plain = _stale._optim.outer_optimizer(LR, kind="adam", b1=B1, b2=B2,
                                        eps=EPS)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  s_gated, s_plain = gated.init(params), plain.init(params)
  for g, tau in zip(grads, ages):
    g = jax.tree.map(jnp.float32, g)
    a, s_gated = gated.update(g, s_gated, params, age=float(tau))
    b, s_plain = plain.update(g, s_plain, params)
    for k in g:
      np.testing.assert_array_equal(a[k], b[k])


def test_past_the_cutoff_a_pseudo_gradient_does_not_move_the_moments():
  tx = _stale.scale_by_age(ALPHA, CUTOFF)
  g = {"w": jnp.ones(3)}
  out, _ = tx.update(g, tx.init(g), age=CUTOFF + 1)
  np.testing.assert_array_equal(out["w"], np.zeros(3))
  fresh, _ = tx.update(g, tx.init(g))   # no age: fresh, unchanged
  np.testing.assert_array_equal(fresh["w"], np.ones(3))


@pytest.mark.parametrize("kwargs, field", [
    (dict(alpha=-0.1, cutoff=4.0), "alpha"),
    (dict(alpha=0.1, cutoff=-1.0), "cutoff"),
    (dict(alpha=0.1, cutoff=float("inf")), "cutoff"),
])
def test_bad_settings_name_the_setting(kwargs, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    _stale.cgad(**kwargs)
  with pytest.raises(ValueError, match=f"^{field}="):
    _stale.scale_by_age(**kwargs)


def test_the_transform_composes_with_optax_chain():
  tx = optax.chain(_stale.scale_by_age(ALPHA, CUTOFF), optax.sgd(1.0))
  out, _ = tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}),
                     age=2.0)
  np.testing.assert_allclose(out["w"], -gate(2.0) * np.ones(2), rtol=1e-6)


# --------------------------------------------- HeLoCo (arXiv 2606.00271)
HELOCO = dict(keep=0.3, shrink=1.5, shrink_cap=0.8, reorient=0.7, kappa=0.5,
              momentum=0.8)


def heloco_step(d, m, keep, shrink, shrink_cap, reorient, kappa, eps=1e-8):
  """One block's correction as the paper states it, and which case it took."""
  nd, nm = np.linalg.norm(d), np.linalg.norm(m)
  if nd == 0 or nm == 0:
    return d, "no reference"
  u, v = d / nd, m / nm
  c = float(np.clip(u @ v if d.ndim == 1 else np.sum(u * v), -1, 1))
  if c >= keep:
    return d, "keep"
  conf = nd / (nd + kappa * nm + eps)
  if c < 0:
    beta = min(shrink * -c * conf, shrink_cap)
    return d - beta * c * nd * v, "shrink"
  lam = min(reorient * (1 - c) * conf, 1.0)
  u_tilde = (1 - lam) * u + lam * v
  return nd * u_tilde / max(np.linalg.norm(u_tilde), eps), "reorient"


class HeLoCoReference:
  """HeLoCo per step in numpy: every tensor corrected against the momentum
  reference, then m <- mu m + (1 - mu) (the corrected pseudo-gradient)."""

  def __init__(self, like, momentum, **rule):
    self.m = {k: np.zeros_like(v) for k, v in like.items()}
    self.mu, self.rule, self.cases = momentum, rule, []

  def step(self, g):
    out = {}
    for k in g:
      out[k], case = heloco_step(g[k], self.m[k], **self.rule)
      self.cases.append(case)
      self.m[k] = self.mu * self.m[k] + (1 - self.mu) * out[k]
    return out


def _heloco_stream(seed=3, steps=14):
  """Pseudo-gradients that take every case: repeats of a direction (kept),
  its reverse (shrunk), fresh noise (reoriented when weakly aligned)."""
  rng = np.random.default_rng(seed)
  base = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=3)}
  grads = []
  for i in range(steps):
    noise = {k: rng.normal(size=v.shape) for k, v in base.items()}
    sign = -1.0 if i % 5 == 3 else 1.0
    mix = 0.3 if i % 3 else 1.5
    grads.append({k: sign * base[k] + mix * noise[k] for k in base})
  return grads


def test_heloco_is_the_papers_rule_step_by_step():
  grads = _heloco_stream()
  tx = _stale.heloco(**HELOCO)
  update = jax.jit(tx.update)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state = tx.init(params)
  ref = HeLoCoReference(grads[0], **HELOCO)
  for g in grads:
    got, state = update(jax.tree.map(jnp.float32, g), state, params, age=2.0)
    want = ref.step(g)
    for k in g:
      np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6)
    for k in g:
      np.testing.assert_allclose(state.momentum[k], ref.m[k], rtol=2e-5,
                                 atol=1e-6)
  assert {"no reference", "keep", "shrink", "reorient"} <= set(ref.cases), (
      ref.cases)


def test_heloco_before_the_outer_step_feeds_it_the_corrected_gradient():
  grads = _heloco_stream(seed=4)
  outer = _stale._optim.outer_optimizer(0.7, momentum=0.9)
  tx = _stale.stale_outer("heloco:" + ",".join(
      f"{k}={v}" for k, v in HELOCO.items()), outer)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state, plain_state = tx.init(params), outer.init(params)
  ref = HeLoCoReference(grads[0], **HELOCO)
  for g in grads:
    got, state = tx.update(jax.tree.map(jnp.float32, g), state, params,
                           age=1.0, arrivals=1)
    fixed = jax.tree.map(jnp.float32, ref.step(g))
    want, plain_state = outer.update(fixed, plain_state, params)
    for k in g:
      np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("spec", ["heloco:keep=-1",
                                  "heloco:keep=-1,shrink=3,reorient=1"])
def test_heloco_that_keeps_every_block_is_the_plain_outer_step_bit_for_bit(
    spec):
  grads = _heloco_stream(seed=5)
  outer = _stale._optim.outer_optimizer(0.7, momentum=0.9)
  tx = _stale.stale_outer(spec, outer)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  state, plain_state = tx.init(params), outer.init(params)
  for g in grads:
    g = jax.tree.map(jnp.float32, g)
    a, state = tx.update(g, state, params, age=3.0)
    b, plain_state = outer.update(g, plain_state, params)
    for k in g:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_block_against_the_momentum_is_shrunk_along_it():
  """beta = 1 removes the component along m (a projection off m)."""
  m, d = jnp.array([1.0, 0.0]), jnp.array([-2.0, 1.0])
  out = _stale.heloco_block(d, m, keep=0.5, shrink=100.0, shrink_cap=1.0,
                            reorient=0.0, kappa=0.0)
  np.testing.assert_allclose(out, [0.0, 1.0], atol=1e-6)


# --------------------------------------------- the rule as a spec string
def test_cgad_from_a_spec_before_adam_is_cgad_bit_for_bit():
  grads, ages = _stream(seed=6)
  adam = _stale._optim.outer_optimizer(LR, kind="adam", b1=B1, b2=B2, eps=EPS)
  from_spec = _stale.stale_outer(f"cgad:alpha={ALPHA},cutoff={CUTOFF}", adam)
  direct = _stale.cgad(ALPHA, CUTOFF, LR, b1=B1, b2=B2, eps=EPS)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  s1, s2 = from_spec.init(params), direct.init(params)
  for g, tau in zip(grads, ages):
    g = jax.tree.map(jnp.float32, g)
    a, s1 = from_spec.update(g, s1, params, age=float(tau))
    b, s2 = direct.update(g, s2, params, age=float(tau))
    for k in g:
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("spec", [None, "none", " None "])
def test_no_rule_is_the_outer_optimizer_itself(spec):
  grads, ages = _stream(seed=7)
  outer = _stale._optim.outer_optimizer(0.7, momentum=0.9)
  tx = _stale.stale_outer(spec, outer)
  params = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.float32), grads[0])
  s1, s2 = tx.init(params), outer.init(params)
  for g, tau in zip(grads, ages):
    g = jax.tree.map(jnp.float32, g)
    a, s1 = tx.update(g, s1, params, age=float(tau))
    b, s2 = outer.update(g, s2, params)
    for k in g:
      np.testing.assert_array_equal(a[k], b[k])


def test_a_spec_takes_defaults_for_the_fields_left_out():
  assert _stale.parse_stale_outer("heloco") == ("heloco",
                                                _stale.HELOCO_DEFAULTS)
  assert _stale.parse_stale_outer("HeLoCo: keep=0.5 , kappa=2") == (
      "heloco", {**_stale.HELOCO_DEFAULTS, "keep": 0.5, "kappa": 2.0})
  assert _stale.parse_stale_outer("cgad:cutoff=8,alpha=0.1") == (
      "cgad", {"alpha": 0.1, "cutoff": 8.0})


@pytest.mark.parametrize("spec, words", [
    ("cgda:alpha=0.1,cutoff=8", "unknown rule 'cgda' (did you mean 'cgad'?)"),
    ("cgad:alpa=0.1,cutoff=8", "no field 'alpa' (did you mean 'alpha'?)"),
    ("heloco:kepp=0.1", "no field 'kepp' (did you mean 'keep'"),
    ("cgad:alpha=0.1", "cgad needs cutoff: cgad:alpha=A,cutoff=C"),
    ("cgad:alpha=0.1,alpha=0.2,cutoff=8", "once, as field=number"),
    ("heloco:keep", "once, as field=number"),
    ("heloco:keep=high", "keep='high' is not a number"),
    ("cgad:alpha=-0.1,cutoff=8", "alpha=-0.1 is invalid"),
    ("heloco:keep=2", "keep=2.0 is invalid: expected a cosine in [-1, 1]"),
    ("heloco:momentum=1", "momentum=1.0 is invalid"),
    ("", "expected a staleness rule: cgad:alpha=A"),
    (0.1, "expected a staleness rule"),
])
def test_a_bad_spec_names_the_field_the_value_and_the_rules(spec, words):
  outer = _stale._optim.outer_optimizer(0.7, momentum=0.9)
  with pytest.raises(ValueError) as e:
    _stale.stale_outer(spec, outer)
  assert str(e.value).startswith(f"stale_outer={spec!r} is invalid: ")
  assert words in str(e.value)
  with pytest.raises(ValueError, match="^stale_outer="):
    lowbw.strategies.async_diloco(stale_outer=spec)


# --------------------------------------------- from the command line
# An uneven fleet (speeds 1, 1/2, 1/4): arrivals reach the server stale.
CLI = dict(strategy="async_diloco", data="digits", hidden="8", workers=3,
           batch_size=4, steps=16, H=2, eval_examples=16, hardware="0.1s",
           speeds="1,0.5,0.25", outer="adam", outer_lr=0.01,
           worker_batch="all", devices=1)


def _flags(settings):
  out = ["train", "--no-progress"]
  for name, value in settings.items():
    out += ["--" + name.replace("_", "-"), str(value)]
  return out


def test_the_cli_takes_a_staleness_rule_and_it_changes_the_run(tmp_path):
  rule = "cgad:alpha=0.3,cutoff=3"
  assert cli.main(_flags(dict(CLI, stale_outer=rule)) +
                  ["--out", str(tmp_path / "cli")]) == 0
  written = yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())
  assert (written["stale_outer"], written["outer"]) == (rule, "adam")
  gated = lowbw.simulate(lowbw.Config(**CLI, stale_outer=rule,
                                      progress=False))
  from_cli = telemetry.load_params(str(tmp_path / "cli"), like=gated.params)
  jax.tree.map(np.testing.assert_array_equal, gated.params, from_cli)
  assert np.nanmax(gated.history["strategy_staleness_max"]) >= 2
  plain = lowbw.simulate(lowbw.Config(**CLI, progress=False))
  assert lowbw.Config(**CLI).stale_outer is None
  gap = max(float(np.abs(a - b).max()) for a, b in zip(
      jax.tree.leaves(gated.params), jax.tree.leaves(plain.params)))
  assert gap > 1e-4, gap
  corrected = lowbw.simulate(lowbw.Config(**CLI, stale_outer="heloco",
                                          progress=False))
  assert np.isfinite(corrected.history["train_loss"]).all()
  assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(
      jax.tree.leaves(corrected.params), jax.tree.leaves(plain.params)))


def test_the_cli_names_the_flag_of_a_bad_rule(capsys, tmp_path):
  argv = _flags(dict(CLI, stale_outer="cgad:alpa=0.1,cutoff=8"))
  assert cli.main(argv + ["--out", str(tmp_path / "r")]) == 2
  err = capsys.readouterr().err
  assert "--stale-outer='cgad:alpa=0.1,cutoff=8' is invalid" in err, err
  assert "(did you mean 'alpha'?)" in err, err
