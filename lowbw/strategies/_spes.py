"""SPES: sparse expert synchronisation (Zhang et al., 2026, arXiv 2602.11543)
for mixture-of-experts models.

Every worker holds the whole model but trains only the shared parameters and
the experts it owns (``_experts``): its inner optimizer state exists for
those alone, and the other experts stay frozen, bit for bit, until the sync.
Every H steps (Appendix A, eqs. 8-10) the shared parameters are averaged and
each expert is taken from its owner: the workers send the pseudo-gradient of
what they trained (through the codec, with error feedback if asked), and the
outer optimizer (plain averaging by default, as in the paper) updates the
global model, which every worker restarts from. During the first
``merge_warmup_steps`` steps, every ``merge_every`` steps, the global
model's experts are merged with their most similar peers (Section 3.3,
eqs. 5-6) with a strength decaying linearly from ``merge_alpha`` to 0.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lowbw import _validate
from lowbw._types import Array, Params, PyTree
from lowbw.network import channel
from lowbw.strategies import _base, _experts, _optim, _spec
from lowbw.transforms import (Codec, Compression, broadcast_to_workers,
                              collective, comm_channel, compression,
                              num_workers, per_worker, transmit, worker_mean,
                              worker_sum)
from lowbw.transforms._compression import init_residual, message_bytes


class SpesInner(NamedTuple):
  """A SPES worker's own state.

  Attributes:
    opt: the inner optimizer's state, for the shared parameters and the
      owned experts only (expert leaves (W, k, ...)).
    owned_W: int32 (W, k): the experts each worker owns.
  """

  opt: PyTree
  owned_W: Array


class SpesComm(NamedTuple):
  """The server's state: the global model, the outer optimizer's state and
  the workers' message states (error-feedback residuals, shaped like what
  each worker trains)."""

  global_params: Params
  outer_state: PyTree
  residual_W: PyTree


class Layout(NamedTuple):
  """What a model's parameters split into, for W workers."""

  flags: PyTree          # True for expert leaves
  owned: np.ndarray      # int32 (W, k)

  def view(self, params: Params) -> tuple[list, list, list]:
    """Shape lists: the shared leaves, one worker's owned experts, and
    every expert (what a worker sends, and the experts it receives)."""
    k = self.owned.shape[1]
    pairs = list(zip(jax.tree.leaves(jax.eval_shape(lambda p: p, params)),
                     jax.tree.leaves(self.flags)))
    experts = [s for s, f in pairs if f]
    mine = [jax.ShapeDtypeStruct((k,) + s.shape[1:], s.dtype)
            for s in experts]
    return [s for s, f in pairs if not f], mine, experts


def merge_alpha_at(step: Array, alpha: float, warmup: int,
                   every: int) -> Array:
  """The merge strength at ``step``: alpha (1 - step / warmup) at multiples
  of ``every`` within the warm-up, else 0 (no merge)."""
  if warmup == 0:
    return jnp.float32(0.0)
  t = step.astype(jnp.float32)
  a = alpha * (1.0 - jnp.minimum(t / warmup, 1.0))
  return jnp.where((step % every == 0) & (step > 0), a, 0.0).astype(
      jnp.float32)


def round_bytes(params: Params, num_workers_: int, codec: Codec | str | None
                = None, experts_per_worker: int | None = None,
                assignment=None) -> dict[str, int]:
  """Exact bytes one worker moves per SPES round, and DiLoCo's on the same
  model, with a parameter server: SPES uploads the shared parameters and
  its own experts and downloads the whole model; DiLoCo both ways the whole
  model. The one byte formula the strategy's channels, the docs and the
  experiment read: it is read off the strategies' channels."""
  comp = compression(codec, None)
  ch = _channels(comp, experts_per_worker, assignment)(params, num_workers_)
  full = comm_channel(comp, params, num_workers_).payload_bytes  # DiLoCo's
  return {"spes_uplink": ch["shared"].payload_bytes +
          ch["experts"].payload_bytes,
          # the shared mean, and every expert
          "spes_downlink": ch["shared"].payload_bytes +
          ch["experts"].down_bytes,
          "diloco_uplink": full, "diloco_downlink": full}


def layout(params: Params, W: int, experts_per_worker, owners) -> Layout:
  E = _experts.num_experts(params)
  return Layout(_experts.expert_flags(params),
                _experts.assignment(E, W, experts_per_worker, owners))


