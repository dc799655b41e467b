"""Strategies with codecs and error feedback, against per-worker Python loops.

The references keep one tree per worker in Python lists and run the codec on
each worker's tensor with ``lowbw.transforms.roundtrip`` (the codecs themselves
are tested in their own files); what is tested here is where compression sits
in each strategy, which keys it gets, how residuals evolve and what is
averaged.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import strategies
from lowbw import transforms as T
from lowbw.transforms import roundtrip, sparse_count, sparse_indices
from test_strategies import (INNER, STEPS, W, assert_workers_close, batch_at,
                             grad_fn, island_average, local_steps, make_problem,
                             mean_of, run_vectorized)

IDENTITY_CODECS = {"top_k(1.0)": T.top_k(1.0), "cast(float32)": T.cast("float32")}
OUTER = optax.sgd(0.7, momentum=0.9, nesterov=True)


def compiled(codec):
  """``roundtrip`` through ``codec`` as one compiled program, for the
  references' many calls (op by op, each call took about 0.2 s)."""
  return jax.jit(functools.partial(roundtrip, codec))


def codec_key(key, step):
  """The key strategies give the codec at a step (documented in _base)."""
  return jax.random.fold_in(jax.random.fold_in(key, 0xC0DEC), step)


def pair(codec):
  """(compressed, plain) strategy pairs that must follow the same trajectory."""
  return {
      "ddp": (strategies.ddp(INNER, codec=codec), strategies.ddp(INNER)),
      "ddp+ef": (strategies.ddp(INNER, codec=codec, error_feedback=0.5),
                 strategies.ddp(INNER)),
      "fedavg deltas": (strategies.fedavg(INNER, H=3, codec=codec,
                                          error_feedback=0.9),
                        strategies.fedavg(INNER, H=3)),
      "fedavg parameters islands": (
          strategies.fedavg(INNER, H=3, island_size=2, codec=codec,
                            compress="parameters"),
          strategies.fedavg(INNER, H=3, island_size=2)),
      "diloco+ef": (strategies.diloco(INNER, OUTER, H=3, codec=codec,
                                      error_feedback=0.9),
                    strategies.diloco(INNER, OUTER, H=3)),
      "sparta": (strategies.sparta(INNER, p=0.3, codec=codec),
                 strategies.sparta(INNER, p=0.3)),
      "sparta_diloco": (
          strategies.sparta_diloco(INNER, OUTER, H=3, p=0.3, codec=codec,
                                   sparse_codec=codec),
          strategies.sparta_diloco(INNER, OUTER, H=3, p=0.3)),
      "muloco": (strategies.muloco(H=3, codec=codec, error_feedback=0.9),
                 strategies.muloco(H=3, codec=None)),
  }


@pytest.mark.parametrize("codec_name", sorted(IDENTITY_CODECS))
@pytest.mark.parametrize("name", sorted(pair(T.top_k(1.0))))
def test_identity_codecs_leave_trajectories_unchanged(name, codec_name):
  compressed, plain = pair(IDENTITY_CODECS[codec_name])[name]
  params, batches = make_problem()
  a = run_vectorized(compressed, params, batches)
  b = run_vectorized(plain, params, batches)
  # deltas re-added to the global model may differ in the last bit
  chex.assert_trees_all_close(a.params_W, b.params_W, atol=2e-6, rtol=2e-6)


def test_ddp_with_codec_and_feedback_matches_reference():
  params, batches = make_problem()
  codec, beta, key = T.sign(), 0.5, jax.random.PRNGKey(7)
  state = run_vectorized(
      strategies.ddp(INNER, codec=codec, error_feedback=beta), params, batches,
      key)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  rt = compiled(codec)
  residual_w = [jax.tree.map(jnp.zeros_like, params)] * W
  for t in range(STEPS):
    sent = []
    for w in range(W):
      g = grad_fn(params_w[w], batch_at(batches, t, w))
      acc = jax.tree.map(lambda e, x: beta * e + x, residual_w[w], g)
      sent.append(rt(acc, codec_key(key, t), w))
      residual_w[w] = jax.tree.map(jnp.subtract, acc, sent[-1])
    g = mean_of(sent)
    for w in range(W):
      upd, inner_w[w] = INNER.update(g, inner_w[w], params_w[w])
      params_w[w] = optax.apply_updates(params_w[w], upd)
  assert_workers_close(state.params_W, params_w)
  for w in range(W):
    chex.assert_trees_all_close(
        jax.tree.map(lambda x: x[w], state.comm.residual), residual_w[w],
        atol=1e-5)


