"""DeMo: decoupled momentum optimization (Peng, Quesnelle and Kingma, 2024,
arXiv 2411.19870)."""

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec
from lowbw.transforms import (UNCOMPRESSED, Codec, Compression,
                              broadcast_to_workers, compression, as_codec,
                              comm_channel, dct_top_k, num_workers,
                              participants, transmit, where_workers, worker_sum)
from lowbw.transforms._codec import check_codec
from lowbw.transforms._compression import init_residual
from lowbw.transforms._dct import dct_blocks, idct_blocks


def default_inner() -> optax.GradientTransformation:
  """DeMo's parameter step: SGD on the sign update, lr 4e-4 (the paper's
  OLMo-300M configuration), no weight decay."""
  return _optim.inner(_optim.DEMO_INNER)


COMBINES = ("sum", "mean")


def _mean_of_senders(state_W, grads_W, chunk: int, k: int):
  """DeMo's step with each DCT coefficient averaged over the workers that
  sent it: (the sign update, the new message states). The same selection
  and error feedback as the sum (momentum <- decay m + g, decay the state's
  beta; the top-k coefficients of each block are sent and leave it), but
  the receivers divide each summed coefficient by its number of senders
  before the inverse DCT."""
  active_W = participants()
  update, new_W = [], []
  for m, g in zip(jax.tree.leaves(state_W.residual), jax.tree.leaves(grads_W)):
    acc = state_W.beta.reshape((-1,) + (1,) * (m.ndim - 1)) * m + g
    coeffs = jax.vmap(lambda x: dct_blocks(x, chunk))(acc)
    keep = min(k, coeffs.shape[-1])
    top = jax.lax.top_k(jnp.abs(coeffs), keep)[1]
    mask = jnp.zeros(coeffs.shape, bool).at[
        jnp.arange(coeffs.shape[0])[:, None, None],
        jnp.arange(coeffs.shape[1])[None, :, None], top].set(True)
    sent = jnp.where(mask, coeffs, 0.0)
    new_W.append(acc - jax.vmap(
        lambda c: idct_blocks(c, acc.shape[1:], chunk))(sent))
    total, senders = worker_sum((sent, mask.astype(jnp.float32)))
    mean = total / jnp.maximum(senders, 1.0)
    update.append(jnp.sign(idct_blocks(mean, acc.shape[1:], chunk)))
  treedef = jax.tree.structure(grads_W)
  new = state_W._replace(residual=jax.tree.unflatten(treedef, new_W),
                         count=state_W.count + 1)
  if active_W is not None:  # the others sent nothing: their momenta stay
    new = where_workers(active_W, new, state_W)
  return jax.tree.unflatten(treedef, update), new


def _codec_of(codec, chunk: int, k: int) -> Codec:
  """The momentum's codec: ``dct_top_k(chunk, k)``, or the user's (then
  chunk and k stay at their defaults); never none."""
  if isinstance(codec, str) and codec.strip().lower() in UNCOMPRESSED:
    raise _validate.fail("codec", codec, "DeMo always sends compressed "
                         "momentum; leave codec unset for dct_top_k(chunk, k)")
  codec = as_codec("codec", codec)
  if codec is None:
    return dct_top_k(chunk, k)
  for field, value, default in (("chunk", chunk, 64), ("k", k, 32)):
    if value != default:
      raise _validate.fail(field, value, "set it inside codec= instead "
                           "(codec replaces dct_top_k(chunk, k))")
  check_codec("codec", codec, optional=False)
  return codec


def _combine_of(combine: str | None, codec: Codec) -> str:
  """How the workers' components combine: "mean" needs a plain DCT codec
  (and is its default), "sum" is any other's."""
  plain_dct = codec.config.get("codec") == "dct_top_k"
  combine = _validate.one_of(
      "combine", ("mean" if plain_dct else "sum") if combine is None
      else combine, COMBINES)
  if combine == "mean" and not plain_dct:
    raise _validate.fail("combine", combine, "averages DCT coefficients "
                         f"over their senders; codec {codec.name!r} is not "
                         "a plain dct_top_k (its later stages would be "
                         "skipped)")
  return combine


def _init(inner: optax.GradientTransformation, comp: Compression):
  def init(params, num_workers_, key):
    state = _base.inner_init(inner, params, num_workers_, key, ())
    return state._replace(comm=init_residual(comp, state.params_W))

  return init


def _local(inner: optax.GradientTransformation, comp: Compression,
           chunk_k: tuple[int, int] | None):
  """DeMo's step; ``chunk_k``: the DCT's (chunk, k) when each coefficient
  is averaged over its senders, None for the sum of the decoded
  components."""

  def local(state, grads_W):
    if chunk_k is not None:
      update, momentum_W = _mean_of_senders(state.comm, grads_W, *chunk_k)
    else:
      sent_W, momentum_W = transmit(comp, grads_W, state.comm,
                                    _base.comm_key(state))
      # Only the participating workers' components are gathered and summed.
      update = jax.tree.map(jnp.sign, worker_sum(sent_W))
    state = state._replace(comm=momentum_W)
    state = _base.inner_update(
        inner, state, broadcast_to_workers(update, num_workers(grads_W)))
    return state, _base.events(momentum_components=1)

  return local


