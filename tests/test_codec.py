"""The codec contract shared by every codec: payloads and their exact bytes,
chaining, text specs, collectives, trees, the optax wrapper, and a registry
run under jit, vmap and lax.scan."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from lowbw.transforms import (Codec, Payload, cast, chain, collective,
                              compress, dct_top_k, decode_tree, encode_tree,
                              parse_codec, payload_nbytes, per_worker,
                              quantize, random_k, roundtrip, sign, top_k)

REGISTRY = {
    "topk": top_k(0.25),
    "quant:8:chunk": quantize(8, chunk=5),
    "quant:statistical": quantize(4, "statistical", chunk=8),
    "quant:stochastic": quantize(2, stochastic=True),
    "sign": sign(),
    "cast:bf16": cast("bf16"),
    "dct": dct_top_k(4, 3),
    "randk|cast": random_k(0.5) | cast("bf16"),
    "topk|cast|quant:stochastic": (top_k(0.5) | cast("bf16")
                                   | quantize(2, stochastic=True)),
    "dct|quant:statistical": dct_top_k(4, 3) | quantize(8, "statistical"),
}

W = 3


def _tree(seed=0, lead=()):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(size=lead + (6, 8)), jnp.float32),
          "b": [jnp.asarray(rng.normal(size=lead + (5,)), jnp.float32)]}


def _leaf_bytes(tree):
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


# --- registry: jit, vmap, scan ------------------------------------------------


@pytest.mark.parametrize("name", list(REGISTRY))
def test_registry_under_jit_vmap_and_scan(name):
  codec = REGISTRY[name]
  # one leaf keeps compilation short; trees are tested below
  tree_W = {"w": _tree(lead=(W,))["w"]}
  key = jax.random.key(42)

  def program(tree_W, key):
    def step(carry, t):
      step_key = jax.random.fold_in(key, t)
      out_W = jax.vmap(lambda x, w: roundtrip(codec, x, step_key, w))(
          tree_W, jnp.arange(W))
      return carry + 1, out_W

    outs = jax.lax.scan(step, 0, jnp.arange(2))[1]
    # step 0 again, one worker after the other (a sequential loop, no vmap)
    loop = jax.lax.map(
        lambda xw: roundtrip(codec, xw[0], jax.random.fold_in(key, 0), xw[1]),
        (tree_W, jnp.arange(W)))
    one = jax.tree.map(lambda x: x[0], tree_W)
    return outs, loop, encode_tree(codec, one, key, 0)

  outs, loop, payload = jax.jit(program)(tree_W, key)
  chex.assert_tree_shape_prefix(outs, (2, W))
  chex.assert_trees_all_equal_shapes_and_dtypes(
      jax.tree.map(lambda x: x[0], outs), tree_W)
  for leaf in jax.tree.leaves(outs):
    assert np.all(np.isfinite(np.asarray(leaf))), name
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[0], outs), loop,
                              atol=1e-6)
  if codec.needs_key:  # a new key every step
    assert not np.array_equal(outs["w"][0], outs["w"][1])
  # payloads: static shape and dtype ride along; real bytes == predicted bytes
  payloads = jax.tree.leaves(payload, is_leaf=lambda p: isinstance(p, Payload))
  assert [(p.shape, p.dtype) for p in payloads] == [((6, 8), "float32")]
  one = jax.tree.map(lambda x: x[0], tree_W)
  assert _leaf_bytes(payload) == payload_nbytes(codec, one)


def test_empty_leaves():
  shapes = [(0,), (3, 0), (0, 5)]
  key = jax.random.key(0)
  for codec in [*REGISTRY.values(), random_k(0.1), dct_top_k()]:
    for shape in shapes:
      x = jax.ShapeDtypeStruct(shape, jnp.float32)
      out = jax.eval_shape(lambda x: roundtrip(codec, x, key), x)
      assert out.shape == shape, codec.name
  for codec in (top_k(0.1), random_k(0.1), cast(), dct_top_k()):
    # nothing to send
    assert payload_nbytes(codec, jax.ShapeDtypeStruct((3, 0), jnp.float32)) == 0
  outs = jax.jit(lambda xs: [roundtrip(c, x, key) for x in xs
                             for c in (random_k(0.5), dct_top_k(4, 2))])(
                                 [jnp.zeros(s) for s in shapes])
  assert [o.shape for o in outs] == [s for s in shapes for _ in range(2)]


def test_second_call_does_not_recompile():
  codec = top_k(0.5) | quantize(2, stochastic=True)
  run = jax.jit(lambda x, key: roundtrip(codec, x, key))
  x = jnp.arange(12.0)
  a = run(x, jax.random.key(0))
  b = run(x + 1, jax.random.key(1))
  assert run._cache_size() == 1
  assert not np.array_equal(np.asarray(a) + 1, np.asarray(b))


def test_shared_key_same_positions_private_noise_per_worker():
  x = jnp.asarray(np.random.default_rng(0).normal(size=40), jnp.float32)
  x_W = jnp.broadcast_to(x, (4, 40))  # every worker holds the same tensor
  key = jax.random.key(7)
  rk, sq = random_k(0.2), quantize(2, stochastic=True)

  def run(x_W):
    workers = jnp.arange(4)
    randk_W = jax.vmap(lambda x, w: roundtrip(rk, x, key, w))(x_W, workers)
    quant_W = jax.vmap(lambda x, w: roundtrip(sq, x, key, w))(x_W, workers)
    return randk_W, quant_W

  randk_W, quant_W = jax.jit(run)(x_W)
  one = jax.jit(lambda x, w: roundtrip(sq, x, key, w))
  loop = [one(x_W[w], w) for w in range(4)]
  kept = np.asarray(randk_W) != 0
  assert kept.sum(axis=1).tolist() == [8] * 4
  assert np.all(kept == kept[0])  # same positions on every worker
  quant_W = np.asarray(quant_W)
  for w in range(1, 4):  # different rounding noise on every worker
    assert not np.array_equal(quant_W[w], quant_W[0])
  np.testing.assert_array_equal(quant_W, np.stack(loop))


# --- chaining -----------------------------------------------------------------


def test_topk_then_quant_against_numpy():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(10, 10)).astype(np.float32)
  codec = top_k(0.2) | quantize(4)
  payload, out = jax.jit(lambda x: (codec.encode(x), roundtrip(codec, x)))(
      jnp.asarray(x))
  flat = x.reshape(-1)
  kept = np.argsort(-np.abs(flat))[:20]
  inner = payload.data["values"]
  assert isinstance(inner, Payload) and inner.shape == (20,)
  assert set(inner.data) == {"codes", "min", "max"}
  assert inner.data["codes"].shape == (10,)  # 20 codes of 4 bits
  np.testing.assert_array_equal(np.sort(payload.data["indices"]), np.sort(kept))
  values = flat[kept]
  step = (values.max() - values.min()) / 15
  out = np.asarray(out).reshape(-1)
  rest = np.setdiff1d(np.arange(100), kept)
  np.testing.assert_array_equal(out[rest], 0.0)
  assert np.abs(out[kept] - values).max() <= step / 2 + 1e-6
  assert not np.array_equal(out[kept], values)  # it did quantize


def test_three_stage_chains_nest_either_way():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(8, 8)).astype(np.float32)
  left = (top_k(0.25) | cast("bf16")) | quantize(4)  # what `a | b | c` builds
  right = top_k(0.25) | (cast("bf16") | quantize(4))
  assert left.name == right.name == "topk:0.25,cast:bfloat16,quant:4"
  assert left.config == right.config
  out_left, out_right = jax.jit(lambda x: (roundtrip(left, x),
                                           roundtrip(right, x)))(x)
  np.testing.assert_array_equal(out_left, out_right)
  # numpy: top 16 by magnitude, rounded to bf16, then 4-bit min-max levels
  flat = x.reshape(-1)
  kept = np.argsort(-np.abs(flat))[:16]
  values = flat[kept].astype(ml_dtypes.bfloat16).astype(np.float64)
  step = (values.max() - values.min()) / 15
  out = np.asarray(out_left).reshape(-1)
  assert np.abs(out[kept] - values).max() <= step / 2 + 1e-6
  np.testing.assert_array_equal(np.delete(out, kept), 0.0)
  shape = jax.ShapeDtypeStruct((8, 8), jnp.float32)
  assert payload_nbytes(left, shape) == payload_nbytes(right, shape) == (
      16 * 1 + 8 + 8)


def test_chain_attributes():
  c = top_k(0.1) | quantize(4)
  assert c.name == "topk:0.1,quant:4"
  assert c.config == {"chain": [top_k(0.1).config, quantize(4).config]}
  assert not c.summable and not c.carries_values and not c.needs_key
  c3 = top_k(0.5) | cast("bf16") | quantize(2, stochastic=True)
  assert c3.config["chain"] == [top_k(0.5).config, cast("bf16").config,
                                quantize(2, stochastic=True).config]
  assert c3.needs_key
  assert (random_k(0.1) | cast("fp16")).summable
  assert chain(random_k(0.1), cast("fp16")).name == "randk:0.1,cast:float16"
  assert (cast("fp16") | top_k(0.5)).carries_values


@pytest.mark.parametrize("first,second", [
    (quantize(4), top_k(0.1)), (sign(), top_k(0.1)), (quantize(2), cast()),
    (top_k(0.1) | quantize(4), cast())])
def test_chain_needs_values_first(first, second):
  with pytest.raises(ValueError, match="codec") as info:
    first | second
  assert first.name in str(info.value)


def test_chain_rejects_non_codecs():
  with pytest.raises(ValueError, match="codec second"):
    chain(top_k(0.1), "quant:4")
  with pytest.raises(ValueError, match="codec first"):
    chain(None, top_k(0.1))


def test_key_none_is_rejected_where_a_key_is_needed():
  for codec in (random_k(0.5), top_k(0.5) | random_k(0.5),
                random_k(0.5) | cast(),
                top_k(0.5) | quantize(2, stochastic=True)):
    with pytest.raises(ValueError, match="key"):
      roundtrip(codec, jnp.ones(8))
  payload = jax.eval_shape(random_k(0.5).encode, jnp.ones(8),
                           jax.random.key(0))
  with pytest.raises(ValueError, match="key"):
    random_k(0.5).decode(payload)


# --- payload bytes ------------------------------------------------------------


def _idx(n):
  return 1 if n <= 256 else 2 if n <= 65536 else 4


def _k(n, f):
  return min(n, max(1, round(f * n)))


def _dct_blocks(shape, chunk, k):
  """(blocks, coefficients kept per block, coefficients per block)."""
  rows, cols = (1, 1) if not shape else (math.prod(shape[:-1]), shape[-1])

  def side(n):
    return max(d for d in range(1, min(n, chunk) + 1) if n % d == 0)

  br, bc = side(rows), side(cols)
  return (rows // br) * (cols // bc), min(k, br * bc), br * bc


def _dct_bytes(shape, chunk, k):
  blocks, kept, size = _dct_blocks(shape, chunk, k)
  return blocks * kept * (4 + _idx(size))


def _dct_quant8_bytes(shape, chunk, k):
  blocks, kept, size = _dct_blocks(shape, chunk, k)
  return blocks * kept * _idx(size) + blocks * kept + 8


SHAPES = [(), (7,), (5, 13), (300,), (3, 4, 50), (300, 300)]

FORMULAS = {
    "topk:0.1": lambda n, s: _k(n, 0.1) * (4 + _idx(n)),
    "topk:1": lambda n, s: n * (4 + _idx(n)),
    "randk:0.3": lambda n, s: 4 * _k(n, 0.3),
    "quant:1": lambda n, s: math.ceil(n / 8) + 8,
    "quant:2:chunk=16": lambda n, s: math.ceil(n / 4) + 8 * math.ceil(n / 16),
    "quant:4": lambda n, s: math.ceil(n / 2) + 8,
    "quant:8:stochastic:chunk=64": lambda n, s: n + 8 * math.ceil(n / 64),
    "quant:2:statistical": lambda n, s: math.ceil(n / 4) + 4 * 4,
    "quant:4:statistical:chunk=16": (
        lambda n, s: math.ceil(n / 2) + 4 * 16 * math.ceil(n / 16)),
    # the authors' grid: a centred codebook plus the mean
    "quant:2:statistical:muloco": lambda n, s: math.ceil(n / 4) + 4 * 4 + 4,
    "sign": lambda n, s: math.ceil(n / 8) + 4,
    "cast:bf16": lambda n, s: 2 * n,
    "cast:float32": lambda n, s: 4 * n,
    "cast:fp8": lambda n, s: n,
    "dct": lambda n, s: _dct_bytes(s, 64, 32),
    "dct:4:3": lambda n, s: _dct_bytes(s, 4, 3),
    "topk:0.1,quant:4": (
        lambda n, s: _k(n, 0.1) * _idx(n) + math.ceil(_k(n, 0.1) / 2) + 8),
    "topk:0.2,quant:2:statistical:chunk=4": (
        lambda n, s: _k(n, 0.2) * _idx(n) + math.ceil(_k(n, 0.2) / 4)
        + 16 * math.ceil(_k(n, 0.2) / 4)),
    "topk:0.1,cast:bf16": lambda n, s: _k(n, 0.1) * (2 + _idx(n)),
    "topk:0.1,cast:bf16,quant:4": (
        lambda n, s: _k(n, 0.1) * _idx(n) + math.ceil(_k(n, 0.1) / 2) + 8),
    "randk:0.1,cast:bf16": lambda n, s: 2 * _k(n, 0.1),
    "randk:0.5,quant:1": lambda n, s: math.ceil(_k(n, 0.5) / 8) + 8,
    "dct:8:5,quant:8": lambda n, s: _dct_quant8_bytes(s, 8, 5),
}


@pytest.mark.parametrize("spec", list(FORMULAS))
def test_payload_bytes_closed_form(spec):
  codec = parse_codec(spec)
  for shape in SHAPES:
    n = math.prod(shape)
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    assert payload_nbytes(codec, x) == FORMULAS[spec](n, shape), (spec, shape)


def test_payload_bytes_trees_and_raw():
  tree = {"a": jax.ShapeDtypeStruct((3, 4, 50), jnp.float32),
          "b": [jax.ShapeDtypeStruct((7,), jnp.bfloat16),
                jax.ShapeDtypeStruct((), jnp.float32)]}
  assert payload_nbytes(None, tree) == 600 * 4 + 7 * 2 + 4
  # every leaf is encoded on its own
  assert payload_nbytes(top_k(0.1), tree) == (
      60 * (4 + 2) + 1 * (2 + 1) + 1 * (4 + 1))
  assert payload_nbytes(quantize(4), tree) == (300 + 8) + (4 + 8) + (1 + 8)
  # arrays and shapes give the same answer
  arrays = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)
  assert payload_nbytes(top_k(0.1), arrays) == payload_nbytes(top_k(0.1), tree)
  assert payload_nbytes(None, arrays) == payload_nbytes(None, tree)


def test_payload_bytes_of_bf16_values():
  x = jax.ShapeDtypeStruct((300,), jnp.bfloat16)
  assert payload_nbytes(top_k(0.1), x) == 30 * (2 + 2)
  assert payload_nbytes(random_k(0.1), x) == 30 * 2
  assert payload_nbytes(quantize(4), x) == 150 + 8  # scales stay float32
  assert payload_nbytes(cast("fp8"), x) == 300


# --- collectives --------------------------------------------------------------


def test_collective():
  for codec in (None, cast("bf16"), cast("float32"), random_k(0.1),
                random_k(0.1) | cast("bf16")):
    assert collective(codec) == "ring_allreduce", codec
  for codec in (top_k(0.1), quantize(4), quantize(2, "statistical"), sign(),
                dct_top_k(), top_k(0.1) | cast("bf16"),
                random_k(0.1) | quantize(8), cast("bf16") | top_k(0.5),
                top_k(1.0)):
    assert collective(codec) == "all_gather", codec.name


# --- specs --------------------------------------------------------------------


def test_parse_codec_examples():
  assert parse_codec("none") is None
  assert parse_codec(" None ") is None
  c = parse_codec("topk:0.1,quant:4")
  assert c.config == (top_k(0.1) | quantize(4)).config
  assert parse_codec(" TopK:0.1 , quant:4 ").config == c.config
  assert parse_codec("quant:2:statistical:chunk=64").config == quantize(
      2, "statistical", chunk=64).config
  assert parse_codec("quant:4:linear:stochastic").config == quantize(
      4, stochastic=True).config
  assert parse_codec("cast:bf16").config == cast("bfloat16").config
  assert parse_codec("dct").config == dct_top_k(64, 32).config
  assert parse_codec("dct:16").config == dct_top_k(16, 32).config
  assert parse_codec("dct:16:8").config == dct_top_k(16, 8).config
  assert parse_codec("sign").config == sign().config
  assert parse_codec("randk:0.5,cast:fp8").summable


@pytest.mark.parametrize("name", list(REGISTRY))
def test_parse_codec_rebuilds_every_name(name):
  codec = REGISTRY[name]
  again = parse_codec(codec.name)
  assert isinstance(again, Codec)
  assert again.name == codec.name and again.config == codec.config
  assert (again.summable, again.carries_values, again.needs_key) == (
      codec.summable, codec.carries_values, codec.needs_key)


def test_names_keep_every_digit_of_a_fraction():
  for codec in (top_k(1 / 3), random_k(0.123456789), top_k(0.1), top_k(1.0)):
    again = parse_codec(codec.name)
    assert again.config == codec.config, codec.name
  assert top_k(0.1).name == "topk:0.1" and top_k(1.0).name == "topk:1"


@pytest.mark.parametrize("spec", [
    "", "   ", None, 5, "topk", "topk:abc", "topk:0", "topk:2", "topk:0.1:2",
    "randk:-1", "quant", "quant:3", "quant:4:foo", "quant:4:chunk=x",
    "quant:4:chunk=0", "quant:4:statistical:stochastic", "quant:4,topk:0.1",
    "sign,topk:0.1", "foo:1", "dct:a", "dct:1:2:3", "dct:0", "cast:int8",
    "cast", "topk:0.1,", ",topk:0.1", "sign:1", "none,topk:0.1",
    "topk:0.1,none"])
def test_parse_codec_rejects(spec):
  with pytest.raises(ValueError, match="codec") as info:
    parse_codec(spec)
  assert repr(spec) in str(info.value)


def test_parse_codec_names_the_field_and_the_cause():
  with pytest.raises(ValueError, match="--codec") as info:
    parse_codec("quant:3", field="--codec")
  assert "bits" in str(info.value)
  with pytest.raises(ValueError, match="chunk"):
    parse_codec("quant:4:chunk=0")
  with pytest.raises(ValueError, match="fraction"):
    parse_codec("topk:1.5")


# --- trees --------------------------------------------------------------------


def test_trees_use_one_key_per_leaf():
  tree = _tree(seed=1)
  codec = random_k(0.5)
  key = jax.random.key(3)

  def run(tree):
    payloads = encode_tree(codec, tree, key)
    leaves = jax.tree.leaves(tree)
    by_hand = [codec.decode(codec.encode(x, jax.random.fold_in(key, i)),
                            jax.random.fold_in(key, i))
               for i, x in enumerate(leaves)]
    return decode_tree(codec, payloads, key), roundtrip(codec, tree, key), \
        by_hand

  decoded, rt, by_hand = jax.jit(run)(tree)
  assert jax.tree.structure(decoded) == jax.tree.structure(tree)
  chex.assert_trees_all_equal(decoded, rt)
  for got, want in zip(jax.tree.leaves(decoded), by_hand):
    np.testing.assert_array_equal(got, want)


def test_identity_codecs_are_exact():
  tree = _tree(seed=2)
  out = jax.jit(lambda t: (roundtrip(top_k(1.0), t),
                           roundtrip(cast("float32"), t),
                           roundtrip(random_k(1.0), t, jax.random.key(0))))(
                               tree)
  for o in out:
    chex.assert_trees_all_equal(o, tree)


# --- the optax wrapper --------------------------------------------------------


def test_compress_in_an_optax_chain():
  params = _tree(seed=4)
  grads = _tree(seed=5)
  tx = optax.chain(compress(top_k(0.25)), optax.sgd(1.0))
  state = tx.init(params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  for u, g in zip(jax.tree.leaves(updates), jax.tree.leaves(grads)):
    g = np.asarray(g).reshape(-1)
    keep = np.argsort(-np.abs(g))[:_k(g.size, 0.25)]
    want = np.zeros_like(g)
    want[keep] = -g[keep]
    np.testing.assert_array_equal(np.asarray(u).reshape(-1), want)
  assert int(state[0].count) == 1


def test_compress_keys_per_step_and_per_worker():
  codec = quantize(2, stochastic=True)
  key = jax.random.key(9)
  grads_W = {"w": jnp.broadcast_to(_tree(seed=6)["w"], (W, 6, 8))}
  tx = per_worker(compress(codec, key))
  state_W = tx.init(grads_W)
  update = jax.jit(tx.update)
  first, state_W = update(grads_W, state_W)
  second, state_W = update(grads_W, state_W)
  np.testing.assert_array_equal(state_W.count, [2] * W)
  one = jax.jit(lambda tree, key, w: roundtrip(codec, tree, key, w))
  for t, out in enumerate((first, second)):
    for w in range(W):
      chex.assert_trees_all_equal(
          jax.tree.map(lambda x: x[w], out),
          one(jax.tree.map(lambda x: x[w], grads_W), jax.random.fold_in(key, t),
              w))
  w0, w1 = np.asarray(first["w"][0]), np.asarray(first["w"][1])
  assert not np.array_equal(w0, w1)  # same input, private noise
  assert not np.array_equal(w0, np.asarray(second["w"][0]))  # new key per step


def test_compress_rejects_non_codecs():
  with pytest.raises(ValueError, match="codec"):
    compress("topk:0.1")


# ------------------------------------------- the MuLoCo authors' grid
def _authors_quantizer(x, bits, sigmas=6.0):
  """A numpy port of the formula in the MuLoCo authors' code
  (facebookresearch/MuLoCo, torchtitan/quantization.py): one tensor."""
  n_bins = 2 ** bits
  x = np.asarray(x, np.float64).ravel()
  shift = x.mean()
  centred = x - shift
  std = np.linalg.norm(centred) / math.sqrt(x.size - 1) if x.size > 1 else 0
  scale = sigmas * std / n_bins
  if scale == 0 or not np.isfinite(scale):
    scale = 1.0
  codes = np.clip(np.round(centred / scale + n_bins // 2), 0, n_bins - 1)
  lookup = np.zeros(n_bins)
  for b in range(n_bins):  # the mean of each bin's centred entries
    if np.any(codes == b):
      lookup[b] = centred[codes == b].mean()
  return lookup[codes.astype(int)] + shift, codes


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("kind", ["gaussian", "heavy", "constant", "tiny"])
def test_the_muloco_grid_is_the_authors_formula(bits, kind):
  rng = np.random.default_rng(bits)
  x = {"gaussian": rng.normal(0.3, 2.0, (37, 11)),
       "heavy": rng.standard_t(2, (400,)),
       "constant": np.full((9,), 1.5),
       "tiny": rng.normal(size=(3,))}[kind].astype(np.float32)
  want, _ = _authors_quantizer(x, bits)
  # One compiled program per case rather than its operations one by one.
  got = jax.jit(functools.partial(
      roundtrip, quantize(bits, "statistical", grid="muloco")))(
          jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(got).ravel(), want, rtol=1e-5,
                             atol=1e-5 * np.abs(x).max())


def test_the_two_grids_cut_a_gaussian_at_different_edges():
  """At 2 bits the authors' edges are -2.25, -0.75 and +0.75 sigma, lowbw's
  -1.5, 0 and +1.5: a value at +0.5 sigma shares the mean's code in the
  first, not in the second."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=20000)
  x = (x - x.mean()) / x.std(ddof=1)
  _, codes = _authors_quantizer(x, 2)
  for lo, hi, code in ((-9, -2.25, 0), (-2.25, -0.75, 1), (-0.75, 0.75, 2),
                       (0.75, 9, 3)):
    inside = (x > lo + 1e-3) & (x < hi - 1e-3)
    assert np.all(codes[inside] == code)
  muloco = np.asarray(roundtrip(quantize(2, "statistical", grid="muloco"),
                                jnp.asarray(x, jnp.float32)))
  ours = np.asarray(roundtrip(quantize(2, "statistical"),
                              jnp.asarray(x, jnp.float32)))
  near = np.abs(x - 0.5) < 0.05
  assert np.ptp(muloco[near | (np.abs(x) < 0.05)]) < 1e-6   # one code
  assert np.ptp(ours[near | (np.abs(x) < 0.05)]) > 0.5      # two codes


def test_a_grid_needs_the_statistical_scheme():
  with pytest.raises(ValueError, match="^grid='muloco' is invalid: a grid "
                     "is a choice of the statistical scheme"):
    quantize(2, grid="muloco")
  with pytest.raises(ValueError, match="^grid='authors' is invalid"):
    quantize(2, "statistical", grid="authors")