def diloco_reference(inner, codec, beta, H, key, params, batches,
                     again=False):
  """MuLoCo's Algorithm 1 as a Python loop over workers: each worker's
  pseudo-gradient (plus its residual with ``beta``) through ``codec``, the
  mean of what is decoded (through ``codec`` once more with ``again``: a
  quantized all-reduce's second encoding), then the outer step. Returns the
  global parameters and every worker's."""
  params_w, inner_w = [params] * W, [inner.init(params)] * W
  global_params, outer_state = params, OUTER.init(params)
  rt = compiled(codec)
  residual_w = [jax.tree.map(jnp.zeros_like, params)] * W
  for t in range(STEPS):
    local_steps(inner, params_w, inner_w, batches, t)
    if (t + 1) % H:
      continue
    sent = []
    for w in range(W):
      delta = optax.tree.sub(global_params, params_w[w])
      if beta is None:
        sent.append(rt(delta, codec_key(key, t + 1), w))
        continue
      acc = jax.tree.map(lambda e, d: beta * e + d, residual_w[w], delta)
      sent.append(rt(acc, codec_key(key, t + 1), w))
      residual_w[w] = jax.tree.map(jnp.subtract, acc, sent[-1])
    mean = mean_of(sent)
    if again:
      mean = rt(mean, jax.random.fold_in(codec_key(key, t + 1), 0x2ED))
    upd, outer_state = OUTER.update(mean, outer_state, global_params)
    global_params = optax.apply_updates(global_params, upd)
    params_w = [global_params] * W
  return global_params, params_w


@pytest.mark.parametrize("beta", [None, 0.9])
def test_diloco_with_codec_matches_algorithm_1(beta):
  """MuLoCo's Algorithm 1 with a random-k + stochastic 4-bit codec: shared
  positions, private rounding noise, residual per worker."""
  params, batches = make_problem()
  H, key = 3, jax.random.PRNGKey(9)
  codec = T.random_k(0.6) | T.quantize(4, stochastic=True)
  inner = optax.adam(0.01)
  state = run_vectorized(
      strategies.diloco(inner, OUTER, H=H, codec=codec, error_feedback=beta),
      params, batches, key)
  global_params, params_w = diloco_reference(inner, codec, beta, H, key,
                                              params, batches)
  assert_workers_close(state.params_W, params_w)
  chex.assert_trees_all_close(state.comm.global_params, global_params,
                              atol=1e-5)
  # The codec really was lossy, so the comparison is not vacuous.
  plain = run_vectorized(strategies.diloco(inner, OUTER, H=H), params, batches,
                         key)
  assert float(jnp.max(jnp.abs(plain.params_W["w"] - state.params_W["w"]))) > 1e-4


def test_reduce_scatter_quantizes_the_mean_again_like_a_loop():
  """aggregation="reduce_scatter": each worker's pseudo-gradient through the
  codec (with its residual), their mean through the codec once more (the
  quantized all-reduce's second encoding), then the outer step; priced at
  2(W-1)/W of the payload instead of the all-gather's W-1."""
  params, batches = make_problem()
  H, key, beta = 3, jax.random.PRNGKey(4), 0.9
  codec = T.quantize(2, "statistical", grid="muloco")
  inner = optax.adam(0.01)
  strategy = strategies.diloco(inner, OUTER, H=H, codec=codec,
                               error_feedback=beta,
                               aggregation="reduce_scatter")
  state = run_vectorized(strategy, params, batches, key)
  global_params, _ = diloco_reference(inner, codec, beta, H, key, params,
                                      batches, again=True)
  chex.assert_trees_all_close(state.comm.global_params, global_params,
                              atol=1e-5)
  gathered = run_vectorized(
      strategies.diloco(inner, OUTER, H=H, codec=codec, error_feedback=beta),
      params, batches, key)
  assert float(jnp.max(jnp.abs(gathered.comm.global_params["w"] -
                               state.comm.global_params["w"]))) > 1e-4
  (rs,) = strategy.channels(params, 8).values()
  (ag,) = strategies.diloco(codec=codec).channels(params, 8).values()
  assert rs.payload_bytes == ag.payload_bytes
  assert rs.wire_bytes == 2 * 7 / 8 * rs.payload_bytes
  assert ag.wire_bytes == 7 * ag.payload_bytes
  assert rs.collective == "ring_allreduce"


