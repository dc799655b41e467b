"""Hierarchical DiLoCo: DiLoCo inside groups of workers, and DiLoCo across
the groups (the two-tier mode of the Decentralized Training Simulator: Technical Documentation, §3.2: fast regional links inside a
region, a slow wide-area network between regions).

Workers ``[g*s, (g+1)*s)`` form group g, as the regions of
``lowbw.network.hierarchical`` do. Two tiers of outer steps:

* regional, every H steps: in each group, its workers' pseudo-gradients (the
  group's model minus each worker's parameters) are averaged over the group
  and fed to the group's own regional outer optimizer, which moves the
  group's model; the group's workers restart from it.
* global, every R regional syncs (after that round's regional step): the
  groups' pseudo-gradients (the global model minus each group's model) are
  averaged over the groups and fed to the global outer optimizer; every group
  and worker restarts from the new global model.

Every worker of a group keeps the group's model and regional outer state
(they all compute the same step, as DiLoCo's workers all compute the outer
step), so a region's global message is sent by its s workers together, each
1/s of it over its own WAN link (the channel's ``shards``). A message that
crosses no link (the regional one of a group of one worker, the global one of
a single group) is neither encoded nor counted.

Evaluation sees the mean of the groups' models (the global model right after
a global sync; with the default global averaging, what the next one makes).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.network import Channel
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import default_outer, outer_step
from lowbw.transforms import (Codec, Compression, broadcast_to_workers,
                              call_participating, comm_channel, compression,
                              group_mean, num_workers, participants, per_worker,
                              transmit, where_workers, worker_ids, worker_mean)
from lowbw.transforms._compression import init_residual
from lowbw.transforms._reductions import total_workers

_PLAIN = Compression(None, None)  # a message that crosses no link


class HierarchicalComm(NamedTuple):
  """Hierarchical DiLoCo's communication state.

  Attributes:
    global_params: the model all groups share after a global sync.
    global_outer: the global outer optimizer's state.
    group_params_W: each worker's copy of its group's model.
    regional_outer_W: each worker's copy of its group's outer state.
    regional_message_W: per-worker message state of the regional tier.
    global_message_W: per-worker message state of the global tier (the
      same within a group).
  """

  global_params: Params
  global_outer: PyTree
  group_params_W: Params
  regional_outer_W: PyTree
  regional_message_W: PyTree
  global_message_W: PyTree


def default_global_outer() -> optax.GradientTransformation:
  """Outer SGD with learning rate 1: the global model becomes the mean of
  the groups' models."""
  return _optim.outer(_optim.AVERAGING, "global_outer")


def _sizes(num_workers_: int, group_size, groups) -> tuple[int, int]:
  """(workers per group s, groups G) for W workers."""
  if group_size is not None:
    if num_workers_ % group_size:
      raise _validate.fail("group_size", group_size,
                           f"must divide workers={num_workers_}")
    return group_size, num_workers_ // group_size
  g = 2 if groups is None else groups
  if num_workers_ % g:
    raise _validate.fail("groups", g, f"must divide workers="
                         f"{num_workers_}" + (" (two groups unless "
                                              "group_size or groups is given)"
                                              if groups is None else ""))
  return num_workers_ // g, g


def _tier(comp: Compression, members: int) -> Compression:
  return comp if members > 1 else _PLAIN


def _channel(comp: Compression, params, members: int, tier: str,
             shards: int) -> Channel:
  c = comm_channel(_tier(comp, members), params, members, tier, shards)
  return c if members > 1 else c._replace(payload_bytes=0)


def _live_groups(perm, s: int):
  """bool (W,): whether any worker of each worker's group takes part (None
  without a participation mask)."""
  mask = participants()
  if mask is None:
    return None
  share = group_mean(mask.astype(jnp.float32), perm, s,
                     active_W=jnp.ones_like(mask))
  return share > 0


def _rms_norm(tree_W: PyTree):
  """sqrt of the mean over workers of each worker's squared norm."""
  sq_W = sum(jnp.sum(jnp.square(x).reshape(x.shape[0], -1), axis=1)
             for x in jax.tree.leaves(tree_W))
  return jnp.sqrt(worker_mean(sq_W))


