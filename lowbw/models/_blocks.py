"""Transformer pieces shared by :func:`~lowbw.models.gpt` and
:func:`~lowbw.models.moe_gpt`: rotary position embedding, one causal
self-attention module with options, norms, the dense MLP and the residual
wiring.

The helpers that create layers (:func:`norm`, :func:`mlp`, :func:`residual`)
are plain functions called inside a module's ``@nn.compact`` method, so the
layers they make belong to that module and keep flat names in the parameter
tree (``block_0/mlp_in``, not ``block_0/MLP_0/mlp_in``).
"""

import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from lowbw._types import Array

# GPT-2's initialisation: N(0, 0.02) everywhere; residual output projections
# are shrunk by the caller (``out_std``).
STD = 0.02

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
POSITIONS = ("learned", "rotary")
NORM_POSITIONS = ("pre", "post")


# Each option's allowed values (gpt's defaults: models._gpt.OPTIONS).
CHOICES = {"norm": NORMS, "mlp": MLPS, "position": POSITIONS,
           "norm_position": NORM_POSITIONS}


def rope(x_BxTxHxK: Array, base: float = 10000.0) -> Array:
  """Rotary position embedding (RoFormer, Su et al., arXiv 2104.09864).

  Rotates the pairs (i, i + K/2) of each head's features by the angle
  ``position * base ** (-i / (K/2))`` (the "rotate half" layout of GPT-NeoX
  and LLaMA's reference code). ``K`` must be even; positions are 0..T-1.
  """
  t, k = x_BxTxHxK.shape[1], x_BxTxHxK.shape[-1]
  half = k // 2
  freqs_H = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles_TxH = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs_H[None]
  cos = jnp.cos(angles_TxH)[None, :, None, :]
  sin = jnp.sin(angles_TxH)[None, :, None, :]
  x1, x2 = x_BxTxHxK[..., :half], x_BxTxHxK[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def norm(kind: str, name: str) -> nn.Module:
  """flax's LayerNorm (scale and bias) or RMSNorm (scale only), epsilon
  1e-6, named ``name``."""
  if kind == "layernorm":
    return nn.LayerNorm(name=name)
  return nn.RMSNorm(name=name)


def fused_attention_applies(dtype) -> bool:
  """Whether :func:`attend` hands attention to ``jax.nn.dot_product_attention``:
  on a GPU in 16-bit floats (autocast), where cuDNN's fused kernel (flash
  attention) applies. Everywhere else the einsums below run, so CPU results
  keep their bits."""
  return (jax.default_backend() == "gpu"
          and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)))


def attend(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array,
           fused: bool | None = None) -> Array:
  """Causal softmax attention of each head: (b, T, H, K) x3 -> (b, T, H, K).

  ``fused=None`` picks :func:`fused_attention_applies` on the values' type;
  ``True`` calls ``jax.nn.dot_product_attention`` (its cuDNN implementation on
  a GPU, XLA's elsewhere), ``False`` the explicit einsums and softmax.
  """
  if fused is None:
    fused = fused_attention_applies(v_BxTxHxK.dtype)
  if fused:
    dtype = v_BxTxHxK.dtype  # rotary positions compute in float32
    return jax.nn.dot_product_attention(
        q_BxTxHxK.astype(dtype), k_BxTxHxK.astype(dtype), v_BxTxHxK,
        is_causal=True,
        implementation="cudnn" if jax.default_backend() == "gpu" else "xla")
  t, dh = q_BxTxHxK.shape[1], q_BxTxHxK.shape[-1]
  scores_BxHxTxT = jnp.einsum(
      "bqhk,bshk->bhqs", q_BxTxHxK, k_BxTxHxK) / math.sqrt(dh)
  causal_1x1xTxT = jnp.reshape(jnp.tril(jnp.ones((t, t), bool)), (1, 1, t, t))
  # finfo.min rather than -inf: a fully masked row (none here, but cheap
  # insurance) would give NaN through softmax with -inf.
  scores_BxHxTxT = jnp.where(causal_1x1xTxT, scores_BxHxTxT,
                             jnp.finfo(scores_BxHxTxT.dtype).min)
  probs_BxHxTxT = jax.nn.softmax(scores_BxHxTxT, axis=-1)
  return jnp.einsum("bhqs,bshk->bqhk", probs_BxHxTxT, v_BxTxHxK)