def test_fedavg_parameters_codec_with_islands_matches_reference():
  params, batches = make_problem()
  H, s, key = 2, 2, jax.random.PRNGKey(3)
  codec = T.quantize(4)
  state = run_vectorized(
      strategies.fedavg(INNER, H=H, island_size=s, codec=codec,
                        compress="parameters"), params, batches, key)
  rt = compiled(codec)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  for t in range(STEPS):
    local_steps(INNER, params_w, inner_w, batches, t)
    if (t + 1) % H:
      continue
    decoded = [rt(params_w[w], codec_key(key, t + 1), w) for w in range(W)]
    params_w = island_average(decoded, key, t + 1, H, s)
  assert_workers_close(state.params_W, params_w)


def test_sparta_codec_matches_reference():
  params, batches = make_problem()
  key, p = jax.random.PRNGKey(11), 0.4
  codec = T.quantize(2)
  state = run_vectorized(strategies.sparta(INNER, p=p, codec=codec), params,
                         batches, key)
  rt = compiled(codec)
  params_w, inner_w = [params] * W, [INNER.init(params)] * W
  for t in range(STEPS):
    local_steps(INNER, params_w, inner_w, batches, t)
    out = [jax.tree.map(np.array, pw) for pw in params_w]
    leaves = [jax.tree.leaves(o) for o in out]
    treedef = jax.tree.structure(out[0])
    for i, leaf in enumerate(leaves[0]):
      k = sparse_count(leaf.size, p)
      idx = np.asarray(sparse_indices(
          jax.random.fold_in(jax.random.fold_in(key, 0x5BA7), i),
          jnp.int32(t + 1), leaf.size, k, "random"))
      leaf_key = jax.random.fold_in(codec_key(key, t + 1), i)
      decoded = [np.asarray(rt(jnp.asarray(lw[i].reshape(-1)[idx]), leaf_key,
                               w)) for w, lw in enumerate(leaves)]
      avg = sum(decoded) / W
      for lw in leaves:
        lw[i].reshape(-1)[idx] = avg
    params_w = [jax.tree.unflatten(treedef, lw) for lw in leaves]
  assert_workers_close(state.params_W, params_w)


def test_demo_matches_reference():
  """DeMo (arXiv 2411.19870) written out per worker."""
  params, batches = make_problem()
  decay, lr = 0.9, 0.01
  codec = T.dct_top_k(chunk=4, k=2)
  state = run_vectorized(
      strategies.demo(optax.sgd(lr), decay=decay, chunk=4, k=2,
                      combine="sum"), params,
      batches)
  rt = compiled(codec)
  theta = params
  momentum_w = [jax.tree.map(jnp.zeros_like, params)] * W
  for t in range(STEPS):
    sent = []
    for w in range(W):
      g = grad_fn(theta, batch_at(batches, t, w))
      m = jax.tree.map(lambda m, g: decay * m + g, momentum_w[w], g)
      sent.append(rt(m))
      momentum_w[w] = jax.tree.map(jnp.subtract, m, sent[-1])
    update = jax.tree.map(lambda *s: jnp.sign(sum(s)), *sent)
    theta = jax.tree.map(lambda p, u: p - lr * u, theta, update)
  assert_workers_close(state.params_W, [theta] * W)
  assert_demo_state(state, theta, momentum_w)


def assert_demo_state(state, theta, momentum_w):
  """A DeMo state holds ``theta`` and every worker's momentum."""
  chex.assert_trees_all_close(strategies.demo().global_params(state), theta,
                              atol=1e-5)
  for w in range(W):
    chex.assert_trees_all_close(
        jax.tree.map(lambda x: x[w], state.comm.residual), momentum_w[w],
        atol=1e-5)


