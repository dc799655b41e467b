"""A small decoder-only transformer language model (GPT-2 style, pre-LN)."""

import math
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._types import Array, Batch, Params, PRNGKey
from lowbw.models import _contract

# GPT-2's initialisation: N(0, 0.02) everywhere, residual output projections
# shrunk by 1/sqrt(2 * layers) so the residual stream's scale does not grow
# with depth.
_STD = 0.02


class _CausalSelfAttention(nn.Module):
  heads: int
  out_std: float

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    b, t, d = x_BxTxD.shape
    dh = d // self.heads
    qkv = nn.Dense(3 * d, kernel_init=nn.initializers.normal(_STD),
                   name="qkv")(x_BxTxD)
    qkv_BxTx3xHxK = jnp.reshape(qkv, (b, t, 3, self.heads, dh))
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = (qkv_BxTx3xHxK[:, :, i] for i in range(3))
    scores_BxHxTxT = jnp.einsum(
        "bqhk,bshk->bhqs", q_BxTxHxK, k_BxTxHxK) / math.sqrt(dh)
    causal_1x1xTxT = jnp.reshape(jnp.tril(jnp.ones((t, t), bool)), (1, 1, t, t))
    # finfo.min rather than -inf: a fully masked row (none here, but cheap
    # insurance) would give NaN through softmax with -inf.
    scores_BxHxTxT = jnp.where(causal_1x1xTxT, scores_BxHxTxT,
                               jnp.finfo(scores_BxHxTxT.dtype).min)
    probs_BxHxTxT = jax.nn.softmax(scores_BxHxTxT, axis=-1)
    out_BxTxHxK = jnp.einsum("bhqs,bshk->bqhk", probs_BxHxTxT, v_BxTxHxK)
    return nn.Dense(d, kernel_init=nn.initializers.normal(self.out_std),
                    name="out")(jnp.reshape(out_BxTxHxK, (b, t, d)))


class _Block(nn.Module):
  heads: int
  mlp_ratio: int
  out_std: float

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    d = x_BxTxD.shape[-1]
    attn = _CausalSelfAttention(self.heads, self.out_std, name="attn")
    x_BxTxD = x_BxTxD + attn(nn.LayerNorm(name="ln_attn")(x_BxTxD))
    h_BxTxF = nn.Dense(self.mlp_ratio * d,
                       kernel_init=nn.initializers.normal(_STD),
                       name="mlp_in")(nn.LayerNorm(name="ln_mlp")(x_BxTxD))
    return x_BxTxD + nn.Dense(d, kernel_init=nn.initializers.normal(
        self.out_std), name="mlp_out")(nn.gelu(h_BxTxF))


class GPT(nn.Module):
  """Decoder-only transformer: int tokens (b, T) -> next-token logits (b, T, V).

  ``T`` may be anything up to ``seq_len`` (the positional table's length).
  """
  layers: int
  d_model: int
  heads: int
  seq_len: int
  vocab: int
  mlp_ratio: int

  @nn.compact
  def __call__(self, tokens_BxT: Array) -> Array:
    t = tokens_BxT.shape[1]
    if t > self.seq_len:
      raise _validate.fail(
          "seq_len", self.seq_len,
          f"batch sequences have {t} input tokens (tokens.shape[1] - 1); "
          f"expected seq_len >= {t}")
    init = nn.initializers.normal(_STD)
    x_BxTxD = nn.Embed(self.vocab, self.d_model, embedding_init=init,
                       name="tok_embed")(tokens_BxT.astype(jnp.int32))
    pos_LxD = self.param("pos_embed", init, (self.seq_len, self.d_model))
    x_BxTxD = x_BxTxD + jnp.expand_dims(pos_LxD[:t], 0)
    out_std = _STD / math.sqrt(2 * self.layers)
    for i in range(self.layers):
      x_BxTxD = _Block(self.heads, self.mlp_ratio, out_std,
                       name=f"block_{i}")(x_BxTxD)
    x_BxTxD = nn.LayerNorm(name="ln_final")(x_BxTxD)
    return nn.Dense(self.vocab, kernel_init=init, name="head")(x_BxTxD)


def _check_token_range(batch: Batch, vocab: int) -> None:
  """Out-of-range ids would embed to NaN (jnp.take fills), so catch them early.

  Only a concrete example batch can be checked; a traced one passes through.
  """
  tokens = batch.get("tokens") if isinstance(batch, Mapping) else None
  if tokens is None or isinstance(tokens, jax.core.Tracer):
    return
  tokens = np.asarray(tokens)
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab):
    raise _validate.fail(
        "vocab", vocab, f"batch tokens range over [{tokens.min()}, "
        f"{tokens.max()}]; expected every token id in [0, vocab)")


def gpt(
    layers: int = 2,
    d_model: int = 128,
    heads: int = 4,
    seq_len: int = 128,
    vocab: int = 256,
    mlp_ratio: int = 4,
) -> _contract.Model:
  """A small decoder-only transformer language model.

  Token embedding plus a learned positional embedding, ``layers`` pre-LayerNorm
  blocks (causal multi-head self-attention, then a GELU MLP of width
  ``mlp_ratio * d_model``, each in a residual branch), a final LayerNorm and an
  untied Dense to ``vocab`` logits; GPT-2's N(0, 0.02) initialisation. The
  batch is ``{"tokens": int (b, T + 1)}`` with ``T <= seq_len``: inputs are
  ``tokens[:, :-1]`` and targets ``tokens[:, 1:]``. Loss: mean next-token
  cross-entropy; metrics: ``{"accuracy"}`` (next-token accuracy).

  Args:
    layers: number of transformer blocks, default 2.
    d_model: width of the residual stream, default 128.
    heads: attention heads, default 4; must divide ``d_model``.
    seq_len: longest input sequence (positional table length), default 128.
    vocab: vocabulary size, default 256 (bytes).
    mlp_ratio: MLP width as a multiple of ``d_model``, default 4.

  Returns:
    An ``"lm"`` :class:`~lowbw.models.Model` named ``"gpt"``.

  Raises:
    ValueError: for a non-positive size, ``heads`` not dividing ``d_model``,
      and (at init) batch sequences longer than ``seq_len`` or token ids
      outside ``[0, vocab)``.

  Example:
    >>> import jax, numpy as np
    >>> model = gpt(layers=2, d_model=64, heads=4, seq_len=32, vocab=256)
    >>> batch = {"tokens": np.zeros((8, 33), np.int32)}
    >>> params = model.init(jax.random.key(0), batch)
    >>> loss, metrics = model.loss(params, batch, jax.random.key(1))
  """
  for field, value in (("layers", layers), ("d_model", d_model),
                       ("heads", heads), ("seq_len", seq_len),
                       ("vocab", vocab), ("mlp_ratio", mlp_ratio)):
    _validate.positive_int(field, value)
  if d_model % heads:
    raise _validate.fail(
        "heads", heads, f"expected a divisor of d_model={d_model}")
  module = GPT(layers=layers, d_model=d_model, heads=heads, seq_len=seq_len,
               vocab=vocab, mlp_ratio=mlp_ratio)
  config = {"name": "gpt", "layers": layers, "d_model": d_model,
            "heads": heads, "seq_len": seq_len, "vocab": vocab,
            "mlp_ratio": mlp_ratio}
  model = _contract.wrap_module(module, "lm", "gpt", config)

  def init(key: PRNGKey, batch: Batch) -> Params:
    _check_token_range(batch, vocab)
    return model.init(key, batch)

  return model._replace(init=init)
