"""SPES against a per-worker Python reference (owner-masked inner steps,
shared mean, experts from their owners, the merge as a loop over experts),
its frozen experts, its bytes and memory, faults, and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import network, strategies
from lowbw.network import _topology
from lowbw.strategies import _spes
from lowbw.transforms import call_participating

import toy_workers

E, W = 6, 3


def _params(E=E):
  k = jax.random.split(jax.random.key(7), 3)
  return {"emb": jax.random.normal(k[0], (4,)),
          "layer": {"experts": {"w_gate": jax.random.normal(k[1], (E, 2, 3)),
                                "w_down": jax.random.normal(k[2], (E, 3))},
                    "router": jnp.linspace(-1.0, 1.0, 5)}}


def _inner():
  return optax.adamw(0.05, weight_decay=0.1)


# ------------------------------------------------------------- reference
def _view(p, mine):
  ex = p["layer"]["experts"]
  return {"emb": p["emb"], "router": p["layer"]["router"],
          "w_gate": ex["w_gate"][mine], "w_down": ex["w_down"][mine]}


def _put(p, v, mine):
  ex = p["layer"]["experts"]
  return {"emb": v["emb"], "layer": {"router": v["router"], "experts": {
      "w_gate": ex["w_gate"].at[mine].set(v["w_gate"]),
      "w_down": ex["w_down"].at[mine].set(v["w_down"])}}}


def _merge_reference(p, alpha, top_k):
  ex = {n: np.asarray(x, np.float64) for n, x in p["layer"]["experts"].items()}
  flat = ex["w_gate"].reshape(E, -1)
  new = {n: x.copy() for n, x in ex.items()}
  for i in range(E):
    sims = [np.dot(flat[i], flat[j]) / np.linalg.norm(flat[i]) /
            np.linalg.norm(flat[j]) if j != i else -np.inf for j in range(E)]
    peers = np.argsort(sims)[::-1][:top_k]
    for n in ex:
      new[n][i] = ex[n][i] + alpha * np.mean(ex[n][peers] - ex[n][i], axis=0)
  return {"emb": p["emb"], "layer": {"router": p["layer"]["router"],
                                     "experts": {n: jnp.asarray(x, jnp.float32)
                                                 for n, x in new.items()}}}


def reference(params, targets, owned, H, rounds, merge=None):
  """SPES written as a loop over workers and rounds."""
  inner = _inner()
  glob = params
  opt = [inner.init(_view(params, mine)) for mine in owned]
  for r in range(rounds):
    trained = []
    for w, mine in enumerate(owned):
      p = glob
      for _ in range(H):
        g = jax.grad(toy_workers.loss)(p, targets[w])
        v = _view(p, mine)
        upd, opt[w] = inner.update(_view(g, mine), opt[w], v)
        p = _put(p, optax.apply_updates(v, upd), mine)
      trained.append(p)
    owner = {int(e): w for w, mine in enumerate(owned) for e in mine}
    experts = {n: jnp.stack([trained[owner[e]]["layer"]["experts"][n][e]
                             for e in range(E)])
               for n in ("w_gate", "w_down")}
    mean = jax.tree.map(lambda *x: sum(x) / len(x), *trained)
    glob = {"emb": mean["emb"], "layer": {"router": mean["layer"]["router"],
                                          "experts": experts}}
    if merge is not None:
      alpha, warmup, every, top_k = merge
      step = (r + 1) * H
      a = alpha * (1 - min(step / warmup, 1)) if step % every == 0 else 0
      if a > 0:
        glob = _merge_reference(glob, a, top_k)
  return glob


def _close(a, b, **kw):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


def _close_to_rounding(a, b, steps: int, rtol: float):
  """SPES against DiLoCo: the same update in real arithmetic, summed in
  another order (owner rows against a mean over workers). A rounding is
  relative to the operands that meet in it, so an entry that ends near 0
  still carries errors of the size of its leaf's largest values: per leaf,
  one float32 eps of that scale per inner step (``atol``), besides
  ``rtol`` for the entries AdamW magnifies (below)."""
  eps = float(np.finfo(np.float32).eps)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    y = np.asarray(y)
    np.testing.assert_allclose(np.asarray(x), y, rtol=rtol,
                               atol=steps * eps * float(np.max(np.abs(y))))


@pytest.mark.parametrize("owners,merge", [
    (None, None),                                  # E/W consecutive each
    ((2, 0, 1, 0, 2, 1), None),                    # an explicit map
    (None, (0.3, 12, 4, 2)),                       # merging, then none
])
def test_rounds_match_the_per_worker_reference(owners, merge):
  params = _params()
  H, rounds = 2, 4
  kw = dict(merge_warmup_steps=0) if merge is None else dict(
      merge_alpha=merge[0], merge_warmup_steps=merge[1],
      merge_every=merge[2], merge_top_k=merge[3])
  strategy = strategies.spes(_inner(), H=H, assignment=owners, **kw)
  targets = toy_workers.targets(params, W)
  # toy_workers.run also asserts one program served every step, across the
  # merge warm-up's end.
  state, reports = toy_workers.run(strategy, params, targets, H * rounds)
  owned = state.inner_W.owned_W
  if owners is not None:
    assert [sorted(np.flatnonzero(np.asarray(owners) == w)) for w in range(W)
            ] == np.asarray(owned).tolist()
  want = reference(params, targets, np.asarray(owned), H, rounds, merge)
  _close(state.comm.global_params, want, rtol=2e-5, atol=2e-6)
  alphas = [float(r["merge_alpha"]) for r in reports[H - 1::H]]
  if merge is not None:  # 0.3 (1 - t/12) at t = 4, 8; none at 12 (alpha 0)
    np.testing.assert_allclose(alphas, [0, 0.2, 0, 0.1], rtol=1e-6)


def test_frozen_experts_are_bit_unchanged_over_a_round():
  params = _params()
  strategy = strategies.spes(_inner(), H=5, merge_warmup_steps=0)
  state, _ = toy_workers.run(strategy, params, toy_workers.targets(params, W),
                             4)
  owned = np.asarray(state.inner_W.owned_W)
  for name, x0 in params["layer"]["experts"].items():
    x_W = np.asarray(state.params_W["layer"]["experts"][name])
    for w in range(W):
      frozen = [e for e in range(E) if e not in owned[w]]
      assert np.array_equal(x_W[w, frozen], np.asarray(x0)[frozen])
      assert not np.allclose(x_W[w, owned[w]], np.asarray(x0)[owned[w]])


@pytest.mark.parametrize("codec,ef", [(None, None), ("quant:4", 0.5)])
def test_one_worker_owning_everything_is_diloco(codec, ef):
  params = _params()
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  spes = strategies.spes(_inner(), outer, H=3, merge_warmup_steps=0,
                         codec=codec, error_feedback=ef)
  diloco = strategies.diloco(_inner(), outer, H=3, codec=codec,
                             error_feedback=ef)
  targets = toy_workers.targets(params, 1)
  a, _ = toy_workers.run(spes, params, targets, 9)
  b, _ = toy_workers.run(diloco, params, targets, 9)
  _close_to_rounding(a.comm.global_params, b.comm.global_params, 9, 1e-6)
  _close_to_rounding(a.params_W, b.params_W, 9, 1e-6)


def _sizes(params, k):
  shared = params["emb"].size + params["layer"]["router"].size
  expert = sum(x[0].size for x in params["layer"]["experts"].values())
  return shared, expert


def test_optimizer_state_and_residuals_hold_owned_experts_only():
  params = _params()
  k = E // W
  spes = strategies.spes(_inner(), H=2, codec="quant:8", error_feedback=0.9)
  st = spes.init(params, W, jax.random.key(0))
  assert st.inner_W.opt[0].mu["layer"]["experts"][
      "w_gate"].shape == (W, k, 2, 3)
  residuals = [x.shape for x in jax.tree.leaves(st.comm.residual_W)]
  assert (W, k, 3) in residuals and (W, E, 3) not in residuals
  diloco = strategies.diloco(_inner(), H=2)
  st_d = diloco.init(params, W, jax.random.key(0))

  def nbytes(tree):
    return sum(x.nbytes for x in jax.tree.leaves(tree)
               if jnp.issubdtype(x.dtype, jnp.floating))

  shared, expert = _sizes(params, k)
  ratio = nbytes(st.inner_W.opt) / nbytes(st_d.inner_W)
  assert ratio == pytest.approx((shared + k * expert) / (shared + E * expert))
  assert nbytes(st.params_W) == nbytes(st_d.params_W)  # whole model held


def test_channels_and_round_bytes_follow_the_payload_shapes():
  params = _params()
  k = E // W
  shared, expert = _sizes(params, k)
  ch = strategies.spes(H=2).channels(params, W)
  assert ch["shared"].payload_bytes == 4 * shared
  assert ch["shared"].wire_bytes == pytest.approx(2 * (W - 1) / W * 4 * shared)
  assert ch["experts"].payload_bytes == 4 * k * expert
  assert ch["experts"].wire_bytes == (W - 1) * 4 * k * expert
  assert ch["experts"].down_bytes == 4 * E * expert
  rb = _spes.round_bytes(params, W)
  assert rb == {"spes_uplink": 4 * (shared + k * expert),
                "spes_downlink": 4 * (shared + E * expert),
                "diloco_uplink": 4 * (shared + E * expert),
                "diloco_downlink": 4 * (shared + E * expert)}
  # A parameter server: upload the message, download the whole experts.
  link = network.link("8Mbps", "10ms")
  cost = _topology.parameter_server(link, ch["experts"])
  assert cost.seconds == pytest.approx(
      0.02 + (4 * k * expert + 4 * E * expert) / 1e6)
  q = strategies.spes(H=2, codec="quant:8").channels(params, W)
  assert q["experts"].down_bytes < ch["experts"].down_bytes


def test_a_down_owner_keeps_its_experts_at_the_global_value():
  params = _params()
  strategy = strategies.spes(_inner(), H=2, merge_warmup_steps=0)
  state = strategy.init(params, W, jax.random.key(0))
  targets_W = jax.tree.map(lambda *t: jnp.stack(t),
                           *toy_workers.targets(params, W))
  for _ in range(2):
    state, _ = strategy.local(state, jax.vmap(jax.grad(toy_workers.loss))(
        state.params_W, targets_W))
  active = jnp.array([True, False, True])
  new, _ = call_participating(active, strategy.sync, state)
  g = new.comm.global_params
  owned = np.asarray(state.inner_W.owned_W)
  for name, x in g["layer"]["experts"].items():
    np.testing.assert_array_equal(np.asarray(x)[owned[1]],
                                  np.asarray(params["layer"]["experts"][name])
                                  [owned[1]])
    np.testing.assert_allclose(
        np.asarray(x)[owned[2]],
        np.asarray(state.params_W["layer"]["experts"][name])[2, owned[2]],
        rtol=1e-6)
  np.testing.assert_allclose(
      g["emb"], (state.params_W["emb"][0] + state.params_W["emb"][2]) / 2,
      rtol=1e-6)


@pytest.mark.parametrize("kw,field", [
    ({"experts_per_worker": 4}, "experts_per_worker"),       # 4 * 3 != 6
    ({"assignment": (0, 1, 2)}, "assignment"),               # not E ids
    ({"assignment": (0, 0, 0, 1, 1, 2)}, "assignment"),      # uneven
    ({"assignment": (0, 1, 2, 3, 0, 1)}, "assignment"),      # no worker 3
    ({"merge_top_k": 6}, "merge_top_k"),                     # > E - 1
])
def test_assignment_errors_at_init(kw, field):
  strategy = strategies.spes(H=2, **kw)
  with pytest.raises(ValueError, match=field):
    strategy.init(_params(), W, jax.random.key(0))


@pytest.mark.parametrize("kw,field", [
    ({"merge_every": 3, "H": 2}, "merge_every"),
    ({"merge_alpha": 1.5}, "merge_alpha"),
    ({"merge_warmup_steps": -1}, "merge_warmup_steps"),
    ({"merge_top_k": 0}, "merge_top_k"),
    ({"experts_per_worker": 1, "assignment": (0, 1)}, "assignment"),
    ({"assignment": "0,1"}, "assignment"),
    ({"assignment": (0.0, 1.0)}, "assignment"),
    ({"assignment": (True, False)}, "assignment"),
    ({"H": 0}, "H"),
])
def test_setting_errors_at_build(kw, field):
  with pytest.raises(ValueError, match=field):
    strategies.spes(**kw)


def test_a_model_without_experts_is_refused():
  with pytest.raises(ValueError, match="mixture-of-experts"):
    strategies.spes(H=2).init({"w": jnp.ones(3)}, 2, jax.random.key(0))


def test_no_merging_unless_asked_with_warmup_zero():
  a = _spes.merge_alpha_at(jnp.int32(500), 0.1, 0, 500)
  b = _spes.merge_alpha_at(jnp.int32(500), 0.1, 12500, 500)
  c = _spes.merge_alpha_at(jnp.int32(12500), 0.1, 12500, 500)
  assert float(a) == 0 and float(b) == pytest.approx(0.096) and float(c) == 0


def test_the_papers_configurations_by_its_formulas():
  """Section 3.3's arithmetic on Table 2's shapes: a third less traffic for
  the 2B model on 16 nodes, about 20 GB less static memory (55 vs 35 GB
  measured), 65% less upload for the 7B model on 4 nodes; the docs' table
  is the one the experiment script prints."""
  import os
  import sys
  here = os.path.dirname(__file__)
  sys.path.insert(0, os.path.join(here, "..", "experiments"))
  import spes_vs_diloco
  shared, expert = _spes.moe_param_counts(16, 1536, 1280, 16, 151_936)
  b = _spes.node_bytes(shared, expert, 16, 16)
  assert b["comm_saving"] == pytest.approx(1 / 3, abs=0.005)
  assert (b["memory_diloco"] - b["memory_spes"]) / 1e9 == pytest.approx(
      20, abs=1)
  shared, expert = _spes.moe_param_counts(16, 2048, 2048, 32, 151_936)
  b = _spes.node_bytes(shared, expert, 32, 4)
  assert 1 - b["uplink_spes"] / b["uplink_diloco"] == pytest.approx(0.65,
                                                                    abs=0.02)
  with open(os.path.join(here, "..", "docs", "strategies", "spes.md")) as f:
    assert "\n".join(spes_vs_diloco.paper_table()) in f.read()


# ------------------------------------------------------ end to end (compiled)
TINY_MOE = dict(layers=1, d_model=16, heads=2, seq_len=16, num_experts=4,
                top_k=2, expert_hidden=16)


def test_spes_with_one_worker_owning_everything_is_diloco_end_to_end():
  import lowbw
  from lowbw import data, models
  outer = optax.sgd(0.7, momentum=0.9, nesterov=True)
  runs = [lowbw.simulate(models.moe_gpt(**TINY_MOE), data.text_bytes(
      seq_len=16), s, workers=1, batch_size=4, steps=8, eval_every=4,
      progress=False) for s in (
          strategies.spes(_inner(), outer, H=4, merge_warmup_steps=0),
          strategies.diloco(_inner(), outer, H=4))]
  np.testing.assert_allclose(runs[0].history["eval_loss"],
                             runs[1].history["eval_loss"], rtol=1e-6)
  # The two strategies sum in different orders; after 8 AdamW steps one
  # value in a thousand can differ by up to ~4e-4 relative (AdamW divides by the
  # root of tiny second moments, which magnifies rounding; seen on some CPUs),
  # and an entry near 0 by a few eps of its leaf's scale (2.4e-7 seen on an
  # AMD EPYC; at most 25 eps of the scale here, 1/12 of the tolerance).
  _close_to_rounding(runs[0].params, runs[1].params, 8, 1e-3)
  assert runs[0].summary["final_eval_perplexity"] == pytest.approx(
      np.exp(runs[0].summary["final_eval_cross_entropy"]))


def test_the_command_line_trains_spes_on_the_moe_gpt(tmp_path, capsys):
  import json
  from lowbw import cli
  argv = ["train", "--strategy", "spes", "--workers", "2", "--steps", "8",
          "--H", "4", "--merge-every", "4", "--merge-warmup-steps", "8",
          "--merge-top-k", "3", "--experts", "4", "--d-model", "16",
          "--heads", "2", "--seq-len", "16", "--expert-hidden", "16",
          "--batch-size", "2", "--no-progress", "--out", str(tmp_path)]
  assert cli.main(argv) == 0
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["model"]["name"] == "moe_gpt"
  assert config["model"]["num_experts"] == 4
  assert config["strategy"]["merge_top_k"] == 3
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["wire_bytes"] > 0
  capsys.readouterr()
  # The dense gpt has no experts: the flag is refused, naming it.
  assert cli.main(["train", "--model", "gpt", "--experts", "4", "--steps",
                   "2"]) == 2
  assert "experts=4" in capsys.readouterr().err
  # SPES on the dense gpt: refused before compiling, naming the strategy.
  assert cli.main(["train", "--strategy", "spes", "--model", "gpt",
                   "--steps", "50"]) == 2
  assert "mixture-of-experts" in capsys.readouterr().err


def test_worker_batch_gives_the_same_spes_run():
  """The grouped local step slices every worker's state, owned experts
  included (they live in the worker-stacked inner state)."""
  import lowbw
  from lowbw import data, models
  runs = [lowbw.simulate(models.moe_gpt(**TINY_MOE), data.text_bytes(
      seq_len=16), strategies.spes(_inner(), H=3, merge_warmup_steps=6,
                                   merge_every=3, merge_top_k=2),
      workers=4, batch_size=2, steps=6, eval_every=3, progress=False,
      worker_batch=wb) for wb in (None, 2)]
  np.testing.assert_allclose(runs[0].history["eval_loss"],
                             runs[1].history["eval_loss"], rtol=1e-6)
  # Groups of 2 run matmuls of other shapes: float32 rounding, amplified by
  # Adam at lr 0.05 (DiLoCo on this model differs by 1.3e-5 the same way).
  _close(runs[0].params, runs[1].params, rtol=1e-3, atol=5e-5)
