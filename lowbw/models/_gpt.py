"""A small decoder-only transformer language model: GPT-2's block by default
(pre-LayerNorm, learned positions, GELU MLP), LLaMA-style parts as options."""

import inspect
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._types import Array, Batch, Params, PRNGKey
from lowbw.models import _blocks, _contract

# GPT-2's initialisation: N(0, 0.02) everywhere, residual output projections
# shrunk by 1/sqrt(2 * layers) so the residual stream's scale does not grow
# with depth.
_STD = _blocks.STD

# The options of :func:`gpt` and their defaults (the GPT-2 block).
OPTIONS = {"norm": "layernorm", "mlp": "gelu", "position": "learned",
           "qk_norm": False, "tie_embeddings": False, "norm_position": "pre"}


class _Block(nn.Module):
  heads: int
  mlp_hidden: int
  out_std: float
  norm: str = "layernorm"
  mlp: str = "gelu"
  rotary: bool = False
  qk_norm: bool = False
  norm_position: str = "pre"

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    attn = _blocks.Attention(self.heads, self.out_std, qk_norm=self.qk_norm,
                             rotary=self.rotary, name="attn")
    x_BxTxD = _blocks.residual(x_BxTxD, attn, self.norm, "ln_attn",
                               self.norm_position)
    return _blocks.residual(
        x_BxTxD, lambda h: _blocks.mlp(h, self.mlp, self.mlp_hidden,
                                       self.out_std),
        self.norm, "ln_mlp", self.norm_position)


