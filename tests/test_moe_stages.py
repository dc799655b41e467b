"""The MoE gpt split into pipeline stages by blocks: without codecs its
loss, metrics (the router's load balancing, z-loss and expert shares,
summed along the stages) and gradients are the unsplit model's; with
codecs the boundaries carry the residual stream only, and a run counts
their bytes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw import models, transforms

SIZES = dict(layers=4, d_model=16, heads=2, seq_len=8, vocab=32,
             num_experts=4, top_k=2, expert_hidden=16)


def _batch(b=3, seed=0):
  rng = np.random.default_rng(seed)
  return {"tokens": rng.integers(0, SIZES["vocab"], (b, SIZES["seq_len"] + 1))}


@pytest.fixture(scope="module")
def moe_and_params():
  model = models.moe_gpt(**SIZES)
  return model, model.init(jax.random.key(0), _batch())


@pytest.fixture(scope="module")
def unsplit(moe_and_params):
  """The unsplit model's ((loss, metrics), gradients) on ``_batch()``."""
  model, params = moe_and_params
  return jax.jit(jax.value_and_grad(model.loss, has_aux=True))(
      params, _batch(), None)


def _max_diff(a, b):
  return max(float(jnp.abs(x - y).max())
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("stages", [1, 2, 4])
def test_split_moe_equals_the_unsplit_loss_metrics_and_gradients(
    moe_and_params, unsplit, stages):
  model, params = moe_and_params
  staged = models.split(model, stages)
  assert len(staged.stages) == stages
  loss = models.staged_loss(staged)
  (ref, ref_m), ref_g = unsplit
  (out, out_m), out_g = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      params, _batch(), None)
  assert set(out_m) == set(ref_m)
  assert "moe_balance_loss" in out_m and "moe_expert_share_3" in out_m
  np.testing.assert_allclose(out, ref, rtol=1e-6)
  for name in ref_m:
    np.testing.assert_allclose(out_m[name], ref_m[name], rtol=1e-5,
                               atol=1e-7, err_msg=name)
  assert _max_diff(out_g, ref_g) < 1e-6
  # The router terms reach every block's router: no gradient lost on the way.
  for i in range(SIZES["layers"]):
    router = out_g[f"block_{i}"]["moe"]["router"]["kernel"]
    assert float(jnp.abs(router).max()) > 0


def test_the_router_losses_are_summed_along_the_stages(moe_and_params):
  """Against a plain loop over the blocks: the balance loss and expert
  shares averaged over every block, the z-loss summed, whichever stage
  holds the block."""
  from lowbw.models import _moe_gpt
  model, params = moe_and_params
  batch = _batch()
  per_block = []
  for i in range(SIZES["layers"]):
    part = _moe_gpt.MoEGPT(**{**SIZES}, part=(0, i + 1))
    # Blocks 0..i summed minus blocks 0..i-1: block i's own statistics.
    _, upto = part.apply({"params": params}, batch["tokens"][:, :-1])
    per_block.append(upto)
  own = [per_block[0]] + [jax.tree.map(jnp.subtract, b, a)
                          for a, b in zip(per_block, per_block[1:])]
  balance = np.mean([float(s["balance"]) for s in own])
  z = np.sum([float(s["z"]) for s in own])
  share = np.mean([np.asarray(s["share"]) for s in own], axis=0)
  _, metrics = models.staged_loss(models.split(model, 2))(params, batch, None)
  np.testing.assert_allclose(metrics["moe_balance_loss"], balance, rtol=1e-5)
  np.testing.assert_allclose(metrics["moe_z_loss"], z, rtol=1e-5)
  np.testing.assert_allclose(
      [metrics[f"moe_expert_share_{e}"] for e in range(4)], share, atol=1e-6)


def test_owners_partition_the_moe_parameters(moe_and_params):
  model, params = moe_and_params
  owners = models.split(model, 3).owners
  names = [n for stage in owners for n in stage]
  assert sorted(names) == sorted(params) and len(names) == len(set(names))
  assert owners[0][0] == "tok_embed" and owners[-1][-2:] == ("norm_final",
                                                             "head")