def test_demo_averages_over_senders_by_default_with_the_dct_codec():
  """The reference's mean is the default where it applies; a codec other
  than the plain DCT top-k sums (the mean needs the DCT coefficients)."""
  assert strategies.demo().config["combine"] == "mean"
  assert "combine" not in strategies.demo(codec="dct:64:32,quant:8").config
  with pytest.raises(ValueError, match="^combine='mean' is invalid"):
    strategies.demo(codec="dct:64:32,quant:8", combine="mean")


def test_demo_mean_over_senders_matches_reference():
  """combine="mean": the reference implementation's receivers divide each
  DCT coefficient by the number of workers that sent it before the inverse
  DCT and the sign; written out per worker from the codec's payloads."""
  from lowbw.transforms._dct import blocks, idct_blocks
  params, batches = make_problem()
  decay, lr, chunk, k = 0.9, 0.01, 4, 2
  codec = T.dct_top_k(chunk=chunk, k=k)
  state = run_vectorized(
      strategies.demo(optax.sgd(lr), decay=decay, chunk=chunk, k=k,
                      combine="mean"), params, batches)
  theta = params
  momentum_w = [jax.tree.map(jnp.zeros_like, params)] * W
  for t in range(STEPS):
    dense, mask = [], []
    for w in range(W):
      g = grad_fn(theta, batch_at(batches, t, w))
      m = jax.tree.map(lambda m, g: decay * m + g, momentum_w[w], g)
      payload = T.encode_tree(codec, m)
      momentum_w[w] = jax.tree.map(jnp.subtract, m,
                                   T.decode_tree(codec, payload))
      d, c = {}, {}
      for name, p in payload.items():
        values, idx = p.data["values"], p.data["indices"].astype(jnp.int32)
        _, _, br, bc = blocks(p.shape, chunk)
        size = br * bc
        rows = jnp.arange(values.shape[0])[:, None]
        d[name] = jnp.zeros((values.shape[0], size)).at[rows, idx].set(values)
        c[name] = jnp.zeros((values.shape[0], size)).at[rows, idx].set(1.0)
      dense.append(d)
      mask.append(c)
    update = {name: jnp.sign(idct_blocks(
        sum(d[name] for d in dense) / jnp.maximum(
            sum(c[name] for c in mask), 1.0), theta[name].shape, chunk))
        for name in theta}
    theta = jax.tree.map(lambda p, u: p - lr * u, theta, update)
  assert_demo_state(state, theta, momentum_w)
  summed = run_vectorized(strategies.demo(optax.sgd(lr), decay=decay,
                                          chunk=chunk, k=k, combine="sum"),
                          params, batches)
  assert float(jnp.max(jnp.abs(summed.params_W["w"] -
                               state.params_W["w"]))) > 1e-4


# --- bytes ------------------------------------------------------------------


def gpt_params():
  from lowbw import data, models
  model = models.gpt()
  return jax.eval_shape(model.init, jax.random.PRNGKey(0),
                        data.text_bytes().example_batch(2))


def test_diloco_two_bit_feedback_is_a_sixteenth_plus_scales():
  params = gpt_params()
  leaves = jax.tree.leaves(params)
  fp32 = sum(4 * math.prod(x.shape) for x in leaves)
  (plain,) = strategies.diloco().channels(params, 8).values()
  (two,) = strategies.diloco(codec=T.quantize(2), error_feedback=0.9).channels(
      params, 8).values()
  codes = sum(math.ceil(math.prod(x.shape) * 2 / 8) for x in leaves)
  scales = 8 * len(leaves)  # min and max, float32, per tensor
  assert plain.payload_bytes == fp32
  assert two.payload_bytes == codes + scales
  assert 16 * codes == fp32  # every GPT tensor has a multiple of 4 entries
  assert two.collective == "all_gather"
  assert two.wire_bytes == 7 * two.payload_bytes
  (stat,) = strategies.muloco().channels(params, 8).values()
  # the authors' grid: 4 bin means and the mean, per tensor
  assert stat.payload_bytes == codes + (4 * 4 + 4) * len(leaves)


