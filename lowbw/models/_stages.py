"""A model split into pipeline stages: S functions that, composed, compute
the model's loss, with a hook between consecutive stages where a pipeline
sends the activations forward and their gradients back.

The stages read ONE parameter tree, the unsplit model's: each uses the
parameters it owns and ignores the rest, so a staged model trains under any
strategy exactly as the unsplit one (same ``init``, same parameter names).
The built-in :func:`~lowbw.models.gpt` splits by blocks (:func:`split`);
any model splits from a list of stage functions (:func:`from_stages`).
"""

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lowbw import _validate
from lowbw._types import Array, Batch, Params, PRNGKey
from lowbw.models import _contract, _gpt, _moe_gpt


class Stages(NamedTuple):
  """A model split into ``len(stages)`` pipeline stages.

  Attributes:
    model: the unsplit :class:`~lowbw.models.Model` (its ``init``, task,
      name and config are the staged model's).
    stages: the stage functions, each ``stage(params, x, batch)`` on the
      whole parameter tree: stage 0 gets ``x=None`` and reads its inputs
      from ``batch``; every stage but the last returns the activation it
      sends to the next (an array), or ``(activation, side)``: the
      boundary acts on the activation and the next stage gets ``(what the
      boundary gave, side)``, ``side`` holding terms of the loss a real
      stage keeps beside the activations (the MoE gpt's router statistics:
      each stage's own loss terms, whose gradients stay on it; not boundary
      bytes); the last returns ``(loss, metrics)`` as ``Model.loss`` does
      (it reads its labels from ``batch``).
    owners: for each stage, the top-level parameter names it reads (the
      built-in gpt's; ``None`` when a generic split does not say). A name
      read by two stages (gpt's tied ``tok_embed``) is listed in both.
  """
  model: _contract.Model
  stages: tuple[Callable[..., Any], ...]
  owners: tuple[tuple[str, ...], ...] | None = None


def from_stages(model: _contract.Model,
                stages: Sequence[Callable[..., Any]]) -> Stages:
  """Any model split by the user: ``stages`` as :class:`Stages` describes
  them, composing to ``model.loss`` (which lowbw cannot check for you:
  compare ``staged_loss(...)`` with ``model.loss`` on a batch).

  Example:
    >>> def first(params, x, batch):
    ...   return jnp.tanh(batch["x"] @ params["w1"])
    >>> def last(params, x, batch):
    ...   return my_loss(x @ params["w2"], batch["y"])  # doctest: +SKIP
    >>> staged = from_stages(model, [first, last])  # doctest: +SKIP
  """
  if not isinstance(model, _contract.Model):
    raise _validate.fail("model", type(model).__name__,
                         "expected a lowbw Model (lowbw.models.as_model)")
  if (isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence)
      or not stages or not all(callable(f) for f in stages)):
    raise _validate.fail("stages", stages, "expected a non-empty list of "
                         "functions stage(params, x, batch)")
  return Stages(model, tuple(stages))