class GPT(nn.Module):
  """Decoder-only transformer: int tokens (b, T) -> next-token logits (b, T, V).

  ``T`` may be anything up to ``seq_len`` (the positional table's length).
  The block options are :func:`gpt`'s.
  """
  layers: int
  d_model: int
  heads: int
  seq_len: int
  vocab: int
  mlp_ratio: int
  norm: str = "layernorm"
  mlp: str = "gelu"
  position: str = "learned"
  qk_norm: bool = False
  tie_embeddings: bool = False
  norm_position: str = "pre"
  # A pipeline stage's slice of the model (``lowbw.models.split``): blocks
  # ``part[0]`` to ``part[1] - 1``, with the embeddings when it starts at 0
  # and the final norm and head when it ends at ``layers``. Its parameters
  # keep the whole model's names, so the stages read one parameter tree.
  part: tuple[int, int] | None = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Tokens (b, T) -> logits (b, T, V); a ``part`` not starting at block 0
    takes the residual stream (b, T, d) instead, and one not ending at the
    last block returns it."""
    lo, hi = (0, self.layers) if self.part is None else self.part
    init = nn.initializers.normal(_STD)
    embed = None
    if lo == 0 or (hi == self.layers and self.tie_embeddings):
      embed = nn.Embed(self.vocab, self.d_model, embedding_init=init,
                       name="tok_embed")
    if lo == 0:
      x = self._embedded(embed, x)
    out_std = _STD / math.sqrt(2 * self.layers)
    hidden = _mlp_hidden(self.mlp, self.d_model, self.mlp_ratio)
    for i in range(lo, hi):
      x = _Block(self.heads, hidden, out_std, norm=self.norm,
                 mlp=self.mlp, rotary=self.position == "rotary",
                 qk_norm=self.qk_norm, norm_position=self.norm_position,
                 name=f"block_{i}")(x)
    if hi < self.layers:
      return x
    # Post-LN blocks already end in a norm: no final one (the original
    # Transformer's decoder stack).
    if self.norm_position == "pre":
      x = _blocks.norm(self.norm, "ln_final")(x)
    if self.tie_embeddings:
      return embed.attend(x)
    return nn.Dense(self.vocab, kernel_init=init, name="head")(x)

  def _embedded(self, embed: nn.Module, tokens_BxT: Array) -> Array:
    """Token (and learned position) embeddings: (b, T) -> (b, T, d)."""
    t = tokens_BxT.shape[1]
    if t > self.seq_len:
      raise _validate.fail(
          "seq_len", self.seq_len,
          f"batch sequences have {t} input tokens (tokens.shape[1] - 1); "
          f"expected seq_len >= {t}")
    x_BxTxD = embed(tokens_BxT.astype(jnp.int32))
    if self.position == "learned":
      pos_LxD = self.param("pos_embed", nn.initializers.normal(_STD),
                           (self.seq_len, self.d_model))
      x_BxTxD = x_BxTxD + jnp.expand_dims(pos_LxD[:t], 0)
    return x_BxTxD


def _mlp_hidden(kind: str, d_model: int, mlp_ratio: int) -> int:
  if kind == "swiglu":
    return _blocks.swiglu_hidden(d_model, mlp_ratio)
  return mlp_ratio * d_model


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
    *,
    norm: str = "layernorm",
    mlp: str = "gelu",
    position: str = "learned",
    qk_norm: bool = False,
    tie_embeddings: bool = False,
    norm_position: str = "pre",
) -> _contract.Model:
  """A small decoder-only transformer language model.

  By default GPT-2's block: token embedding plus a learned positional
  embedding, ``layers`` pre-LayerNorm blocks (causal multi-head
  self-attention, then a GELU MLP of width ``mlp_ratio * d_model``, each in a
  residual branch), a final LayerNorm and an untied Dense to ``vocab``
  logits; GPT-2's N(0, 0.02) initialisation. The keyword options swap in
  later models' parts (LLaMA, arXiv 2302.13971: ``norm="rmsnorm",
  mlp="swiglu", position="rotary"``); ``docs/models.md`` cites each. The
  batch is ``{"tokens": int (b, T + 1)}``, ``T <= seq_len``: inputs
  ``tokens[:, :-1]``, targets ``tokens[:, 1:]``. Loss: mean next-token
  cross-entropy; metrics: ``{"accuracy"}``. ``model.apply(params, tokens)``
  gives the (b, T, vocab) logits.

  Args:
    layers: number of transformer blocks, default 2.
    d_model: width of the residual stream, default 128.
    heads: attention heads, default 4; must divide ``d_model`` (leaving an
      even head width with rotary positions).
    seq_len: longest input sequence (positional table length), default 128.
    vocab: vocabulary size, default 256 (bytes).
    mlp_ratio: MLP width as a multiple of ``d_model``, default 4 (SwiGLU:
      ``round(2/3 * mlp_ratio * d_model)``, as many weights as GELU's).
    norm: ``"layernorm"`` (default) or ``"rmsnorm"`` (scale only).
    mlp: ``"gelu"`` (default) or ``"swiglu"``.
    position: ``"learned"`` (default; parameter ``pos_embed``) or
      ``"rotary"`` (RoPE on queries and keys; no positional parameter).
    qk_norm: RMSNorm of each head's queries and keys before attention (and
      before rotary), default False.
    tie_embeddings: logits from the token embedding transposed (no ``head``
      parameters, no head bias), default False.
    norm_position: ``"pre"`` (default): ``x + f(norm(x))`` and a final norm;
      ``"post"``: ``norm(x + f(x))`` and no final norm (the last block's
      output is already normalised), as the original Transformer.

  Returns:
    An ``"lm"`` :class:`~lowbw.models.Model` named ``"gpt"``; its config
    holds the options that differ from their defaults.

  Raises:
    ValueError: for a non-positive size, ``heads`` not dividing ``d_model``,
      an unknown option value, and (at init) batch sequences longer than
      ``seq_len`` or token ids outside ``[0, vocab)``.

  Example:
    >>> import jax, numpy as np
    >>> model = gpt(layers=2, d_model=64, heads=4, seq_len=32, vocab=256)
    >>> batch = {"tokens": np.zeros((8, 33), np.int32)}
    >>> params = model.init(jax.random.key(0), batch)
    >>> loss, metrics = model.loss(params, batch, jax.random.key(1))
    >>> logits = model.apply(params, batch["tokens"][:, :-1])  # (8, 32, 256)
  """
  for field, value in (("layers", layers), ("d_model", d_model),
                       ("heads", heads), ("seq_len", seq_len),
                       ("vocab", vocab), ("mlp_ratio", mlp_ratio)):
    _validate.positive_int(field, value)
  options = _check_options(d_model, heads, dict(
      norm=norm, mlp=mlp, position=position, qk_norm=qk_norm,
      tie_embeddings=tie_embeddings, norm_position=norm_position))
  module = GPT(layers=layers, d_model=d_model, heads=heads, seq_len=seq_len,
               vocab=vocab, mlp_ratio=mlp_ratio, **options)
  # Only the options that differ from their defaults, so a default model's
  # config (and the checkpoints that record it) reads as before they existed.
  config = {"name": "gpt", "layers": layers, "d_model": d_model,
            "heads": heads, "seq_len": seq_len, "vocab": vocab,
            "mlp_ratio": mlp_ratio,
            **{k: v for k, v in options.items() if v != OPTIONS[k]}}
  model = _contract.wrap_module(module, "lm", "gpt", config, pooled=True)

  def init(key: PRNGKey, batch: Batch) -> Params:
    _check_token_range(batch, vocab)
    return model.init(key, batch)

  return model._replace(init=init)


def _check_options(d_model: int, heads: int,
                   options: dict[str, Any]) -> dict[str, Any]:
  """The validated block options, and ``heads`` against ``d_model`` (rotary
  positions need an even head width)."""
  checked = {}
  for field, value in options.items():
    if field in _blocks.CHOICES:
      checked[field] = _validate.one_of(field, value, _blocks.CHOICES[field])
    else:
      checked[field] = _validate.boolean(field, value)
  if d_model % heads:
    raise _validate.fail(
        "heads", heads, f"expected a divisor of d_model={d_model}")
  if checked["position"] == "rotary" and (d_model // heads) % 2:
    raise _validate.fail(
        "heads", heads, f"expected a divisor of d_model={d_model} leaving an "
        "even head width (position='rotary' rotates pairs of features)")
  return checked


def flops_per_token(config: Mapping[str, Any],
                    seq_len: int | None = None) -> int:
  """Matrix-multiply FLOPs of one trained token of a :func:`gpt`, forward
  and backward.

  Every matmul counts 2 FLOPs per multiply-add forward and twice that
  backward (the gradients with respect to both operands, the inputs of the
  first block included since the embeddings train), so 6 per multiply-add::

    6 * (layers * (4 d^2 + M + 2 T d) + d V)

  with ``4 d^2`` the attention projections (qkv and out), ``M`` the MLP's
  multiply-adds per token (GELU: ``2 f d`` with ``f = mlp_ratio d``;
  SwiGLU: ``3 f d`` with ``f = round(2/3 mlp_ratio d)``), ``2 T d`` the
  attention scores and the weighted sum of values over ``T`` positions, and
  ``d V`` the head, tied or not. The attention term counts the full T x T
  score matrix, which the model computes before masking (a causal kernel
  that skips the masked half would do about half of it). Not counted: the
  embedding lookup, positional embedding, norms, biases, activations,
  softmax and rotary, which are not matmuls.

  ``6 * param_count`` (what lowbw's clock charges per token) instead counts
  every parameter, embeddings, norms and biases included, and no attention
  term. Tied or untied, the head costs ``6 d V``; untied, the token
  embedding's ``V d`` parameters add ``6 V d`` that no matmul spends.

  Args:
    config: a gpt model's ``config`` (``model.config``); missing options take
      :func:`gpt`'s defaults.
    seq_len: positions per sequence trained on, default ``config``'s
      ``seq_len`` (the text window is usually the same).

  Returns:
    The FLOPs as an exact integer.

  Example:
    >>> flops_per_token(gpt(layers=2, d_model=128).config)
    2949120
  """
  if not isinstance(config, Mapping) or config.get("name") != "gpt":
    raise _validate.fail("config", config, "expected a gpt model's config "
                         "(name 'gpt')")
  defaults = {k: p.default
              for k, p in inspect.signature(gpt).parameters.items()}
  kwargs = {k: v for k, v in config.items() if k != "name"}
  unknown = sorted(set(kwargs) - set(defaults))
  if unknown:
    raise _validate.fail(f"config.{unknown[0]}", kwargs[unknown[0]],
                         "gpt accepts only " + ", ".join(defaults))
  gpt(**kwargs)  # validates every value
  c = {**defaults, **kwargs}
  d, t = c["d_model"], _validate.positive_int(
      "seq_len", c["seq_len"] if seq_len is None else seq_len)
  f = _mlp_hidden(c["mlp"], d, c["mlp_ratio"])
  mlp_macs = (3 if c["mlp"] == "swiglu" else 2) * f * d
  per_layer = 4 * d * d + mlp_macs + 2 * t * d
  return 6 * (c["layers"] * per_layer + d * c["vocab"])
