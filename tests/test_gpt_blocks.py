"""models.gpt's block options: each one (and all together) against a forward
pass written here with jax.numpy alone on the model's own parameter tree,
each one training, their parameter trees, configs, errors and FLOPs."""

import functools
import math

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import ConfigError, models

SIZES = dict(layers=2, d_model=32, heads=4, seq_len=16, vocab=64)
DEFAULTS = dict(norm="layernorm", mlp="gelu", position="learned",
                qk_norm=False, tie_embeddings=False, norm_position="pre")
CASES = {
    "default": {},
    "rmsnorm": {"norm": "rmsnorm"},
    "swiglu": {"mlp": "swiglu"},
    "rotary": {"position": "rotary"},
    "qk_norm": {"qk_norm": True},
    "tied": {"tie_embeddings": True},
    "post": {"norm_position": "post"},
    "all": {"norm": "rmsnorm", "mlp": "swiglu", "position": "rotary",
            "qk_norm": True, "tie_embeddings": True, "norm_position": "post"},
}
EPS = 1e-6  # flax's LayerNorm and RMSNorm
STEPS = 8


# -- the reference forward pass: jax.numpy only ---------------------------------

def _last(v, x):
  """``v`` (n,) shaped to broadcast along ``x``'s last axis (the tests run
  with implicit rank promotion off)."""
  return v.reshape((1,) * (x.ndim - 1) + v.shape)


def _layernorm(p, x):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return ((x - mean) / jnp.sqrt(var + EPS) * _last(p["scale"], x)
          + _last(p["bias"], x))


def _rmsnorm(p, x):
  return (x / jnp.sqrt((x * x).mean(-1, keepdims=True) + EPS)
          * _last(p["scale"], x))


def _dense(p, x):
  y = x @ p["kernel"]
  return y + _last(p["bias"], y)