def block_ranges(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
  """The blocks of each stage, ``(first, end)``: contiguous and as even as
  possible, the first ``layers % stages`` stages one block more.

  Example:
    >>> block_ranges(5, 2)
    ((0, 3), (3, 5))
  """
  layers = _validate.positive_int("layers", layers)
  stages = _validate.positive_int("stages", stages)
  if stages > layers:
    raise _validate.fail("stages", stages, f"expected at most layers="
                         f"{layers}: each stage holds at least one block")
  base, extra = divmod(layers, stages)
  ends, end = [], 0
  for s in range(stages):
    end += base + (s < extra)
    ends.append(end)
  return tuple(zip([0] + ends[:-1], ends))


def split(model: _contract.Model, stages: int) -> Stages:
  """A built-in model split into ``stages`` pipeline stages by blocks.

  The gpt's blocks are shared out by :func:`block_ranges`: stage 0 holds
  the embeddings and the first blocks, the last stage the last blocks, the
  final norm and the head; each boundary carries the residual stream
  ``(b, T, d_model)``. With tied embeddings the last stage reads
  ``tok_embed`` too (a real pipeline keeps a copy there and sums the two
  stages' gradients for it). Other models: :func:`from_stages`.

  Raises:
    ValueError: naming ``stages`` for a model lowbw cannot split or more
      stages than blocks.

  Example:
    >>> staged = split(gpt(layers=4, d_model=16, heads=2), 2)
    >>> loss, metrics = staged_loss(staged)(params, batch, key)  # doctest: +SKIP
  """
  if not isinstance(model, _contract.Model) or model.name not in (
      "gpt", "moe_gpt"):
    name = getattr(model, "name", type(model).__name__)
    raise _validate.fail(
        "stages", stages, f"lowbw splits the built-in gpt and moe_gpt by "
        f"blocks; model {name!r} has no built-in split "
        "(lowbw.models.from_stages takes a list of stage functions)")
  if model.name == "moe_gpt":
    return _split_moe(model, stages)
  config = {k: v for k, v in model.config.items() if k != "name"}
  ranges = block_ranges(config["layers"], stages)
  parts = tuple(_gpt_stage(_gpt.GPT(**config, part=r), s == 0,
                           s == len(ranges) - 1)
                for s, r in enumerate(ranges))
  return Stages(model, parts, _gpt_owners(config, ranges))


def _gpt_stage(module: _gpt.GPT, first: bool, last: bool) -> Callable:
  """One gpt stage: its blocks (and embeddings, head) on the residual
  stream."""

  def stage(params: Params, x: Array | None, batch: Batch) -> Any:
    if first:
      x, _ = _contract._lm_split(batch)
    out = module.apply({"params": params}, x)
    if not last:
      return out
    return _contract._cross_entropy(out, _contract._lm_split(batch)[1])

  return stage


_MOE_COEFS = ("balance_coef", "router_z_coef", "output_z_coef")


def _split_moe(model: _contract.Model, stages: int) -> Stages:
  """The MoE gpt by blocks, as the gpt: every stage but the last sends
  ``(residual stream, its blocks' router statistics summed)``, the
  statistics added up along the stages (``side``, past the codecs); the
  last stage makes the whole model's loss of them."""
  config = model.config
  shape = {k: config[k] for k in ("layers", "d_model", "heads", "seq_len",
                                   "vocab", "num_experts", "top_k",
                                   "expert_hidden")}
  coefs = tuple(config[k] for k in _MOE_COEFS)
  ranges = block_ranges(config["layers"], stages)
  parts = tuple(_moe_stage(_moe_gpt.MoEGPT(**shape, part=r), coefs,
                           s == 0, s == len(ranges) - 1)
                for s, r in enumerate(ranges))
  owners = tuple((("tok_embed",) if s == 0 else ()) +
                 tuple(f"block_{i}" for i in range(lo, hi)) +
                 (("norm_final", "head") if s == len(ranges) - 1 else ())
                 for s, (lo, hi) in enumerate(ranges))
  return Stages(model, parts, owners)


def _moe_stage(module: _moe_gpt.MoEGPT, coefs: tuple, first: bool,
               last: bool) -> Callable:
  """One MoE gpt stage: its blocks on the residual stream, its router
  statistics added to the earlier stages'."""

  def stage(params: Params, x: Any, batch: Batch) -> Any:
    if first:
      x, before = _contract._lm_split(batch)[0], None
    else:
      x, before = x
    out, stats = module.apply({"params": params}, x)
    if before is not None:
      stats = jax.tree.map(jnp.add, before, stats)
    if not last:
      return out, stats
    labels = _contract._lm_split(batch)[1]
    return _moe_gpt.lm_loss_of(
        out, labels, _moe_gpt.layer_stats(stats, module.layers), coefs,
        module.num_experts)

  return stage


def _gpt_owners(config: dict[str, Any],
                ranges: tuple[tuple[int, int], ...]) -> tuple:
  first = ["tok_embed"] + (
      ["pos_embed"] if config.get("position", "learned") == "learned" else [])
  last = (["ln_final"] if config.get("norm_position", "pre") == "pre"
          else []) + (["tok_embed"] if config.get("tie_embeddings") else
                      ["head"])
  owners = []
  for s, (lo, hi) in enumerate(ranges):
    names = [f"block_{i}" for i in range(lo, hi)]
    names = (first if s == 0 else []) + names + (
        last if s == len(ranges) - 1 else [])
    owners.append(tuple(names))
  return tuple(owners)


# ``boundary(x, i, key) -> x``: what stage i + 1 receives of stage i's
# activation (and, through its gradient, what stage i receives back).
Boundary = Callable[[Array, int, PRNGKey], Array]


def staged_loss(staged: Stages, boundary: Boundary | None = None,
                micro_batches: int = 1
                ) -> Callable[[Params, Batch, PRNGKey], tuple]:
  """``loss(params, batch, key)`` through the stages, ``boundary(x, i,
  key_i)`` between stage ``i`` and ``i + 1`` (default: the activation as
  it is, so the loss and its gradients are the unsplit model's).
  ``key_i`` is ``fold_in(key, i)`` (``key`` None: ``jax.random.key(0)``).

  ``micro_batches`` M > 1: the batch is cut into M equal micro-batches
  (consecutive examples), each sent through the stages and the boundary
  on its own with the key ``fold_in(key, m)``; the loss and metrics are
  their means (the whole batch's for a mean loss without codecs). A batch
  whose size M does not divide (an evaluation batch) goes through as one.
  """
  if not isinstance(staged, Stages):
    raise _validate.fail("staged", type(staged).__name__,
                         "expected lowbw.models.split(...) or from_stages")
  micro_batches = _validate.positive_int("micro_batches", micro_batches)
  if boundary is None:
    boundary = lambda x, i, key: x  # noqa: E731
  loss = _through_stages(staged, boundary)
  return loss if micro_batches == 1 else _micro_batched(loss, micro_batches)


def _micro_batched(loss: Callable, m: int) -> Callable:
  """``loss`` as the mean of its values on ``m`` micro-batches (vmapped:
  each micro-batch's boundary codecs see its activations only)."""

  def mean_loss(params: Params, batch: Batch, key: PRNGKey | None = None):
    sizes = {x.shape[0] for x in jax.tree.leaves(batch)}
    (b,) = sizes if len(sizes) == 1 else (None,)
    if b is None or b % m:
      return loss(params, batch, key)
    parts = jax.tree.map(lambda x: x.reshape(m, b // m, *x.shape[1:]), batch)
    base = jax.random.key(0) if key is None else key
    value, metrics = jax.vmap(
        lambda part, i: loss(params, part, jax.random.fold_in(base, i)))(
            parts, jnp.arange(m))
    return value.mean(), jax.tree.map(lambda v: v.mean(0), metrics)

  return mean_loss


def _through_stages(staged: Stages, boundary: Boundary) -> Callable:

  def loss(params: Params, batch: Batch, key: PRNGKey | None = None):
    x = None
    for i, stage in enumerate(staged.stages):
      if i:
        base = jax.random.key(0) if key is None else key
        sent, side = x if isinstance(x, tuple) else (x, None)
        sent = boundary(sent, i - 1, jax.random.fold_in(base, i - 1))
        x = sent if side is None else (sent, side)
      x = stage(params, x, batch)
    return x

  return loss


def staged_model(staged: Stages, boundary: Boundary | None = None,
                 micro_batches: int = 1) -> _contract.Model:
  """The unsplit model with its loss computed through the stages
  (:func:`staged_loss`, with ``micro_batches``): same ``init``,
  parameters, ``apply`` and config, so any strategy trains it unchanged.
  With a ``boundary`` (codecs) it is not pooled: each worker's activations
  are compressed as its own stages send them, so W workers' batches must
  not be scored as one."""
  return staged.model._replace(
      loss=staged_loss(staged, boundary, micro_batches),
      pooled=staged.model.pooled and boundary is None)


def stage_flops_per_token(config: dict, stages: int,
                          seq_len: int | None = None) -> tuple[int, ...]:
  """Each stage's share of a :func:`~lowbw.models.gpt`'s FLOPs per token
  (``gpt_flops_per_token``'s terms) when :func:`split` cuts it in
  ``stages``: its blocks, and the head on the last stage (the embedding
  lookup is no matmul). They sum to the whole model's."""
  one = _gpt.flops_per_token({**config, "layers": 1}, seq_len)
  block = _gpt.flops_per_token({**config, "layers": 2}, seq_len) - one
  head = one - block
  ranges = block_ranges(config["layers"], stages)
  return tuple((hi - lo) * block + (head if s == stages - 1 else 0)
               for s, (lo, hi) in enumerate(ranges))


def stage_flops(model: _contract.Model, stages: int) -> tuple[float, ...]:
  """Each stage's FLOPs per token when :func:`split` cuts ``model`` in
  ``stages``, in the unit the clock charges the whole model: a gpt's
  matmul FLOPs (:func:`stage_flops_per_token`); for the MoE gpt, whose
  clock charges 6 FLOPs per parameter and token (``flops_per_token``),
  6 per parameter the stage reads (its ``owners``). They sum to the
  whole model's."""
  if model.name == "gpt":
    return stage_flops_per_token(model.config, stages)
  staged = split(model, stages)
  tokens = jax.ShapeDtypeStruct((1, model.config["seq_len"] + 1), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), {"tokens": tokens})
  return tuple(6.0 * sum(x.size for name in names
                         for x in jax.tree.leaves(params[name]))
               for names in staged.owners)


def activation_shapes(staged: Stages, params: Params,
                      batch: Batch) -> tuple[jax.ShapeDtypeStruct, ...]:
  """The activation each boundary carries for ``batch`` (one micro-batch),
  by an abstract evaluation of the stages (nothing runs)."""

  def sent(params, batch):
    outs, x = [], None
    for stage in staged.stages[:-1]:
      x = stage(params, x, batch)
      outs.append(x[0] if isinstance(x, tuple) else x)
    return tuple(outs)

  return jax.eval_shape(sent, params, batch)