class _Tiers(NamedTuple):
  """Hierarchical DiLoCo's validated settings, which its pieces share."""

  inner: optax.GradientTransformation
  outer: optax.GradientTransformation   # regional
  global_outer: optax.GradientTransformation
  comp: Compression                     # both tiers' messages
  H: int                                # inner steps per regional round
  R: int                                # regional syncs per global one
  group_size: int | None
  groups: int | None


def _group_settings(group_size, groups) -> tuple[int | None, int | None]:
  """(group_size, groups), each checked; at most one of them given."""
  if group_size is not None and groups is not None:
    raise _validate.fail("groups", groups, "give group_size or groups, not "
                         "both")
  if group_size is not None:
    group_size = _validate.positive_int("group_size", group_size)
  if groups is not None:
    groups = _validate.positive_int("groups", groups)
  return group_size, groups


def _init(t: _Tiers):
  def init(params, num_workers_, key):
    s, g = _sizes(num_workers_, t.group_size, t.groups)
    state = _base.inner_init(t.inner, params, num_workers_, key, ())
    params_W = state.params_W
    # A buffer of its own (the engine donates the state's buffers).
    group_W = jax.tree.map(jnp.copy, params_W)
    return state._replace(comm=HierarchicalComm(
        params, t.global_outer.init(params), group_W,
        per_worker(t.outer).init(params_W),
        init_residual(_tier(t.comp, s), params_W),
        init_residual(_tier(t.comp, g), params_W)))

  return init


def _regional(t: _Tiers, state, s: int):
  """Each group's outer step on its workers' mean pseudo-gradient; the
  group's workers restart from the group's model. Returns (state, the RMS
  over workers of the mean's norm)."""
  c = state.comm
  perm = jnp.arange(total_workers(state.params_W))
  delta_W = optax.tree.sub(c.group_params_W, state.params_W)
  sent_W, message_W = transmit(_tier(t.comp, s), delta_W,
                               c.regional_message_W, _base.comm_key(state))
  mean_W = group_mean(sent_W, perm, s)
  updates_W, outer_W = per_worker(t.outer).update(
      mean_W, c.regional_outer_W, c.group_params_W)
  group_W = optax.apply_updates(c.group_params_W, updates_W)
  live_W = _live_groups(perm, s)
  if live_W is not None:  # a group nobody speaks for keeps its model
    group_W = where_workers(live_W, group_W, c.group_params_W)
    outer_W = where_workers(live_W, outer_W, c.regional_outer_W)
  return state._replace(params_W=group_W, comm=c._replace(
      group_params_W=group_W, regional_outer_W=outer_W,
      regional_message_W=message_W)), _rms_norm(mean_W)


