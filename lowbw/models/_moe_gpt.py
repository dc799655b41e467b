"""A decoder-only mixture-of-experts language model, like SPES's (Zhang et al.,
2026, arXiv 2602.11543, Section 3.2, itself following OLMoE): RMSNorm, RoPE,
QK-norm, SwiGLU experts chosen per token by a softmax router (top-k of E),
drop-less.

Expert weights are stacked on a leading expert axis inside a submodule named
``experts`` (``w_gate``, ``w_up``: (E, d, f); ``w_down``: (E, f, d)), so a
worker's expert subset is a slice of each leaf: this naming is what
``strategies.spes`` looks for.

Dispatch is dense: every expert runs on every token and the router's
combine weights (zero off the top-k) select the outputs. Every routed token
is processed (drop-less by construction), it is exact against a per-token
reference, and at lowbw's sizes (E <= 16, a few thousand tokens per worker)
one batched matmul over E beats a sort plus grouped matmul on CPU: see
``docs/strategies/spes.md`` for the measurement. It costs E/k times the
expert FLOPs of a sparse dispatch.

The attention is :class:`lowbw.models._blocks.Attention` with RMSNorm
QK-norm, rotary positions and no biases.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Array, Batch, Params, PRNGKey
from lowbw.models import _blocks, _contract
from lowbw.models._gpt import _check_token_range

_STD = _blocks.STD

# SPES Appendix B's loss coefficients (the same for every model size).
BALANCE_COEF = 0.01
ROUTER_Z_COEF = 0.001
OUTPUT_Z_COEF = 1e-5


class Experts(nn.Module):
  """E SwiGLU MLPs as stacked weights: (E, N, d) inputs -> (E, N, d)."""
  num: int
  hidden: int
  out_std: float

  @nn.compact
  def __call__(self, x_ExNxD: Array) -> Array:
    d = x_ExNxD.shape[-1]
    init = nn.initializers.normal(_STD)
    w_gate = self.param("w_gate", init, (self.num, d, self.hidden))
    w_up = self.param("w_up", init, (self.num, d, self.hidden))
    w_down = self.param("w_down", nn.initializers.normal(self.out_std),
                        (self.num, self.hidden, d))
    h = (jax.nn.silu(jnp.einsum("end,edf->enf", x_ExNxD, w_gate))
         * jnp.einsum("end,edf->enf", x_ExNxD, w_up))
    return jnp.einsum("enf,efd->end", h, w_down)


def route(logits_NxE: Array, top_k: int, normalize: bool):
  """Softmax router, top-k: combine weights (N, E) (the gate of each chosen
  expert, zero elsewhere), the probabilities, and the one-hot choices."""
  probs_NxE = jax.nn.softmax(logits_NxE.astype(jnp.float32), axis=-1)
  gates_NxK, idx_NxK = jax.lax.top_k(probs_NxE, top_k)
  if normalize:
    gates_NxK = gates_NxK / jnp.sum(gates_NxK, -1, keepdims=True)
  chosen_NxKxE = jax.nn.one_hot(idx_NxK, logits_NxE.shape[-1])
  combine_NxE = jnp.einsum("nk,nke->ne", gates_NxK, chosen_NxKxE)
  return combine_NxE, probs_NxE, jnp.sum(chosen_NxKxE, axis=1)


def router_losses(logits_NxE: Array, probs_NxE: Array, chosen_NxE: Array,
                  top_k: int) -> dict[str, Array]:
  """Load balancing (Switch/GShard: E x sum_e f_e P_e, f_e the share of the
  N*k routed slots expert e got, P_e its mean probability; 1 when balanced),
  router z-loss (mean squared log-sum-exp of the logits), expert shares."""
  e = logits_NxE.shape[-1]
  share_E = jnp.mean(chosen_NxE, axis=0) / top_k
  balance = e * jnp.sum(share_E * jnp.mean(probs_NxE, axis=0))
  z = jnp.mean(jax.nn.logsumexp(logits_NxE.astype(jnp.float32), -1) ** 2)
  return {"balance": balance, "z": z, "share": share_E}


class MoE(nn.Module):
  """A router and E SwiGLU experts; (b, T, d) -> (b, T, d) and its stats."""
  num_experts: int
  top_k: int
  hidden: int
  out_std: float
  normalize_gates: bool = False

  @nn.compact
  def __call__(self, x_BxTxD: Array):
    b, t, d = x_BxTxD.shape
    x_NxD = jnp.reshape(x_BxTxD, (b * t, d))
    logits_NxE = nn.Dense(self.num_experts, use_bias=False,
                          kernel_init=nn.initializers.normal(_STD),
                          name="router")(x_NxD)
    combine_NxE, probs_NxE, chosen_NxE = route(logits_NxE, self.top_k,
                                               self.normalize_gates)
    experts = Experts(self.num_experts, self.hidden, self.out_std,
                      name="experts")
    out_ExNxD = experts(jnp.broadcast_to(x_NxD, (self.num_experts, b * t, d)))
    y_NxD = jnp.einsum("ne,end->nd", combine_NxE.astype(out_ExNxD.dtype),
                       out_ExNxD)
    stats = router_losses(logits_NxE, probs_NxE, chosen_NxE, self.top_k)
    return jnp.reshape(y_NxD, (b, t, d)), stats


class _Block(nn.Module):
  heads: int
  num_experts: int
  top_k: int
  hidden: int
  out_std: float

  @nn.compact
  def __call__(self, x_BxTxD: Array):
    attn = _blocks.Attention(self.heads, self.out_std, use_bias=False,
                             qk_norm=True, rotary=True, name="attn")
    x_BxTxD = x_BxTxD + attn(nn.RMSNorm(name="norm_attn")(x_BxTxD))
    y, stats = MoE(self.num_experts, self.top_k, self.hidden, self.out_std,
                   name="moe")(nn.RMSNorm(name="norm_moe")(x_BxTxD))
    return x_BxTxD + y, stats


class MoEGPT(nn.Module):
  """int tokens (b, T) -> (logits (b, T, V), router stats: balance loss and
  expert shares averaged over layers, router z-loss summed over layers, as
  the SPES authors' training code does)."""
  layers: int
  d_model: int
  heads: int
  seq_len: int
  vocab: int
  num_experts: int
  top_k: int
  expert_hidden: int
  # A pipeline stage's slice (``lowbw.models.split``), as the gpt's: blocks
  # ``part[0]`` to ``part[1] - 1``, the embedding when it starts at 0, the
  # final norm and head when it ends at ``layers``; it returns its blocks'
  # router statistics summed (``part_stats``), not averaged.
  part: tuple[int, int] | None = None

  @nn.compact
  def __call__(self, x):
    lo, hi = (0, self.layers) if self.part is None else self.part
    init = nn.initializers.normal(_STD)
    if lo == 0:
      x = self._embedded(x)
    out_std = _STD / math.sqrt(2 * self.layers)
    per_layer = []
    for i in range(lo, hi):
      x, stats = _Block(self.heads, self.num_experts, self.top_k,
                        self.expert_hidden, out_std, name=f"block_{i}")(x)
      per_layer.append(stats)
    stats = jax.tree.map(lambda *s: jnp.stack(s), *per_layer)
    if self.part is not None:
      stats = jax.tree.map(lambda v: jnp.sum(v, axis=0), stats)
      if hi < self.layers:
        return x, stats
    x = nn.RMSNorm(name="norm_final")(x)
    logits = nn.Dense(self.vocab, use_bias=False, kernel_init=init,
                      name="head")(x)
    if self.part is not None:
      return logits, stats
    return logits, {"balance": jnp.mean(stats["balance"]),
                    "z": jnp.sum(stats["z"]),
                    "share": jnp.mean(stats["share"], axis=0)}

  def _embedded(self, tokens_BxT: Array) -> Array:
    if tokens_BxT.shape[1] > self.seq_len:
      raise _validate.fail(
          "seq_len", self.seq_len, f"batch sequences have "
          f"{tokens_BxT.shape[1]} input tokens; expected seq_len >= that")
    return nn.Embed(self.vocab, self.d_model,
                    embedding_init=nn.initializers.normal(_STD),
                    name="tok_embed")(tokens_BxT.astype(jnp.int32))


def layer_stats(summed: dict, layers: int) -> dict:
  """The whole model's router statistics from their sums over every block
  (the stages' ``part`` outputs added up): balance and shares averaged over
  the layers, the z-loss summed, as :class:`MoEGPT` gives them."""
  return {"balance": summed["balance"] / layers, "z": summed["z"],
          "share": summed["share"] / layers}


def _lm_loss(module: MoEGPT, coefs: tuple[float, float, float]):

  def loss(params: Params, batch: Batch, key: PRNGKey | None = None):
    del key  # deterministic
    inputs, labels = _contract._lm_split(batch)
    logits, stats = module.apply({"params": params}, inputs)
    return lm_loss_of(logits, labels, stats, coefs, module.num_experts)

  return loss


def lm_loss_of(logits: Array, labels: Array, stats: dict, coefs: tuple,
               num_experts: int):
  """``(loss, metrics)`` from the logits and the router statistics (the
  whole model's, as :class:`MoEGPT` returns them)."""
  balance_coef, router_z_coef, output_z_coef = coefs
  logits = logits.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  output_z = jnp.mean(jax.nn.logsumexp(logits, -1) ** 2)
  total = (ce + balance_coef * stats["balance"] +
           router_z_coef * stats["z"] + output_z_coef * output_z)
  hits = (jnp.argmax(logits, -1) == labels).astype(jnp.float32).mean()
  metrics = {"accuracy": hits, "cross_entropy": ce,
             "moe_balance_loss": stats["balance"], "moe_z_loss": stats["z"],
             "output_z_loss": output_z,
             **{f"moe_expert_share_{e}": stats["share"][e]
                for e in range(num_experts)}}
  return total, metrics


def moe_gpt(
    layers: int = 2,
    d_model: int = 128,
    heads: int = 4,
    seq_len: int = 128,
    vocab: int = 256,
    num_experts: int = 8,
    top_k: int = 2,
    expert_hidden: int = 256,
    balance_coef: float = BALANCE_COEF,
    router_z_coef: float = ROUTER_Z_COEF,
    output_z_coef: float = OUTPUT_Z_COEF,
) -> _contract.Model:
  """A decoder-only mixture-of-experts language model (SPES, arXiv
  2602.11543, Section 3.2).

  Token embedding, ``layers`` pre-norm blocks (RMSNorm; causal attention with
  RoPE and QK-norm; RMSNorm; a softmax router choosing ``top_k`` of
  ``num_experts`` SwiGLU experts per token, outputs weighted by the router's
  probabilities, drop-less), a final RMSNorm and an untied head. The batch is
  ``{"tokens": int (b, T + 1)}`` as for :func:`gpt`.

  Loss = cross-entropy + ``balance_coef`` x load balancing + ``router_z_coef``
  x router z-loss + ``output_z_coef`` x output z-loss, SPES Appendix B's
  coefficients by default (0.01, 0.001, 1e-5; set one to 0 to drop the
  term). Metrics: ``accuracy``, ``cross_entropy``, ``moe_balance_loss``,
  ``moe_z_loss``, ``output_z_loss`` and ``moe_expert_share_<e>`` (the share
  of routed token slots expert e received); the balance loss and shares are
  averaged over layers and the router z-loss summed over them, as in the
  SPES authors' code. Eval perplexity is exp(cross_entropy).
  ``model.apply(params, tokens)`` gives the (b, T, vocab) logits only.

  The defaults scale SPES's smallest model (16 experts, top-2, SwiGLU width
  2048 at d 768) to the embedded byte-level text: 8 experts, top-2, width
  256 at d 128, so the active MLP width (2 x 256) equals the dense
  :func:`gpt`'s (4 x 128) and the experts hold ~85% of the parameters.

  Args:
    layers, d_model, heads, seq_len, vocab: as :func:`gpt`; ``d_model /
      heads`` must be even (RoPE rotates pairs).
    num_experts: E, default 8.
    top_k: experts per token, default 2 (<= num_experts).
    expert_hidden: each expert's SwiGLU width, default 256.
    balance_coef, router_z_coef, output_z_coef: loss weights (>= 0).

  Example:
    >>> model = moe_gpt(layers=2, d_model=64, num_experts=4, top_k=1)
  """
  for field, value in (("layers", layers), ("d_model", d_model),
                       ("heads", heads), ("seq_len", seq_len),
                       ("vocab", vocab), ("num_experts", num_experts),
                       ("top_k", top_k), ("expert_hidden", expert_hidden)):
    _validate.positive_int(field, value)
  if d_model % heads or (d_model // heads) % 2:
    raise _validate.fail("heads", heads, f"expected a divisor of d_model="
                         f"{d_model} leaving an even head width (RoPE)")
  if top_k > num_experts:
    raise _validate.fail("top_k", top_k,
                         f"expected <= num_experts={num_experts}")
  coefs = tuple(_validate.non_negative(f, v) for f, v in (
      ("balance_coef", balance_coef), ("router_z_coef", router_z_coef),
      ("output_z_coef", output_z_coef)))
  module = MoEGPT(layers, d_model, heads, seq_len, vocab, num_experts, top_k,
                  expert_hidden)
  config = {"name": "moe_gpt", "layers": layers, "d_model": d_model,
            "heads": heads, "seq_len": seq_len, "vocab": vocab,
            "num_experts": num_experts, "top_k": top_k,
            "expert_hidden": expert_hidden, "balance_coef": coefs[0],
            "router_z_coef": coefs[1], "output_z_coef": coefs[2]}

  def init(key: PRNGKey, batch: Batch) -> Params:
    _check_token_range(batch, vocab)
    inputs, _ = _contract._lm_split(batch)
    return module.init(key, inputs)["params"]

  def apply(params: Params, tokens_BxT: Array) -> Array:
    # The forward of the loss; the router statistics (unused) are dropped.
    logits_BxTxV, _ = module.apply({"params": params}, tokens_BxT)
    return logits_BxTxV

  return _contract.Model(init=init, loss=_lm_loss(module, coefs), task="lm",
                         name="moe_gpt", config=config, apply=apply)