def _channels(comp: Compression):
  def channels(params, num_workers_):
    return {"momentum_components": comm_channel(comp, params, num_workers_)}

  return channels


def _global_params(state):
  # Every worker applies the same update: the workers stay identical.
  return jax.tree.map(lambda x: x[0], state.params_W)


def demo(
    inner: optax.GradientTransformation | None = None,
    decay: float = 0.999,
    chunk: int = 64,
    k: int = 32,
    codec: Codec | str | None = None,
    weight_decay: float = 0.0,
    combine: str | None = None,
) -> _base.Strategy:
  """DeMo: every step, each worker shares only the fast components of its
  momentum.

  Per step and worker w (arXiv 2411.19870, Algorithm 1):

    m_w <- decay * m_w + g_w                  (local, decoupled momentum)
    c_w  = DCT-top-k(m_w)                     (chunk 64, k 32 per block)
    m_w <- m_w - decode(c_w)                  (what is sent leaves m_w)
    u    = sign(sum_v decode(c_v))            (after an all-gather of all c_v)
    theta <- inner(u + wd * theta)            (SGD: theta (1 - lr wd) - lr u)

  The first three lines are error feedback with beta = decay, so the momentum
  is exactly an error-feedback residual. Every worker applies the same u, so
  the workers stay identical. The reference implementation scales g by the
  learning rate before adding it; with a constant learning rate the sign
  update is the same.

  Defaults are the paper's: decay 0.999, chunk 64, k 32; lr 4e-4 and no weight
  decay as in its OLMo-300M run. ``weight_decay`` is the reference
  implementation's decoupled decay (EXO Gym's DeMo knob): the parameters
  shrink by lr x wd every step, exactly so with the default SGD inner.

  Bytes per worker and step: per tensor, blocks x min(k, block size) x
  (4 bytes of value + 1 or 2 bytes of in-block index for chunk <= 256);
  all-gathered, so each
  worker sends (W-1) x payload.

  Args:
    inner: optimizer applied to the sign update; default SGD, lr 4e-4.
    decay: momentum decay in [0, 1).
    chunk: DCT block side (largest divisor of each axis not above it).
    k: DCT coefficients kept per block.
    codec: replaces ``dct_top_k(chunk, k)`` by any codec or spec string
      (e.g. ``dct_top_k() | quantize(8)`` or ``"dct:64:32,quant:8"``); leave
      chunk and k at their defaults then. None: ``dct_top_k(chunk, k)``.
    weight_decay: decoupled weight decay wd >= 0, added to the sign update
      as wd x theta before ``inner``.
    combine: "mean": each DCT coefficient averaged over the workers that
      sent it, as the reference implementation does, before the inverse
      transform and the sign (the DCT codec only); or "sum" (the paper's
      Algorithm 1: the sum of the decoded components). None: "mean" with
      the DCT codec, "sum" with any other.

  Example:
    >>> strategy = lowbw.strategies.demo(optax.sgd(1e-3), k=16)
  """
  inner = _base.optimizer("inner", inner, default_inner)
  weight_decay = _validate.non_negative("weight_decay", weight_decay)
  if weight_decay:
    inner = optax.chain(optax.add_decayed_weights(weight_decay), inner)
  decay = _validate.momentum("decay", decay)
  codec = _codec_of(codec, chunk, k)
  combine = _combine_of(combine, codec)
  # The momentum is the error-feedback residual with beta = decay: the same
  # message path as every strategy's (its state's beta is the ef_beta knob).
  comp = compression(codec, decay)
  chunk_k = (codec.config["chunk"], codec.config["k"]) if combine == "mean" \
      else None
  return _base.make(
      "demo", 1, _base.Parts(_init(inner, comp), _local(inner, comp, chunk_k),
                             None, _global_params, _channels(comp)),
      {"name": "demo", "inner": _base.describe(inner), "decay": decay,
       "codec": codec.name,
       **({"combine": combine} if combine != "sum" else {}),
       **({"weight_decay": weight_decay} if weight_decay else {})})


SPEC = _spec.spec(
    demo, inner=_optim.DEMO_INNER, outer=None,
    paper="Peng et al. 2024, arXiv 2411.19870",
    where="Algorithm 1: decay 0.999, DCT chunk 64, top-32, sign step; combine mean as in the authors' reference code",
    help={"decay": "momentum decay in [0, 1) (the error-feedback beta)",
          "chunk": "DCT block side",
          "k": "DCT coefficients kept per block",
          "codec": "replaces dct_top_k(chunk, k)",
          "weight_decay": "decoupled weight decay of the sign step, >= 0",
          "combine": "mean: each DCT coefficient averaged over its "
                     "senders (the reference's; default with the DCT "
                     "codec), or sum the workers' DCT components "
                     "(default with any other codec)"},
    choices={"combine": COMBINES})