def _rotary(x_BxHxTxK):
  """RoFormer's rotation, feature i paired with i + K/2 (as a complex
  number), rotated by position * 10000 ** (-2i / K)."""
  t, k = x_BxHxTxK.shape[-2:]
  theta = 10000.0 ** (-2 * np.arange(k // 2) / k)
  angle = np.arange(t)[:, None] * theta[None, :]
  z = x_BxHxTxK[..., :k // 2] + 1j * x_BxHxTxK[..., k // 2:]
  z = z * jnp.asarray(np.exp(1j * angle)[None, None], jnp.complex64)
  return jnp.concatenate([z.real, z.imag], axis=-1)


def _attention(p, x, opts):
  b, t, d = x.shape
  h = SIZES["heads"]
  k = d // h
  qkv = _dense(p["qkv"], x)
  q, key, v = (qkv[..., i * d:(i + 1) * d].reshape(b, t, h, k)
               .transpose(0, 2, 1, 3) for i in range(3))
  if opts["qk_norm"]:
    q, key = _rmsnorm(p["q_norm"], q), _rmsnorm(p["k_norm"], key)
  if opts["position"] == "rotary":
    q, key = _rotary(q), _rotary(key)
  scores = q @ key.transpose(0, 1, 3, 2) / math.sqrt(k)
  scores = jnp.where(np.tril(np.ones((1, 1, t, t), bool)), scores, -jnp.inf)
  e = jnp.exp(scores - scores.max(-1, keepdims=True))
  out = (e / e.sum(-1, keepdims=True)) @ v
  return _dense(p["out"], out.transpose(0, 2, 1, 3).reshape(b, t, d))


def _mlp(p, x, opts):
  if opts["mlp"] == "swiglu":
    gate = _dense(p["mlp_gate"], x)
    return _dense(p["mlp_out"], gate / (1 + jnp.exp(-gate))
                  * _dense(p["mlp_up"], x))
  u = _dense(p["mlp_in"], x)  # flax's gelu: the tanh approximation
  gelu = 0.5 * u * (1 + jnp.tanh(math.sqrt(2 / math.pi)
                                 * (u + 0.044715 * u ** 3)))
  return _dense(p["mlp_out"], gelu)


def reference(params, tokens, opts):
  """Logits (b, T, vocab) of the gpt with options ``opts``."""
  norm = _rmsnorm if opts["norm"] == "rmsnorm" else _layernorm
  x = params["tok_embed"]["embedding"][tokens]
  if opts["position"] == "learned":
    x = x + params["pos_embed"][None, :tokens.shape[1]]
  for i in range(SIZES["layers"]):
    p = params[f"block_{i}"]
    for ln, sublayer in (("ln_attn", lambda y: _attention(p["attn"], y, opts)),
                         ("ln_mlp", lambda y: _mlp(p, y, opts))):
      if opts["norm_position"] == "pre":
        x = x + sublayer(norm(p[ln], x))
      else:
        x = norm(p[ln], x + sublayer(x))
  if opts["norm_position"] == "pre":
    x = norm(params["ln_final"], x)
  if opts["tie_embeddings"]:
    return x @ params["tok_embed"]["embedding"].T
  return _dense(params["head"], x)


# -- one compiled program per option --------------------------------------------

def _tokens(seed, b):
  return np.random.default_rng(seed).integers(
      0, SIZES["vocab"], (b, SIZES["seq_len"] + 1)).astype(np.int32)


def _like_init(model, seed, scale):
  """Parameters in ``model.init``'s tree (from ``eval_shape``: compiling the
  initialisers would double the test's time) valued as it would, N(0, 0.02)
  matrices, unit norm scales, zero biases, plus N(0, scale) noise."""
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          {"tokens": _tokens(0, 1)})
  rng = np.random.default_rng(seed)

  def value(path, leaf):
    name = jax.tree_util.keystr(path[-1:])
    base = {"['scale']": 1.0, "['bias']": 0.0}.get(name)
    x = (0.02 * rng.normal(size=leaf.shape) if base is None
         else np.full(leaf.shape, base))
    return (x + scale * rng.normal(size=leaf.shape)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(value, shapes)


@functools.cache
def _run(case):
  """(model logits, reference logits, losses of STEPS Adam steps) of
  ``case``, from one compiled program."""
  model = models.gpt(**SIZES, **CASES[case])
  opts = {**DEFAULTS, **CASES[case]}
  batch = {"tokens": _tokens(0, 4)}
  inputs = batch["tokens"][:, :-1]
  # Off the initialisation (norm scales 1, biases 0) so that every parameter
  # shows in the logits.
  moved = _like_init(model, 1, 0.1)
  # One vector for Adam: its per-leaf updates would double the compile time.
  flat, unravel = jax.flatten_util.ravel_pytree(_like_init(model, 2, 0.0))
  tx = optax.adam(1e-2)

  def train(carry, _):
    v, state = carry
    loss, grad = jax.value_and_grad(
        lambda v: model.loss(unravel(v), batch, None)[0])(v)
    updates, state = tx.update(grad, state, v)
    return (v + updates, state), loss

  @jax.jit
  def run(moved, flat):
    _, losses = jax.lax.scan(train, (flat, tx.init(flat)), None, STEPS)
    return (model.apply(moved, inputs), reference(moved, inputs, opts),
            losses)

  return run(moved, flat)


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_the_reference(case):
  logits, want, _ = _run(case)
  assert logits.shape == (4, SIZES["seq_len"], SIZES["vocab"])
  assert float(jnp.std(want)) > 0.1  # not a near-constant output
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_option_trains(case):
  _, _, losses = _run(case)
  losses = np.asarray(losses)
  assert np.all(np.isfinite(losses))
  assert abs(losses[0] - math.log(SIZES["vocab"])) < 0.2  # from chance
  assert losses[-1] < losses[0] - 0.3, losses


# -- parameter trees, configs, errors -------------------------------------------

def _shapes(case):
  model = models.gpt(**SIZES, **CASES[case])
  params = jax.eval_shape(model.init, jax.random.key(0),
                          {"tokens": _tokens(0, 2)})
  return {jax.tree_util.keystr(path): leaf.shape
          for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def test_the_default_tree_is_gpt2s():
  shapes = _shapes("default")
  assert shapes["['pos_embed']"] == (16, 32)
  assert shapes["['head']['kernel']"] == (32, 64)
  assert shapes["['head']['bias']"] == (64,)
  assert shapes["['ln_final']['bias']"] == (32,)
  assert shapes["['block_0']['mlp_in']['kernel']"] == (32, 128)
  assert shapes["['block_1']['attn']['qkv']['bias']"] == (96,)
  assert len(shapes) == 4 + 2 * 12 + 2  # tok, pos, head x2; ln_final x2


def test_each_option_changes_its_own_parameters():
  default = _shapes("default")
  only = {case: set(_shapes(case)) ^ set(default) for case in CASES}
  assert only["rmsnorm"] == {k for k in default if "ln_" in k and "bias" in k}
  assert only["rotary"] == {"['pos_embed']"}
  assert only["tied"] == {"['head']['kernel']", "['head']['bias']"}
  assert only["post"] == {"['ln_final']['scale']", "['ln_final']['bias']"}
  assert only["qk_norm"] == {f"['block_{i}']['attn']['{n}']['scale']"
                             for i in (0, 1) for n in ("q_norm", "k_norm")}
  swiglu = _shapes("swiglu")
  hidden = round(2 / 3 * 4 * 32)  # 85
  assert swiglu["['block_0']['mlp_gate']['kernel']"] == (32, hidden)
  assert swiglu["['block_0']['mlp_up']['kernel']"] == (32, hidden)
  assert swiglu["['block_0']['mlp_out']['kernel']"] == (hidden, 32)
  assert "['block_0']['mlp_in']['kernel']" not in swiglu


def test_config_records_the_options_and_rebuilds_the_model():
  assert set(models.gpt(**SIZES).config) == {"name", *SIZES, "mlp_ratio"}
  model = models.gpt(**SIZES, **CASES["all"])
  assert {k: model.config[k] for k in DEFAULTS} == CASES["all"]
  rebuilt = models.get(**model.config)
  assert rebuilt.config == model.config
  assert _shapes("all") == {
      jax.tree_util.keystr(p): x.shape
      for p, x in jax.tree_util.tree_leaves_with_path(jax.eval_shape(
          rebuilt.init, jax.random.key(0), {"tokens": _tokens(0, 2)}))}


@pytest.mark.parametrize("kw, message", [
    ({"norm": "batchnorm"}, "norm='batchnorm' is invalid: expected one of "
     "'layernorm', 'rmsnorm'"),
    ({"mlp": "relu"}, "mlp='relu' is invalid: expected one of 'gelu', "
     "'swiglu'"),
    ({"position": "alibi"}, "position='alibi' is invalid: expected one of "
     "'learned', 'rotary'"),
    ({"norm_position": "sandwich"}, "norm_position='sandwich' is invalid: "
     "expected one of 'pre', 'post'"),
    ({"qk_norm": "yes"}, "qk_norm='yes' is invalid: expected True or False"),
    ({"tie_embeddings": 1}, "tie_embeddings=1 is invalid: expected True or "
     "False"),
    ({"position": "rotary", "d_model": 12, "heads": 4}, "heads=4 is invalid: "
     "expected a divisor of d_model=12 leaving an even head width"),
])
def test_bad_options_name_field_value_and_choices(kw, message):
  with pytest.raises(ConfigError) as error:
    models.gpt(**kw)
  assert str(error.value).startswith(message)
  with pytest.raises(ConfigError, match="model.rotary"):
    models.get("gpt", rotary=True)


def test_flops_per_token_counts_every_matmul():
  for case in ("default", "all", "tied", "swiglu"):
    config = models.gpt(**SIZES, **CASES[case]).config
    shapes = _shapes(case)
    # Weights of the matmuls, read off the tree: every Dense kernel, and the
    # embedding again when it is the head.
    weights = sum(math.prod(s) for k, s in shapes.items() if "kernel" in k)
    if config.get("tie_embeddings"):
      weights += math.prod(shapes["['tok_embed']['embedding']"])
    d, t = SIZES["d_model"], SIZES["seq_len"]
    attention = SIZES["layers"] * 2 * t * d
    assert models.gpt_flops_per_token(config) == 6 * (weights + attention)
  default = models.gpt(**SIZES).config
  assert (models.gpt_flops_per_token(default, seq_len=8)
          == models.gpt_flops_per_token(default) - 6 * 2 * 2 * 8 * 32)
  with pytest.raises(ConfigError, match="config="):
    models.gpt_flops_per_token(models.mlp().config)


def test_config_and_flags_refuse_bad_block_options(capsys):
  import lowbw
  from lowbw import cli
  with pytest.raises(ValueError, match="norm"):
    lowbw.Config(norm="batchnorm")
  with pytest.raises(ValueError, match="qk_norm"):
    lowbw.Config(qk_norm="yes")
  assert cli.main(["train", "--position", "alibi"]) == 2
  assert "--position" in capsys.readouterr().err


def test_fused_attention_matches_the_einsums_and_stays_off_on_cpu():
  """The fused path (jax.nn.dot_product_attention; XLA's lowering here, cuDNN's
  on a GPU) computes the same causal attention as the einsums, and a CPU run
  never takes it, in float32 or bfloat16."""
  from lowbw.models import _blocks
  q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 16, 4, 8))
  fused = _blocks.attend(q, k, v, fused=True)
  plain = _blocks.attend(q, k, v, fused=False)
  np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)
  assert jax.default_backend() == "cpu"
  assert not _blocks.fused_attention_applies(jnp.bfloat16)
  assert not _blocks.fused_attention_applies(jnp.float32)