def test_demo_bytes_formula():
  params = gpt_params()
  total = 0
  for x in jax.tree.leaves(params):
    rows = math.prod(x.shape[:-1])
    cols = x.shape[-1]
    br = max(d for d in range(1, min(rows, 64) + 1) if rows % d == 0)
    bc = max(d for d in range(1, min(cols, 64) + 1) if cols % d == 0)
    keep = min(32, br * bc)
    total += (rows // br) * (cols // bc) * keep * (4 + (1 if br * bc <= 256
                                                        else 2))
  (ch,) = strategies.demo().channels(params, 4).values()
  assert ch.payload_bytes == total
  assert ch.wire_bytes == 3 * total and ch.collective == "all_gather"


def test_summable_codecs_stay_all_reduce():
  params = {"w": jnp.zeros((10, 20))}
  (ch,) = strategies.ddp(codec=T.cast("bfloat16")).channels(params, 8).values()
  assert ch.payload_bytes == 400 and ch.collective == "ring_allreduce"
  assert ch.wire_bytes == pytest.approx(2 * 7 / 8 * 400)
  (ch,) = strategies.diloco(codec=T.random_k(0.1)).channels(params, 8).values()
  assert ch.payload_bytes == 80 and ch.collective == "ring_allreduce"
  (ch,) = strategies.sparta(p=0.1, codec=T.cast("float8_e4m3fn")).channels(
      params, 8).values()
  assert ch.payload_bytes == 20 and ch.collective == "ring_allreduce"


# --- MuLoCo's Muon labels -----------------------------------------------------


def test_muon_only_on_hidden_matrices():
  labels = strategies.hidden_matrices(gpt_params())
  flat = {jax.tree_util.keystr(path): label for path, label in
          jax.tree_util.tree_leaves_with_path(
              labels, is_leaf=lambda x: x is None or not isinstance(x, dict))}
  muon = sorted(k for k, v in flat.items() if v is not None)
  assert muon == sorted(
      f"['block_{b}']['{layer}']['kernel']".replace("['attn_", "['attn']['")
      for b in (0, 1) for layer in ("attn_out", "attn_qkv", "mlp_in",
                                    "mlp_out"))
  for name in ("['tok_embed']['embedding']", "['pos_embed']",
               "['head']['kernel']", "['ln_final']['scale']"):
    assert flat[name] is None


# --- errors -----------------------------------------------------------------


@pytest.mark.parametrize("call, field", [
    (lambda: strategies.ddp(error_feedback=0.5), "error_feedback"),
    (lambda: strategies.diloco(codec="topk"), "codec"),
    (lambda: strategies.diloco(codec=T.top_k(0.1), error_feedback=1.5),
     "error_feedback"),
    (lambda: strategies.fedavg(codec=T.quantize(4), error_feedback=0.9,
                               compress="parameters"), "error_feedback"),
    (lambda: strategies.fedavg(compress="gradients"), "compress"),
    (lambda: strategies.fedavg(codec=T.top_k(0.5), island_size=2).init(
        {"a": jnp.zeros(2)}, 4, jax.random.PRNGKey(0)), "island_size"),
    (lambda: strategies.sparta(codec=4), "codec"),
    (lambda: strategies.sparta_diloco(sparse_codec="bf16"), "sparse_codec"),
    (lambda: strategies.muloco(error_feedback=-1), "error_feedback"),
    (lambda: strategies.demo(decay=1.0), "decay"),
    (lambda: strategies.demo(chunk=32, codec=T.top_k(0.1)), "chunk"),
    (lambda: strategies.demo(k=0), "k"),
    (lambda: strategies.demo(codec="none"), "codec"),
    (lambda: strategies.demo(codec=0.5), "codec"),
    (lambda: T.top_k(0.1) | "quant:4", "codec second"),
    (lambda: strategies.diloco(aggregation="reduce_scatter"), "aggregation"),
    (lambda: strategies.demo(combine="median"), "combine"),
    (lambda: strategies.demo(codec="topk:0.1", combine="mean"), "combine"),
    (lambda: strategies.demo(codec="dct:64:32,quant:8", combine="mean"),
     "combine"),  # a later stage the mean would skip
    (lambda: strategies.muloco(aggregation="tree"), "aggregation"),
    (lambda: strategies.diloco(codec="cast:bf16",
                               aggregation="reduce_scatter"), "aggregation"),
])
def test_bad_compression_arguments_name_the_field(call, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    call()