def _global(t: _Tiers, state, s: int, g: int):
  """DiLoCo's outer step with the groups' models as the workers' (each
  group's s identical rows, sent together under its group's index)."""
  c = state.comm
  local = num_workers(state.params_W)
  key = _base.comm_key(state)
  if s > 1:  # both tiers encode: their noise is independent
    key = jax.random.fold_in(key, 1)
  step = outer_step(t.global_outer, _tier(t.comp, g))
  new_global, outer_state, message_W, pseudo_grad = step(
      c.global_params, c.group_params_W, c.global_outer, c.global_message_W,
      key,
      active_W=_live_groups(jnp.arange(total_workers(state.params_W)), s),
      senders_W=worker_ids(local) // s)
  new_W = broadcast_to_workers(new_global, local)
  return state._replace(params_W=new_W, comm=c._replace(
      global_params=new_global, global_outer=outer_state,
      group_params_W=new_W, global_message_W=message_W)), optax.tree.norm(
          pseudo_grad)


def _sync(t: _Tiers):
  """The regional step every round, then the global one every R-th."""

  def sync(state):
    s, g = _sizes(total_workers(state.params_W), t.group_size, t.groups)
    state, regional_norm = _regional(t, state, s)
    if t.R == 1:
      due = jnp.asarray(True)
      state, global_norm = _global(t, state, s, g)
    else:
      due = state.step % (t.H * t.R) == 0
      state, global_norm = jax.lax.cond(
          due, lambda st, m: call_participating(m, _global, t, st, s, g),
          lambda st, m: (st, jnp.asarray(jnp.nan, jnp.float32)),
          state, participants())
    return state, {**_base.events(regional=1, **{"global": due}),
                   **_base.metrics(pseudo_grad_norm_regional=regional_norm,
                                   pseudo_grad_norm_global=global_norm)}

  return sync


def _global_params(state):
  return worker_mean(state.comm.group_params_W)


def _channels(t: _Tiers):
  def channels(params, num_workers_):
    s, g = _sizes(num_workers_, t.group_size, t.groups)
    return {"regional": _channel(t.comp, params, s, "regional", 1),
            "global": _channel(t.comp, params, g, "global", s)}

  return channels


def hierarchical_diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    global_outer: optax.GradientTransformation | None = None,
    H: int = 100,
    group_size: int | None = None,
    groups: int | None = None,
    global_every: int = 5,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
) -> _base.Strategy:
  """Hierarchical DiLoCo: regional outer steps every H inner steps, a global
  one every R = ``global_every`` regional ones.

  Defaults: DiLoCo's inner AdamW (lr 4e-4, wd 0.1) and, for the regional
  tier, its outer SGD with Nesterov momentum (lr 0.7, momentum 0.9); the
  global tier averages the groups' models (outer SGD, lr 1) so that the
  momentum is applied once. Two groups unless ``group_size`` or ``groups``
  says otherwise. R = 5 (that documentation's planner assumes 16 regional syncs per
  global one; fewer suit short simulations).

  Bytes per worker (payload M = the pseudo-gradient under ``codec``, 4 bytes
  a parameter in float32): every regional sync, a ring all-reduce of M over
  the s workers of the group, 2(s-1)/s x M (``wire_bytes_regional``); every
  global sync, the groups' ring all-reduce of M over G = W/s regions, each
  region's share sent by its s workers, 2(G-1)/G x M / s
  (``wire_bytes_global``). A global round's step sends both (the peak).

  With one group and the default global averaging it is DiLoCo; with groups
  of one worker, regional SGD lr 1 and R = 1, DiLoCo with ``global_outer``.

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: the regional outer optimizer (one state per group).
    global_outer: the global outer optimizer.
    H: inner steps per regional round.
    group_size: workers per group (must divide W), or None.
    groups: number of groups (must divide W), or None; not with group_size.
    global_every: R, regional syncs per global sync.
    codec: codec of both tiers' pseudo-gradients, or None (float32).
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None;
      each tier keeps its own residuals.
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  global_outer = _base.optimizer("global_outer", global_outer,
                                 default_global_outer)
  H = _validate.positive_int("H", H)
  R = _validate.positive_int("global_every", global_every)
  group_size, groups = _group_settings(group_size, groups)
  t = _Tiers(inner, outer, global_outer, compression(codec, error_feedback),
             H, R, group_size, groups)
  return _base.make(
      "hierarchical_diloco", t.H, _base.Parts(
          _init(t),
          lambda st, grads_W: (_base.inner_update(inner, st, grads_W), {}),
          _sync(t), _global_params, _channels(t)),
      {"name": "hierarchical_diloco", "inner": _base.describe(inner),
       "outer": _base.describe(outer),
       "global_outer": _base.describe(global_outer), "H": t.H,
       "group_size": t.group_size, "groups": t.groups, "global_every": t.R,
       **t.comp.config},
      outer_places={"outer": "regional_outer_W",
                    "global_outer": "global_outer"},
      inner=inner)


_SOURCE = "Decentralized Training Simulator: Technical Documentation"
SPEC = _spec.spec(
    hierarchical_diloco, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="DiLoCo, Douillard et al. 2023, arXiv 2311.08105, in two tiers "
          f"({_SOURCE}, §3.2)",
    help={"H": "inner steps per regional sync",
          "group_size": "workers per group (region); must divide the "
                        "workers; also the hierarchical topology's regions",
          "groups": "number of groups (instead of group_size; two by "
                    "default)",
          "global_every": "R: regional syncs per global sync",
          "codec": "codec of both tiers' pseudo-gradients"},
    optimizers={"global_outer": _optim.AVERAGING})
