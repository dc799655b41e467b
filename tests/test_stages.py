"""Pipeline stages: a gpt split by blocks (and any model from stage
functions) equals the unsplit model; the stage boundary's codecs send
exactly each codec's round trip forward (activations) and backward
(activation gradients); the boundary's bytes per micro-batch."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import ConfigError, models, transforms
from lowbw.transforms import _compression

SIZES = dict(layers=4, d_model=16, heads=2, seq_len=8, vocab=32)
KEY = jax.random.key(3)


def _batch(b=3, seed=0):
  rng = np.random.default_rng(seed)
  return {"tokens": rng.integers(0, SIZES["vocab"], (b, SIZES["seq_len"] + 1))}


@pytest.fixture(scope="module")
def gpt_and_params():
  model = models.gpt(**SIZES)
  return model, model.init(jax.random.key(0), _batch())


def _max_diff(a, b):
  return max(float(jnp.abs(x - y).max())
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# -- the split equals the unsplit model ----------------------------------------

@pytest.mark.parametrize("stages", [1, 2, 4])
def test_split_gpt_equals_the_unsplit_loss_and_gradients(gpt_and_params,
                                                         stages):
  model, params = gpt_and_params
  batch = _batch()
  staged = models.split(model, stages)
  assert len(staged.stages) == stages
  ref, ref_g = jax.jit(jax.value_and_grad(
      lambda p: model.loss(p, batch, None), has_aux=True))(params)
  out, out_g = jax.jit(jax.value_and_grad(
      models.staged_loss(staged), has_aux=True))(params, batch, None)
  np.testing.assert_allclose(out[0], ref[0], rtol=1e-6)
  np.testing.assert_allclose(out[1]["accuracy"], ref[1]["accuracy"])
  assert jax.tree.structure(out_g) == jax.tree.structure(ref_g)
  assert _max_diff(out_g, ref_g) < 1e-6


@pytest.mark.parametrize("options", [
    {"tie_embeddings": True, "position": "rotary"},
    {"norm_position": "post", "mlp": "swiglu", "norm": "rmsnorm"}])
def test_split_gpt_options_equal_the_unsplit_loss(options):
  model = models.gpt(**SIZES, **options)
  batch = _batch()
  params = model.init(jax.random.key(1), batch)
  staged = models.split(model, 2)
  ref = model.loss(params, batch, None)[0]
  out = models.staged_loss(staged)(params, batch, None)[0]
  np.testing.assert_allclose(out, ref, rtol=1e-6)
  owned = {n for names in staged.owners for n in names}
  assert owned == set(params)


def test_owners_partition_the_parameters(gpt_and_params):
  model, params = gpt_and_params
  owners = models.split(model, 4).owners
  flat = [n for names in owners for n in names]
  assert sorted(flat) == sorted(params)  # each name in exactly one stage
  assert owners[0][:2] == ("tok_embed", "pos_embed")
  assert owners[-1][-2:] == ("ln_final", "head")
  # Every stage reads only its own parameters: the others' gradients are 0.
  batch, staged = _batch(), models.split(model, 4)
  for s, names in enumerate(owners):
    x = None
    for stage in staged.stages[:s]:
      x = stage(params, x, batch)

    def out(p, x=x, s=s):
      y = staged.stages[s](p, x, batch)
      return (y[0] if s == len(owners) - 1 else y).sum()

    grads = jax.grad(out)(params)
    for name in params:
      if name not in names:
        assert _max_diff(grads[name], jax.tree.map(jnp.zeros_like,
                                                   grads[name])) == 0


@pytest.mark.parametrize("layers,stages", [(4, 2), (5, 2), (7, 3), (4, 4)])
def test_block_ranges_against_a_plain_loop(layers, stages):
  sizes = [layers // stages + (1 if s < layers % stages else 0)
           for s in range(stages)]
  starts = [sum(sizes[:s]) for s in range(stages)]
  expect = tuple((a, a + n) for a, n in zip(starts, sizes))
  assert models.block_ranges(layers, stages) == expect


def test_split_errors_name_the_field(gpt_and_params):
  model, _ = gpt_and_params
  with pytest.raises(ConfigError, match="stages.*at most layers=4"):
    models.split(model, 5)
  with pytest.raises(ConfigError, match="stages"):
    models.split(model, 0)
  with pytest.raises(ConfigError, match="stages.*'mlp'.*from_stages"):
    models.split(models.mlp(), 2)
  with pytest.raises(ConfigError, match="stages"):
    models.from_stages(models.mlp(), [])
  with pytest.raises(ConfigError, match="staged"):
    models.staged_loss(model)


def _two_layer():
  """A two-layer classifier as plain functions, and its two stages."""

  def init(key, batch):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (5, 6)) * 0.3,
            "w2": jax.random.normal(k2, (6, 3)) * 0.3}

  def head(params, h, batch):
    logits = h @ params["w2"]
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits, batch["y"]).mean()
    return loss, {}

  def first(params, x, batch):
    return jnp.tanh(batch["x"] @ params["w1"])

  def loss(params, batch, key):
    return head(params, first(params, None, batch), batch)

  return models.as_model((init, loss)), [first, head]


def test_from_stages_composes_a_users_model():
  model, stage_fns = _two_layer()
  batch = {"x": jax.random.normal(KEY, (4, 5)),
           "y": jnp.array([0, 1, 2, 1])}
  params = model.init(jax.random.key(0), batch)
  staged = models.from_stages(model, stage_fns)
  assert staged.owners is None
  trained = models.staged_model(staged)
  assert trained.init is model.init
  ref = jax.grad(lambda p: model.loss(p, batch, None)[0])(params)
  out = jax.grad(lambda p: trained.loss(p, batch, None)[0])(params)
  assert _max_diff(out, ref) == 0
  shapes = models.activation_shapes(staged, params, batch)
  assert [s.shape for s in shapes] == [(4, 6)]


# -- the boundary's codecs -------------------------------------------------------

CODECS = ["quant:8", "quant:4:stochastic", "topk:0.25", "int8",
          "subspace:4", "subspace:4,quant:8", "cast:bf16"]


@pytest.mark.parametrize("forward,backward", [
    *((c, c) for c in CODECS), ("quant:4", "topk:0.1"), ("none", "int8"),
    ("subspace:8", "none")])
def test_boundary_sends_each_codecs_roundtrip(forward, backward):
  fc = transforms.parse_boundary_codec(forward, "f", 2)
  bc = transforms.parse_boundary_codec(backward, "b", 2)
  x = jax.random.normal(jax.random.key(1), (3, 8, 16))
  g = jax.random.normal(jax.random.key(2), (3, 8, 16))
  y, vjp = jax.vjp(lambda x: transforms.boundary(x, fc, bc, KEY, 5), x)
  (gx,) = vjp(g)

  def direct(codec, t, i):
    if codec is None:
      return t
    return transforms.roundtrip(codec, t, jax.random.fold_in(KEY, i), 5)

  np.testing.assert_array_equal(y, direct(fc, x, 0))
  np.testing.assert_array_equal(gx, direct(bc, g, 1))
  if fc is not None:
    assert not np.array_equal(y, x)  # the codec did something
  if bc is not None:
    assert not np.array_equal(gx, g)


def test_boundary_without_codecs_is_the_identity():
  x = jax.random.normal(KEY, (2, 3))
  assert transforms.boundary(x, None, None, KEY) is x


def test_boundary_under_vmap_and_jit_matches_per_worker_calls():
  q = transforms.parse_codec("quant:4:stochastic")
  x_W = jax.random.normal(jax.random.key(4), (3, 2, 8, 16))
  keys_W = jax.random.split(KEY, 3)

  def one(x, key, w):
    return jax.vjp(lambda x: transforms.boundary(x, q, q, key, w), x)

  def pulled(x, key, w):
    y, vjp = one(x, key, w)
    return y, vjp(x * 2.0)[0]

  y_W, g_W = jax.jit(jax.vmap(pulled))(x_W, keys_W, jnp.arange(3))
  single = jax.jit(pulled)
  for w in range(3):
    y, g = single(x_W[w], keys_W[w], w)
    np.testing.assert_array_equal(y_W[w], y)
    np.testing.assert_array_equal(g_W[w], g)


def test_staged_gradients_flow_through_the_backward_codec(gpt_and_params):
  """The staged model's gradient against one written here: stage 1's
  gradient for its input is compressed, then pulled through stage 0."""
  model, params = gpt_and_params
  batch = _batch()
  fc = transforms.parse_codec("quant:4")
  bc = transforms.parse_codec("topk:0.3")
  staged = models.split(model, 2)
  loss_fn = models.staged_loss(
      staged, transforms.stage_boundary([fc], [bc]))
  out = jax.grad(lambda p: loss_fn(p, batch, KEY)[0])(params)

  k = jax.random.fold_in(KEY, 0)  # boundary 0's key
  x, pull0 = jax.vjp(lambda p: staged.stages[0](p, None, batch), params)
  sent = transforms.roundtrip(fc, x, jax.random.fold_in(k, 0))
  _, pull1 = jax.vjp(lambda p, y: staged.stages[1](p, y, batch)[0],
                     params, sent)
  g1, g_sent = pull1(jnp.ones(()))
  (g0,) = pull0(transforms.roundtrip(bc, g_sent, jax.random.fold_in(k, 1)))
  ref = jax.tree.map(jnp.add, g0, g1)
  assert _max_diff(out, ref) < 1e-6
  plain = jax.grad(lambda p: model.loss(p, batch, None)[0])(params)
  assert _max_diff(out, plain) > 1e-4  # the codecs changed the gradient


def _identity():
  return transforms.make_codec(
      "identity", lambda x, key, worker: {"values": x},
      lambda payload, key: payload.data["values"])


@pytest.mark.parametrize("codec", [None, "identity"])
def test_identity_codec_trains_bit_for_bit_as_the_unsplit_model(
    gpt_and_params, codec):
  model, params = gpt_and_params
  codec = _identity() if codec else None
  staged = models.split(model, 4)
  fn = transforms.stage_boundary([codec] * 3, [codec] * 3)
  tx = optax.adam(1e-2)

  def train(loss):
    @jax.jit
    def step(p, s, batch):
      g = jax.grad(lambda p: loss(p, batch, KEY)[0])(p)
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    p, s = params, tx.init(params)
    for i in range(3):
      p, s = step(p, s, _batch(seed=i))
    return p

  ref = train(model.loss)
  out = train(models.staged_loss(staged, fn))
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(a, b)


def test_quantized_boundaries_still_train(gpt_and_params):
  model, params = gpt_and_params
  q = transforms.parse_codec("quant:8")
  loss = models.staged_loss(models.split(model, 2),
                            transforms.stage_boundary([q], [q]))
  batch = _batch()
  grad = jax.jit(jax.value_and_grad(lambda p: loss(p, batch, KEY)[0]))
  first, _ = grad(params)
  for _ in range(20):
    value, g = grad(params)
    params = jax.tree.map(lambda p, g: p - 0.5 * g, params, g)
  assert float(value) < float(first) - 0.2


# -- subspace --------------------------------------------------------------------

def test_subspace_is_an_orthogonal_projection():
  x = jax.random.normal(KEY, (5, 16))
  codec = transforms.subspace(4, seed=1)
  payload = codec.encode(x)
  assert payload.data["values"].shape == (5, 4)
  y = transforms.roundtrip(codec, x)
  # P P^T is a projection: idempotent, and x - y is orthogonal to y.
  np.testing.assert_allclose(transforms.roundtrip(codec, y), y, atol=1e-5)
  np.testing.assert_allclose((y * (x - y)).sum(-1), 0, atol=1e-5)
  # A full-rank basis keeps everything; another seed another subspace.
  full = transforms.roundtrip(transforms.subspace(16), x)
  np.testing.assert_allclose(full, x, atol=1e-5)
  other = transforms.roundtrip(transforms.subspace(4, seed=2), x)
  assert not np.allclose(other, y)
  # The same spec at another boundary draws another basis.
  a = transforms.parse_boundary_codec("subspace:4", "f", 0)
  b = transforms.parse_boundary_codec("subspace:4", "f", 1)
  assert not np.allclose(transforms.roundtrip(a, x),
                         transforms.roundtrip(b, x))


@pytest.mark.parametrize("spec,match", [
    ("subspace:0", "R >= 1"), ("subspace:x", "integer"),
    ("quant:8,subspace:4", "first stage"), ("subspace:4,bogus:1", "bogus"),
    ("", "codec spec")])
def test_boundary_codec_spec_errors_name_the_field(spec, match):
  with pytest.raises(ConfigError, match=f"boundary_codec.*{match}"):
    transforms.parse_boundary_codec(spec, "boundary_codec")


def test_subspace_rank_above_the_width_is_an_error():
  with pytest.raises(ConfigError, match="subspace rank.*at most.*16"):
    transforms.subspace(32).encode(jnp.ones((2, 16)))


# -- bytes -----------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["none", *CODECS, "topk:0.1,quant:4"])
def test_boundary_bytes_are_the_codecs_message_bytes(spec):
  shape = (2, 8, 16)
  codec = transforms.parse_boundary_codec(spec, "f", 0)
  comp = _compression.compression(codec, None) if codec else (
      _compression.compression(None, None))
  expect = _compression.message_bytes(
      comp, jax.ShapeDtypeStruct(shape, jnp.float32))
  assert transforms.boundary_bytes(codec, codec, shape) == (expect, expect)
  assert transforms.boundary_bytes(None, codec, shape) == (4 * 256, expect)


@pytest.mark.parametrize("spec,formula", [
    ("none", lambda n, d: 4 * n),
    ("cast:bf16", lambda n, d: 2 * n),
    ("subspace:4", lambda n, d: 4 * (n // d) * 4),
    # k = round(0.25 n) float32 values and flat indices: uint8 for n <= 256,
    # else uint16 (n <= 65536)
    ("topk:0.25", lambda n, d: round(0.25 * n) * (4 + (1 if n <= 256 else 2))),
])
def test_boundary_bytes_against_the_formula(spec, formula):
  codec = transforms.parse_boundary_codec(spec, "f", 0)
  for shape in [(2, 8, 16), (4, 8, 32)]:
    n = int(np.prod(shape))
    assert transforms.boundary_bytes(codec, None, shape)[0] == formula(
        n, shape[-1])


def test_boundary_bytes_of_a_split_gpts_activation(gpt_and_params):
  model, params = gpt_and_params
  staged = models.split(model, 2)
  (shape,) = models.activation_shapes(staged, params, _batch(b=2))
  assert shape.shape == (2, SIZES["seq_len"], SIZES["d_model"])
  codec = transforms.parse_codec("cast:bf16")
  assert transforms.boundary_bytes(codec, None, shape.shape) == (
      2 * 2 * 8 * 16, 4 * 2 * 8 * 16)
  with pytest.raises(ConfigError, match="shape"):
    transforms.boundary_bytes(None, None, (2, 0))


# -- stages as a run's settings --------------------------------------------------

def _config(tmp_path, **kw):
  (tmp_path / "a.txt").write_text("hello world, the quick brown fox. " * 300)
  return lowbw.Config(**{
      **dict(model="gpt", layers=2, d_model=16, heads=2, seq_len=8,
             data="text", data_root=str(tmp_path), strategy="ddp",
             workers=2, batch_size=2, steps=3, progress=False), **kw})


def test_a_runs_model_is_the_staged_model_with_its_codecs(tmp_path):
  from lowbw.simulation._api import engine_config
  model = engine_config(_config(tmp_path)).model
  batch = {"tokens": np.random.default_rng(0).integers(0, 256, (2, 9))}
  params = model.init(jax.random.key(0), batch)
  staged = models.split(model, 2)
  for settings, forward, backward in [
      ({"stages": 2}, None, None),
      ({"stages": 2, "boundary_codec": "quant:8"}, "quant:8", "quant:8"),
      ({"stages": 2, "boundary_codec": "subspace:4",
        "boundary_grad_codec": "int8"}, "subspace:4", "int8")]:
    built = engine_config(_config(tmp_path, **settings)).model
    assert built.config == model.config and built.init is not None
    assert built.pooled is (forward is None)
    f = [transforms.parse_boundary_codec(forward or "none", "f", 0)]
    b = [transforms.parse_boundary_codec(backward or "none", "b", 0)]
    ref = models.staged_loss(staged, transforms.stage_boundary(f, b))
    out_g = jax.grad(lambda p: built.loss(p, batch, KEY)[0])(params)
    ref_g = jax.grad(lambda p: ref(p, batch, KEY)[0])(params)
    assert _max_diff(out_g, ref_g) == 0


# A pipeline run (3 stages, 2 micro-batches, links of their own) and the
# same run unsplit, each run once for the module.
PIPE = dict(layers=3, stages=3, batch_size=4, micro_batches=2,
            boundary_codec="quant:8", stage_bandwidth="100Mbps,1Gbps",
            stage_latency="1ms")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("text")
  plain = lowbw.simulate(_config(root, layers=3, batch_size=4, log_every=1))
  piped = lowbw.simulate(_config(root, **PIPE, log_every=1,
                                 out=str(root / "piped")))
  return plain, piped


def test_a_staged_run_trains_through_its_boundary_codecs(runs):
  plain, staged = (r.history["train_loss"] for r in runs)
  assert np.all(np.isfinite(staged)) and not np.array_equal(staged, plain)
  np.testing.assert_allclose(staged, plain, atol=0.01)  # 8 bits: close


def test_boundary_bytes_are_in_the_ledger(runs):
  """stage_bytes: each step, both directions of every hop for every
  micro-batch, per worker; apart from the strategy's bytes."""
  plain, piped = runs
  q8 = transforms.parse_codec("quant:8")
  per_micro = sum(transforms.boundary_bytes(q8, q8, (4 // 2, 8, 16)))
  hops, micro = 2, 2
  steps = piped.history["step"]
  np.testing.assert_array_equal(piped.history["stage_bytes"],
                                steps * hops * micro * per_micro)
  assert piped.summary["stage_bytes"] == 3 * hops * micro * per_micro
  assert "stage_bytes" not in plain.history
  assert "stage_bytes" not in plain.summary
  np.testing.assert_array_equal(piped.history["payload_bytes"],
                                plain.history["payload_bytes"])


def test_a_pipeline_steps_on_its_schedules_clock(runs):
  """The clock's step is the pipeline's makespan: each stage's FLOPs (its
  blocks, the head on the last) on the hardware, a third forward, two
  thirds backward, per micro-batch; each hop its bytes over its bandwidth
  plus its latency; the 1F1B timeline of them, against the unsplit run's
  whole-model step (the same all-reduces in both)."""
  plain, piped = runs
  config = models.gpt(layers=3, d_model=16, heads=2, seq_len=8,
                      vocab=256).config
  block = (models.gpt_flops_per_token({**config, "layers": 2})
           - models.gpt_flops_per_token({**config, "layers": 1}))
  head = models.gpt_flops_per_token(config) - 3 * block
  stage_flops = [block, block, block + head]
  tokens = 4 * 8  # a worker's batch of 4 windows of 8 tokens
  peak = lowbw.network.hardware("h100")
  seconds = [f * tokens / (peak.flops * peak.mfu) for f in stage_flops]
  q8 = transforms.parse_codec("quant:8")
  fwd, bwd = transforms.boundary_bytes(q8, q8, (2, 8, 16))
  hops = [(8 * n / bw, 1e-3) for bw in (100e6, 1e9) for n in (fwd, bwd)]
  t = lowbw.network.timeline(
      [s / 2 / 3 for s in seconds], [2 * s / 2 / 3 for s in seconds],
      hops[0::2], hops[1::2], 2, "1f1b")
  whole = sum(seconds)
  extra = piped.history["sim_time_s"] - plain.history["sim_time_s"]
  np.testing.assert_allclose(extra, piped.history["step"] * (
      t.makespan_s - whole), rtol=1e-4)
  assert piped.summary["pipeline_bubble"] == pytest.approx(t.bubble)
  assert 0 < t.bubble < 1 and "pipeline_bubble" not in plain.summary


def test_retime_keeps_the_pipeline(runs, tmp_path):
  """The ledger keeps the run's pipeline: re-timed on its own network the
  run takes its own time, not the unsplit model's."""
  plain, piped = runs
  net = _config(tmp_path, **PIPE).built().checked["network"]
  again = lowbw.retime(piped.summary["log_dir"], net)
  np.testing.assert_allclose(again["sim_time_s"], piped.summary["sim_time_s"],
                             rtol=1e-5)
  assert abs(again["sim_time_s"] - plain.summary["sim_time_s"]) > 1e-3


def test_micro_batches_equal_the_unsplit_model_through_an_identity_codec(
    gpt_and_params):
  model, params = gpt_and_params
  batch = _batch(b=4)
  codec = _identity()
  loss = models.staged_loss(models.split(model, 2),
                            transforms.stage_boundary([codec], [codec]), 2)
  ref, ref_g = jax.jit(jax.value_and_grad(
      lambda p: model.loss(p, batch, None), has_aux=True))(params)
  out, out_g = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      params, batch, KEY)
  np.testing.assert_allclose(out[0], ref[0], rtol=1e-6)
  np.testing.assert_allclose(out[1]["accuracy"], ref[1]["accuracy"])
  assert _max_diff(out_g, ref_g) < 1e-6


def test_each_micro_batch_crosses_the_codecs_on_its_own(gpt_and_params):
  """Top-k keeps the k largest of each micro-batch's activations: the
  loss is the mean of two half-batches' staged losses, each with its own
  key, not the whole batch's."""
  model, params = gpt_and_params
  batch = _batch(b=4)
  staged = models.split(model, 2)
  top = transforms.parse_codec("topk:0.1")
  fn = transforms.stage_boundary([top], [top])
  one = jax.jit(models.staged_loss(staged, fn))
  micro = jax.jit(models.staged_loss(staged, fn, micro_batches=2))
  halves = [one(params, {"tokens": batch["tokens"][2 * m:2 * m + 2]},
                jax.random.fold_in(KEY, m))[0] for m in range(2)]
  out = micro(params, batch, KEY)
  np.testing.assert_allclose(out[0], np.mean(halves), rtol=1e-6)
  whole = one(params, batch, KEY)[0]
  assert abs(float(out[0]) - float(whole)) > 1e-4
  # An evaluation batch M does not divide goes through whole.
  odd = _batch(b=3)
  np.testing.assert_allclose(micro(params, odd, KEY)[0],
                             one(params, odd, KEY)[0], rtol=1e-6)


def test_stage_flops_sum_to_the_models(gpt_and_params):
  model, _ = gpt_and_params
  for stages in (1, 2, 3, 4):
    parts = models.stage_flops_per_token(model.config, stages)
    assert len(parts) == stages
    assert sum(parts) == models.gpt_flops_per_token(model.config)
  two = models.stage_flops_per_token(model.config, 2)
  assert two[1] - two[0] == (models.gpt_flops_per_token(model.config)
                             - 2 * two[0])  # the head, on the last stage


def test_the_runs_pipeline_per_hop(tmp_path):
  from lowbw.simulation._api import engine_config
  p = engine_config(_config(tmp_path, **PIPE)).pipeline
  q8 = transforms.parse_codec("quant:8")
  assert p.forward_bytes == p.backward_bytes == (
      transforms.boundary_bytes(q8, q8, (2, 8, 16))[0],) * 2
  assert p.bandwidth == (100e6, 1e9) and p.latency == (1e-3, 1e-3)
  assert (p.micro_batches, p.schedule) == (2, "1f1b")
  free = engine_config(_config(tmp_path, layers=3, stages=3,
                               pipeline_schedule="gpipe")).pipeline
  assert free.bandwidth == (math.inf,) * 2 and free.latency == (0.0,) * 2
  assert free.forward_bytes == (4 * 2 * 8 * 16,) * 2  # float32, b=2
  assert free.schedule == "gpipe" and free.micro_batches == 1
  assert engine_config(_config(tmp_path)).pipeline is None


@pytest.mark.parametrize("settings,match", [
    ({"stages": 3}, "stages=3 is invalid.*at most layers=2"),
    ({"boundary_codec": "quant:8"}, "boundary_codec.*needs stages >= 2"),
    ({"stages": 2, "boundary_codec": "subspace:0"}, "boundary_codec.*R >= 1"),
    ({"stages": 2, "boundary_grad_codec": "quant:x"}, "boundary_grad_codec"),
    ({"stages": 2, "boundary_codec": "subspace:32"}, "subspace rank"),
    ({"stages": 2, "micro_batches": 3},
     "micro_batches=3.*must divide batch_size=2"),
    ({"stages": 2, "micro_batches": 0}, "micro_batches"),
    ({"micro_batches": 2}, "micro_batches=2.*needs stages >= 2"),
    ({"pipeline_schedule": "gpipe"}, "pipeline_schedule.*needs stages >= 2"),
    ({"stage_bandwidth": "1Gbps"}, "stage_bandwidth.*needs stages >= 2"),
    ({"stage_latency": "5ms"}, "stage_latency.*needs stages >= 2"),
    ({"stages": 2, "pipeline_schedule": "zb"}, "pipeline_schedule.*1f1b"),
    ({"stages": 2, "stage_bandwidth": "1Gbps,2Gbps"},
     "stage_bandwidth.*one per hop, 1"),
    ({"stages": 2, "stage_latency": "fast"}, "stage_latency"),
    ({"stages": 2, "micro_batches": 2, "minibatch_size": 1},
     "micro_batches=2.*expected 1 with minibatch_size=1"),
    ({"stages": 2, "stage_latency": "1ms", "clock": False},
     "stage_latency.*not used: with clock=False"),
])
def test_bad_stage_settings_name_the_field(tmp_path, settings, match):
  with pytest.raises(ConfigError, match=match):
    lowbw.build(_config(tmp_path, **settings))


@pytest.mark.parametrize("field,value", [
    ("stages", 2), ("micro_batches", 2), ("pipeline_schedule", "gpipe"),
    ("stage_bandwidth", "1Gbps"), ("stage_latency", "1ms")])
def test_stages_belong_to_the_gpt(field, value):
  with pytest.raises(ConfigError, match=f"{field}.*not used by model 'mlp'"):
    lowbw.Config(model="mlp", data="digits", **{field: value})


def test_a_staged_model_with_codecs_is_never_pooled():
  """Each worker's activations are compressed as its own stages send them:
  a staged model with boundary codecs, however it is made (here in
  Python, not through the config), must not score W workers' batches as
  one; without codecs it pools as the unsplit model does."""
  model = models.gpt(**SIZES)
  q = transforms.parse_boundary_codec("quant:8", "f", 0)
  coded = models.staged_model(models.split(model, 2),
                              transforms.stage_boundary([q], [q]))
  assert not coded.pooled
  plain = models.staged_model(models.split(model, 2))
  assert plain.pooled == model.pooled


def test_train_prints_the_pipelines_line():
  from lowbw.cli._train import _pipeline_lines
  s = {"stages": 3, "micro_batches": 4, "pipeline_schedule": None}
  line, = _pipeline_lines({"stage_bytes": 12_300, "pipeline_bubble": 0.25}, s)
  assert line.split() == ["pipeline", "3", "stages,", "4", "micro-batches",
                          "(1f1b):", "12.3", "KB", "between", "stages", "per",
                          "worker,", "bubble", "25.0%", "of", "a", "step"]
  assert _pipeline_lines({"stage_bytes": None}, s) == []
  assert _pipeline_lines({"stage_bytes": 10}, s)[0].endswith("per worker")


# -- mixed fleets: some workers pipelines, the others whole models --------------

def _worker_grads_reference(staged, codecs, whole, params, batch_W, keys_W,
                            pipes):
  """A plain loop over workers: a pipeline worker's loss through the
  boundary codecs, every other worker's the unsplit model's."""
  out = []
  for w in range(batch_W["tokens"].shape[0]):
    batch = {"tokens": batch_W["tokens"][w]}
    if w in pipes:
      loss = models.staged_loss(staged, transforms.stage_boundary(*codecs))
    else:
      loss = whole.loss
    out.append(jax.grad(lambda p: loss(p, batch, keys_W[w])[0])(params))
  return out


@pytest.mark.parametrize("pipes", [(0,), (1, 2)])
def test_only_a_mixed_fleets_pipelines_send_through_the_codecs(tmp_path,
                                                               pipes):
  """The run's model on the workers' vmapped axis (as the engine computes
  every worker's gradient) against a per-worker loop: the pipeline
  workers' gradients go through quant:4 both ways, the others' are the
  unsplit model's."""
  from lowbw.simulation._api import engine_config
  from lowbw.transforms._codec import WORKER_AXIS
  built = engine_config(_config(
      tmp_path, workers=3, stages=2, boundary_codec="quant:4",
      pipeline_workers=",".join(map(str, pipes)) + ",")).model
  whole = engine_config(_config(tmp_path, workers=3)).model
  rng = np.random.default_rng(1)
  batch_W = {"tokens": rng.integers(0, 256, (3, 2, 9))}
  params = built.init(jax.random.key(0), {"tokens": batch_W["tokens"][0]})
  keys_W = jax.random.split(jax.random.key(5), 3)
  grad = jax.grad(lambda p, b, k: built.loss(p, b, k)[0])
  out = jax.vmap(grad, in_axes=(None, 0, 0), axis_name=WORKER_AXIS)(
      params, batch_W, keys_W)
  q4 = [transforms.parse_boundary_codec("quant:4", "f", 0)]
  ref = _worker_grads_reference(models.split(whole, 2), (q4, q4), whole,
                                params, batch_W, keys_W, pipes)
  for w in range(3):
    got = jax.tree.map(lambda g: g[w], out)
    assert _max_diff(got, ref[w]) < 1e-6, w
    plain = jax.grad(lambda p: whole.loss(
        p, {"tokens": batch_W["tokens"][w]}, keys_W[w])[0])(params)
    assert (_max_diff(got, plain) > 1e-4) is (w in pipes), w


@pytest.fixture(scope="module")
def mixed_runs(tmp_path_factory):
  """Three workers, the first a 2-stage pipeline with full-rank subspace
  codecs (an orthonormal basis of all 16 dimensions: the identity to float
  rounding), against the same run with every worker a whole model."""
  root = tmp_path_factory.mktemp("mixed")
  common = dict(workers=3, batch_size=4, log_every=1, hardware="1s")
  plain = lowbw.simulate(_config(root, **common))
  mixed = lowbw.simulate(_config(
      root, **common, stages=2, boundary_codec="subspace:16",
      micro_batches=2, pipeline_workers=1))
  return plain, mixed


def test_a_mixed_fleet_with_identity_codecs_trains_as_whole_models(
    mixed_runs):
  plain, mixed = mixed_runs
  np.testing.assert_allclose(mixed.history["train_loss"],
                             plain.history["train_loss"], rtol=1e-5)
  np.testing.assert_allclose(mixed.summary["final_eval_loss"],
                             plain.summary["final_eval_loss"], rtol=1e-5)


def test_a_mixed_fleets_stage_bytes_are_its_pipelines(mixed_runs):
  """stage_bytes: each pipeline worker's (the whole-model workers send
  none), and the summary names the pipeline workers."""
  _, mixed = mixed_runs
  sub = transforms.parse_boundary_codec("subspace:16", "f", 0)
  per_micro = sum(transforms.boundary_bytes(sub, sub, (2, 8, 16)))
  np.testing.assert_array_equal(mixed.history["stage_bytes"],
                                mixed.history["step"] * 2 * per_micro)
  assert mixed.summary["pipeline_workers"] == [0]


def test_a_mixed_fleets_clock_steps_each_worker_at_its_own_time(tmp_path):
  """A pipeline worker's step is its schedule's makespan, a whole-model
  worker's the whole model's compute on its machine, each divided by the
  worker's speed."""
  from lowbw.network import _clock, _pipeline
  from lowbw.simulation._api import engine_config
  config = _config(tmp_path, workers=3, stages=2, boundary_codec="quant:8",
                   micro_batches=2, pipeline_workers="0,2",
                   hardware="1s", speeds="1,1,0.5", stage_bandwidth="10Mbps")
  c = engine_config(config)
  assert c.pipeline.workers == (0, 2)
  net = config.built().checked["network"]
  pricing = _clock.price(net, {}, 3, 1000, 1.0, pipeline=c.pipeline)
  t = _pipeline.step_timeline(c.pipeline, 1.0)
  assert t.makespan_s != pytest.approx(1.0)
  host = net.profile.host_s
  assert pricing.worker_step_s == pytest.approx(
      (t.makespan_s + host, 1.0 + host, t.makespan_s + host))
  p = _clock.net_params(net, 3, pricing, 0)
  np.testing.assert_allclose(p.step_s_W, [t.makespan_s + host, 1.0 + host,
                                          (t.makespan_s + host) / 0.5],
                             rtol=1e-6)
  every = engine_config(_config(tmp_path, workers=3, stages=2,
                                micro_batches=2)).pipeline
  assert every.workers is None
  assert _clock.price(net, {}, 3, 1000, 1.0,
                      pipeline=every).worker_step_s is None


@pytest.mark.parametrize("settings,match", [
    ({"pipeline_workers": 0}, "pipeline_workers=0.*count from 1 to the 2"),
    ({"pipeline_workers": 3}, "pipeline_workers=3.*count from 1 to the 2"),
    ({"pipeline_workers": "0,5"}, "pipeline_workers.*worker 5 is not one of"),
    ({"pipeline_workers": "1,1"}, "pipeline_workers.*each worker once"),
    ({"pipeline_workers": [0]}, "pipeline_workers.*not a list"),
    ({"pipeline_workers": "first"}, "pipeline_workers.*count N"),
    ({"pipeline_workers": 1, "worker_batch": 1},
     "worker_batch=1.*mixed fleet"),
])
def test_bad_pipeline_workers_name_the_field(tmp_path, settings, match):
  with pytest.raises(ConfigError, match=match):
    lowbw.build(_config(tmp_path, stages=2, boundary_codec="quant:8",
                        **settings))


def test_pipeline_workers_need_stages(tmp_path):
  with pytest.raises(ConfigError,
                     match="pipeline_workers=1.*needs stages >= 2"):
    lowbw.build(_config(tmp_path, pipeline_workers=1))