class Attention(nn.Module):
  """Causal multi-head self-attention: (b, T, d) -> (b, T, d).

  One ``qkv`` Dense (d -> 3d), optionally an RMSNorm of each head's queries
  and keys (``qk_norm``, one scale of width d/heads shared by the heads,
  parameters ``q_norm`` and ``k_norm``), optionally rotary positions
  (``rotary``, after the QK-norm), softmax attention under a causal mask
  (:func:`attend`: cuDNN's fused kernel on a GPU under 16-bit autocast),
  and an ``out`` Dense (d -> d) initialised with ``out_std``.
  """
  heads: int
  out_std: float
  use_bias: bool = True
  qk_norm: bool = False
  rotary: bool = False

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    b, t, d = x_BxTxD.shape
    dh = d // self.heads
    qkv = nn.Dense(3 * d, use_bias=self.use_bias,
                   kernel_init=nn.initializers.normal(STD), name="qkv")(x_BxTxD)
    qkv_BxTx3xHxK = jnp.reshape(qkv, (b, t, 3, self.heads, dh))
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = (qkv_BxTx3xHxK[:, :, i] for i in range(3))
    if self.qk_norm:
      q_BxTxHxK = nn.RMSNorm(name="q_norm")(q_BxTxHxK)
      k_BxTxHxK = nn.RMSNorm(name="k_norm")(k_BxTxHxK)
    if self.rotary:
      q_BxTxHxK, k_BxTxHxK = rope(q_BxTxHxK), rope(k_BxTxHxK)
    out_BxTxHxK = attend(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)
    return nn.Dense(d, use_bias=self.use_bias,
                    kernel_init=nn.initializers.normal(self.out_std),
                    name="out")(jnp.reshape(out_BxTxHxK, (b, t, d)))


def swiglu_hidden(d_model: int, mlp_ratio: int) -> int:
  """SwiGLU's hidden width: ``round(2/3 * mlp_ratio * d_model)``.

  Its three matrices (gate, up, down) then hold as many weights as the GELU
  MLP's two of width ``mlp_ratio * d_model`` (LLaMA's choice, 8/3 d at
  ``mlp_ratio=4``, without its rounding up to a multiple of 256).
  """
  return round(2 * mlp_ratio * d_model / 3)


def mlp(x_BxTxD: Array, kind: str, hidden: int, out_std: float,
        use_bias: bool = True) -> Array:
  """The dense MLP, made in the calling module: ``"gelu"``: ``mlp_out(gelu(
  mlp_in(x)))``; ``"swiglu"``: ``mlp_out(silu(mlp_gate(x)) * mlp_up(x))``
  (Shazeer, "GLU Variants Improve Transformer", arXiv 2002.05202)."""
  d = x_BxTxD.shape[-1]
  init = nn.initializers.normal(STD)
  if kind == "gelu":
    h_BxTxF = nn.gelu(nn.Dense(hidden, use_bias=use_bias, kernel_init=init,
                               name="mlp_in")(x_BxTxD))
  else:
    gate_BxTxF = nn.Dense(hidden, use_bias=use_bias, kernel_init=init,
                          name="mlp_gate")(x_BxTxD)
    up_BxTxF = nn.Dense(hidden, use_bias=use_bias, kernel_init=init,
                        name="mlp_up")(x_BxTxD)
    h_BxTxF = jax.nn.silu(gate_BxTxF) * up_BxTxF
  return nn.Dense(d, use_bias=use_bias,
                  kernel_init=nn.initializers.normal(out_std),
                  name="mlp_out")(h_BxTxF)


def residual(x_BxTxD: Array, sublayer: Callable[[Array], Array],
             norm_kind: str, norm_name: str, position: str) -> Array:
  """One residual branch: ``"pre"``: ``x + sublayer(norm(x))`` (GPT-2,
  LLaMA); ``"post"``: ``norm(x + sublayer(x))`` (the original Transformer,
  Vaswani et al., arXiv 1706.03762)."""
  if position == "pre":
    return x_BxTxD + sublayer(norm(norm_kind, norm_name)(x_BxTxD))
  return norm(norm_kind, norm_name)(x_BxTxD + sublayer(x_BxTxD))