def _channels(comp: Compression, experts_per_worker, owners):
  """Two messages per sync: the shared parameters' pseudo-gradient
  (all-reduced; with a parameter server, uploaded and the mean downloaded)
  and the owned experts' (all-gathered: each expert comes from one worker;
  with a parameter server, uploaded, and every expert downloaded)."""
  def channels(params, num_workers_):
    shared, mine, every = layout(params, num_workers_, experts_per_worker,
                                 owners).view(params)
    return {"shared": channel(collective(comp.codec),
                              message_bytes(comp, shared), num_workers_),
            "experts": channel("all_gather", message_bytes(comp, mine),
                               num_workers_)._replace(
                down_bytes=message_bytes(comp, every))}
  return channels


def _init(inner, outer, comp: Compression, experts_per_worker, owners):
  def init(params, num_workers_, key):
    lay = layout(params, num_workers_, experts_per_worker, owners)
    params_W = broadcast_to_workers(params, num_workers_)
    owned_W = jnp.asarray(lay.owned)
    view_W = _experts.owned(params_W, lay.flags, owned_W)
    return _base.StrategyState(
        step=jnp.zeros((), jnp.int32), params_W=params_W,
        inner_W=SpesInner(per_worker(inner).init(view_W), owned_W),
        comm=SpesComm(params, outer.init(params),
                      init_residual(comp, view_W)),
        key=key)
  return init


def _local(inner):
  def local(state, grads_W):
    flags = _experts.expert_flags(state.params_W)
    owned_W = state.inner_W.owned_W
    view_W = _experts.owned(state.params_W, flags, owned_W)
    updates_W, opt_W = per_worker(inner).update(
        _experts.owned(grads_W, flags, owned_W), state.inner_W.opt, view_W)
    view_W = optax.apply_updates(view_W, updates_W)
    return state._replace(
        step=state.step + 1,
        params_W=_experts.put_owned(state.params_W, view_W, flags, owned_W),
        inner_W=SpesInner(opt_W, owned_W)), {}
  return local


def _pseudo_gradient(sent_W: PyTree, flags: PyTree, owned_W: Array, E: int):
  """The mean over (participating) workers of the shared leaves; each
  expert's from its owner (rows placed at the owner's experts, zeros
  elsewhere, summed: exact). Also bool (E,): the experts whose owner took
  part."""
  def one(x_W, flag):
    if not flag:
      return worker_mean(x_W)
    return worker_sum(jax.vmap(_experts.at_experts(E))(x_W, owned_W))
  live_E = worker_sum(jax.nn.one_hot(owned_W, E, dtype=jnp.int32).sum(1)) > 0
  return jax.tree.map(one, sent_W, flags), live_E


def _keep_down_owners(flags, new, old, live_E):
  """Experts whose owner did not take part stay at their last global value."""
  def one(f, n, o):
    if not f:
      return n
    return jnp.where(live_E.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)
  return jax.tree.map(one, flags, new, old)


def _sync(outer, comp: Compression, merging: tuple[float, int, int, int]):
  alpha, warmup, every, top_k = merging

  def sync(state):
    c = state.comm
    flags = _experts.expert_flags(c.global_params)
    owned_W = state.inner_W.owned_W
    E = _experts.num_experts(c.global_params)
    W = num_workers(state.params_W)
    delta_W = optax.tree.sub(broadcast_to_workers(c.global_params, W),
                             state.params_W)
    sent_W, residual_W = transmit(
        comp, _experts.owned(delta_W, flags, owned_W), c.residual_W,
        _base.comm_key(state))
    pseudo_grad, live_E = _pseudo_gradient(sent_W, flags, owned_W, E)
    updates, outer_state = outer.update(pseudo_grad, c.outer_state,
                                        c.global_params)
    new = _keep_down_owners(flags, optax.apply_updates(c.global_params,
                                                       updates),
                            c.global_params, live_E)
    a = merge_alpha_at(state.step, alpha, warmup, every)
    new = jax.lax.cond(a > 0, lambda p: _experts.merge(p, a, top_k),
                       lambda p: p, new)
    return state._replace(
        params_W=broadcast_to_workers(new, W),
        comm=SpesComm(new, outer_state, residual_W)), {
            **_base.events(shared=1, experts=1),
            **_base.metrics(pseudo_grad_norm=optax.tree.norm(pseudo_grad),
                            merge_alpha=a)}

  return sync