def test_moe_stage_flops_are_its_parameters_shares(moe_and_params):
  """The clock charges an MoE gpt 6 FLOPs per parameter and token: each
  stage its own parameters' 6."""
  from lowbw.models import _stages
  model, params = moe_and_params
  for stages in (1, 2, 4):
    flops = _stages.stage_flops(model, stages)
    owners = models.split(model, stages).owners
    assert flops == tuple(6.0 * sum(x.size for n in names
                                    for x in jax.tree.leaves(params[n]))
                          for names in owners)
    assert sum(flops) == 6.0 * sum(x.size for x in jax.tree.leaves(params))


def test_the_boundary_carries_the_residual_stream(moe_and_params):
  model, params = moe_and_params
  shapes = models.activation_shapes(models.split(model, 3), params,
                                    _batch(b=2))
  assert [s.shape for s in shapes] == [(2, 8, 16)] * 2


def test_codecs_act_on_the_activations_only(moe_and_params):
  """With a codec the forward is the codec's round trip of the residual
  stream at each boundary, the router statistics passing beside it: the
  staged loss equals a loop that rounds the activation by hand."""
  from lowbw.models import _moe_gpt
  model, params = moe_and_params
  batch = _batch()
  q8 = transforms.parse_boundary_codec("quant:8", "f", 0)
  staged = models.split(model, 2)
  out, metrics = models.staged_loss(
      staged, transforms.stage_boundary([q8], [q8]))(params, batch, None)
  key = jax.random.fold_in(jax.random.key(0), 0)
  first = _moe_gpt.MoEGPT(**SIZES, part=(0, 2))
  last = _moe_gpt.MoEGPT(**SIZES, part=(2, 4))
  x, before = first.apply({"params": params}, batch["tokens"][:, :-1])
  x = q8.decode(q8.encode(x, key))
  logits, after = last.apply({"params": params}, x)
  stats = _moe_gpt.layer_stats(jax.tree.map(jnp.add, before, after), 4)
  ref, ref_m = _moe_gpt.lm_loss_of(logits, batch["tokens"][:, 1:], stats,
                                   (0.01, 0.001, 1e-5), 4)
  np.testing.assert_allclose(out, ref, rtol=1e-6)
  np.testing.assert_allclose(metrics["moe_z_loss"], ref_m["moe_z_loss"],
                             rtol=1e-6)
  plain, _ = model.loss(params, batch, None)
  assert float(out) != float(plain)


def _config(tmp_path, **kw):
  (tmp_path / "a.txt").write_text("hello world, the quick brown fox. " * 300)
  return lowbw.Config(**{
      **dict(model="moe_gpt", layers=2, d_model=16, heads=2, seq_len=8,
             experts=4, top_k=2, expert_hidden=16, data="text",
             data_root=str(tmp_path), strategy="ddp", workers=2,
             batch_size=4, steps=2, log_every=1, progress=False), **kw})


def test_a_moe_pipeline_run_counts_its_boundary_bytes(tmp_path):
  """A run of the MoE gpt in two stages with quant:8 both ways and two
  micro-batches: its model is the staged model with those codecs, and
  stage_bytes is each step's micro-batches' activations and gradients
  through the codec."""
  from lowbw.simulation._api import engine_config
  settings = dict(stages=2, boundary_codec="quant:8", micro_batches=2,
                  hardware="1s")
  c = engine_config(_config(tmp_path, **settings))
  q8 = transforms.parse_codec("quant:8")
  fwd, bwd = transforms.boundary_bytes(q8, q8, (2, 8, 16))
  assert (c.pipeline.forward_bytes, c.pipeline.backward_bytes) == (
      (fwd,), (bwd,))
  r = lowbw.simulate(_config(tmp_path, **settings))
  np.testing.assert_array_equal(r.history["stage_bytes"],
                                r.history["step"] * 2 * (fwd + bwd))
  assert np.all(np.isfinite(r.history["train_loss"]))
  assert 0 < r.summary["pipeline_bubble"] < 1