def _check_merging(H, warmup, every, alpha, top_k):
  warmup = _validate.non_negative_int("merge_warmup_steps", warmup)
  every = _validate.positive_int("merge_every", every)
  alpha = _validate.fraction("merge_alpha", alpha, low_open=False)
  top_k = _validate.positive_int("merge_top_k", top_k)
  if warmup and every % H:
    raise _validate.fail(
        "merge_every", every, f"experts merge at a sync: expected a multiple "
        f"of H={H} (or merge_warmup_steps=0 for no merging)")
  return alpha, warmup, every, top_k


def _check_top_k(params, top_k: int, warmup: int) -> None:
  E = _experts.num_experts(params)
  if warmup and top_k > E - 1:
    raise _validate.fail("merge_top_k", top_k, f"each expert merges with "
                         f"up to E - 1 = {E - 1} peers")


def spes(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    experts_per_worker: int | None = None,
    assignment: tuple | None = None,
    merge_warmup_steps: int = 12500,
    merge_every: int = 500,
    merge_alpha: float = 0.1,
    merge_top_k: int = 4,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
) -> _base.Strategy:
  """SPES: each worker trains the shared parameters and its own experts;
  shared averaged, experts taken from their owners every H steps.

  Sparse expert synchronisation for mixture-of-experts models (Zhang et al.,
  2026, arXiv 2602.11543; the model needs expert weights stacked under an
  ``experts`` entry, as ``models.moe_gpt`` has). Appendix A's update rule:
  every worker starts a round from the global model and runs H inner steps
  on the shared parameters and its experts only, the others frozen (no
  update, no optimizer state). At the sync the shared parameters' mean and
  each expert's owner's value make the new global model (through ``outer``,
  default plain averaging, the paper's; a DiLoCo outer optimizer is allowed).
  A worker that misses a sync leaves its experts at their last global value.

  Expert-merging warm-up (Section 3.3, eqs. 5-6): at syncs at multiples of
  ``merge_every`` within the first ``merge_warmup_steps``, every expert i
  moves to theta_i + a (mean over its ``merge_top_k`` most similar peers
  of theta_j - theta_i), peers by cosine similarity of the gate
  projections, a = ``merge_alpha`` (1 - step / ``merge_warmup_steps``).
  Defaults are the paper's (H 100; 12,500 warm-up steps, every 500, alpha
  0.1, top 4; inner AdamW lr 5e-4, weight decay 0.1, its 1B configuration).

  Bytes per worker and round (``round_bytes``): up, the shared parameters
  and k = E/W experts; down, the whole model; DiLoCo: the whole model both
  ways. Memory per worker (``docs/strategies/spes.md``): parameters for the
  whole model, optimizer state (and gradients on a real node) for the
  shared parameters and k experts only.

  Args:
    inner: per-worker optimizer of what the worker trains.
    outer: optimizer of the global model fed the pseudo-gradient; None:
      averaging (SGD lr 1).
    H: inner steps per sync.
    experts_per_worker: k; None: E / W. Worker w owns experts w*k..w*k+k-1.
    assignment: instead, the owner of each expert (E worker ids, every
      worker owning the same number).
    merge_warmup_steps: steps with expert merging (0: none).
    merge_every: steps between merges (a multiple of H).
    merge_alpha: merge strength at step 0, in [0, 1].
    merge_top_k: peers each expert merges with (<= E - 1).
    codec, error_feedback: compression of the pseudo-gradients, as DiLoCo.

  Example:
    >>> model = lowbw.models.moe_gpt(num_experts=8)
    >>> strategy = lowbw.strategies.spes(H=50, merge_warmup_steps=250,
    ...                                  merge_every=50)
  """
  inner = _base.optimizer("inner", inner, lambda: _optim.inner(SPES_INNER))
  outer = _base.optimizer("outer", outer, lambda: _optim.outer(
      _optim.AVERAGING))
  H = _validate.positive_int("H", H)
  if experts_per_worker is not None:
    experts_per_worker = _validate.positive_int("experts_per_worker",
                                                experts_per_worker)
    if assignment is not None:
      raise _validate.fail("assignment", assignment, "give either "
                           "experts_per_worker or assignment, not both")
  if assignment is not None:
    assignment = _owners(assignment)
  merging = _check_merging(H, merge_warmup_steps, merge_every, merge_alpha,
                           merge_top_k)
  comp = compression(codec, error_feedback)
  init = _init(inner, outer, comp, experts_per_worker, assignment)

  def checked_init(params, num_workers_, key):
    _check_top_k(params, merging[3], merging[1])
    return init(params, num_workers_, key)

  return _base.make(
      "spes", H, _base.Parts(
          checked_init, _local(inner), _sync(outer, comp, merging),
          lambda s: s.comm.global_params,
          _channels(comp, experts_per_worker, assignment)),
      {"name": "spes", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H,
       "experts_per_worker": experts_per_worker,
       "assignment": None if assignment is None else list(assignment),
       "merge_warmup_steps": merging[1], "merge_every": merging[2],
       "merge_alpha": merging[0], "merge_top_k": merging[3], **comp.config},
      outer_places={"outer": "outer_state"},
      inner=inner)


def _owners(assignment) -> tuple[int, ...]:
  if isinstance(assignment, (str, bytes)) or not hasattr(assignment,
                                                         "__len__"):
    raise _validate.fail("assignment", assignment, "expected a sequence of "
                         "worker ids, one per expert")
  values = list(np.asarray(assignment).reshape(-1).tolist())
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
    raise _validate.fail("assignment", assignment, "expected integer worker "
                         "ids, one per expert")
  return tuple(values)


# SPES's 1B configuration (Appendix B, Table A1, and the authors' config for
# it): AdamW lr 5e-4, weight decay 0.1, betas (0.9, 0.95), gradients
# clipped at 1.0, a 2,000-step warm-up of 50,000 steps (4 %), then cosine
# to 0.1x of the peak.
SPES_INNER = _optim.Optimizer("adamw", 5e-4, weight_decay=0.1, b2=0.95,
                              max_norm=1.0, schedule="cosine", warmup=0.04,
                              min_lr_ratio=0.1)

SPEC = _spec.spec(
    spes, inner=SPES_INNER, outer=_optim.AVERAGING,
    paper="Zhang et al. 2026, arXiv 2602.11543",
    where="Appendix B (Table A1) and the authors' 1B configuration: AdamW lr 5e-4, betas (0.9, 0.95), weight decay 0.1, clipping 1.0, 2,000 warm-up steps of 50,000 then cosine to 0.1x; §4.1: merge warm-up 12,500 steps, every 500, alpha 0.1, top-4",
    help={"experts_per_worker": "experts each worker owns and trains "
                                "(default E / W)",
          "assignment": "the owner of each expert (Python only)",
          "merge_warmup_steps": "steps with expert merging (0: none)",
          "merge_every": "steps between expert merges (a multiple of H)",
          "merge_alpha": "expert-merge strength at step 0, decaying "
                         "linearly to 0 over the warm-up",
          "merge_top_k": "peers each expert merges with",
          "codec": "codec of the pseudo-gradients"},
    cli={"H": 50, "merge_warmup_steps": 250, "merge_every": 50},
    model="moe_gpt")


def moe_param_counts(layers: int, d_model: int, expert_hidden: int,
                     num_experts: int, vocab: int) -> tuple[int, int]:
  """(shared parameters, parameters of one expert over all layers) of a
  decoder-only MoE like SPES's Table 2 (untied embeddings, attention
  4 d^2 per layer, SwiGLU experts 3 d f, a router d E; norms ignored)."""
  expert = layers * 3 * d_model * expert_hidden
  shared = 2 * vocab * d_model + layers * (4 * d_model ** 2 +
                                           d_model * num_experts)
  return shared, expert


def node_bytes(shared: int, expert: int, num_experts: int,
               nodes: int) -> dict[str, float]:
  """Per node, DiLoCo against SPES, in the paper's accounting (Section 3.3,
  Efficiency Analysis): memory 16 bytes per parameter for DiLoCo (bf16
  weights and gradients, fp32 master weights and AdamW moments), 2 per
  parameter plus 14 per trained one for SPES; float32 messages, DiLoCo
  uploading and downloading the whole model, SPES uploading what it trains."""
  total = shared + num_experts * expert
  trained = shared + num_experts // nodes * expert
  return {"params": total, "trained": trained,
          "memory_diloco": 16.0 * total,
          "memory_spes": 2.0 * total + 14.0 * trained,
          "uplink_diloco": 4.0 * total, "uplink_spes": 4.0 * trained,
          "downlink": 4.0 * total,
          "comm_saving": 1 - (total + trained) / (2 * total)}
