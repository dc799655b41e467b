"""Streaming DiLoCo (Douillard et al., 2025, arXiv 2501.18512): DiLoCo whose
model is split into P fragments synchronised in turn, each every H steps at
its own offset, with the outer update merged tau inner steps after it was
taken (the communication overlaps those steps).

Blocks and fragments. A *block* is an entry of the parameter tree at its
first level with more than one entry (single-entry levels such as flax's
``{"params": ...}`` are looked through), in natural key order (``block_2``
before ``block_10``): the default GPT has six (``block_0``, ``block_1``,
``head``, ``ln_final``, ``pos_embed``, ``tok_embed``), the MLP one per dense
layer. ``pattern="strided"`` puts block i in fragment i mod P;
``"sequential"`` puts contiguous runs of blocks together (block i of n in
fragment floor(i·P/n)). Every leaf belongs
to exactly one fragment.

Schedule (torchft's ``local_sgd`` offsets): a round is H/P inner steps; the
round ending at step k·H/P syncs fragment (k-1) mod P, so fragment p is synced
at steps (p+1)·H/P, H + (p+1)·H/P, ... Its pseudo-gradient (the fragment's
global parameters minus each worker's) goes through the codec and the outer
optimizer (one state per fragment) at once; ``delay`` steps later every worker
merges: local <- alpha·local + (1 - alpha)·global, for that fragment's leaves.
Which fragment and when follow from the step counter: one compiled round. A
sync skipped because no worker took part (faults) leaves the fragment's global
parameters as they were, and its merge mixes with those.
"""

import re
from typing import NamedTuple

import jax
import numpy as np
import optax

from lowbw import _validate
from lowbw._types import Params, PyTree
from lowbw.strategies import _base, _optim, _spec
from lowbw.strategies._diloco import default_outer, outer_step
from lowbw.transforms import Codec, Compression, comm_channel, compression
from lowbw.transforms._compression import init_residual

PATTERNS = ("strided", "sequential")


class StreamingComm(NamedTuple):
  """Streaming DiLoCo's communication state.

  Attributes:
    global_params: the shared model.
    outer_states: one outer optimizer state per fragment.
    residual_W: one per-worker message state per fragment.

  Which fragment syncs and when its merge lands follow from the step
  counter alone (``_fragment_at``): no schedule state.
  """

  global_params: Params
  outer_states: tuple
  residual_W: tuple


def _natural(key: str):
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def blocks(params: Params) -> list[str]:
  """The names of ``params``' blocks (see the module docstring)."""
  node = params
  while isinstance(node, dict) and len(node) == 1:
    node = next(iter(node.values()))
  if not isinstance(node, dict):
    return ["<all>"]
  return sorted(node, key=lambda k: _natural(str(k)))


def fragment_of_leaves(params: Params, fragments: int,
                       pattern: str) -> list[int]:
  """Each leaf's fragment, in ``jax.tree.leaves`` order."""
  names = blocks(params)
  if len(names) < fragments:
    raise _validate.fail(
        "fragments", fragments, f"the model has {len(names)} blocks "
        f"({', '.join(names)}); at most that many fragments")
  n = len(names)
  of_block = {b: (i % fragments if pattern == "strided" else i * fragments // n)
              for i, b in enumerate(names)}
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  if names == ["<all>"]:
    return [0] * len(leaves)
  depth = 0
  node = params
  while isinstance(node, dict) and len(node) == 1:
    node, depth = next(iter(node.values())), depth + 1
  return [of_block[path[depth].key] for path, _ in leaves]


def user_fragments(params: Params, partition: dict, fragments: int
                   ) -> list[int]:
  """Each leaf's fragment from ``partition``: the parameters' tree (or a
  prefix of it, e.g. one id per block) with an int in [0, P) at each leaf;
  every fragment must get a leaf."""
  try:
    per_leaf = jax.tree.map(
        lambda i, sub: [i] * len(jax.tree.leaves(sub)), partition, params)
  except (ValueError, TypeError) as e:
    raise _validate.fail("partition", partition, "expected the parameters' "
                         f"tree or a prefix of it ({e})") from None
  ids = jax.tree.leaves(per_leaf)
  bad = [i for i in ids if isinstance(i, bool) or
         not isinstance(i, (int, np.integer)) or not 0 <= i < fragments]
  if bad:
    raise _validate.fail("partition", partition, f"fragment ids must be "
                         f"integers in [0, fragments={fragments}); got "
                         f"{bad[0]!r}")
  empty = sorted(set(range(fragments)) - set(ids))
  if empty:
    raise _validate.fail("partition", partition, f"fragment {empty[0]} has "
                         "no parameters")
  return [int(i) for i in ids]


def _split(tree: PyTree, ids: list[int], p: int) -> list:
  """The leaves of ``tree`` in fragment ``p``."""
  return [x for x, f in zip(jax.tree.leaves(tree), ids) if f == p]


def _join(tree: PyTree, ids: list[int], p: int, part: list) -> PyTree:
  """``tree`` with fragment ``p``'s leaves replaced by ``part``."""
  leaves, treedef = jax.tree.flatten(tree)
  it = iter(part)
  return jax.tree.unflatten(
      treedef, [next(it) if f == p else x for x, f in zip(leaves, ids)])


def _mix(alpha: float, local_W: list, global_: list) -> list:
  # In each worker leaf's own type: the float32 global fragment must not
  # promote a narrower worker state (the fragments' switch branches would
  # then return different types).
  return [(alpha * x + (1.0 - alpha) * g[None]).astype(x.dtype)
          for x, g in zip(local_W, global_)]


class _Streaming(NamedTuple):
  """Streaming DiLoCo's validated settings, which its pieces share."""

  inner: optax.GradientTransformation
  outer: optax.GradientTransformation  # one state per fragment
  comp: Compression                    # the fragments' messages
  P: int                               # fragments
  period: int                          # H/P: inner steps per round
  delay: int                           # tau: steps from a sync to its merge
  alpha: float                         # merge weight of the worker's own
  pattern: str
  partition: dict | None               # the user's fragment ids, or None


def _period_and_delay(H: int, P: int, delay) -> tuple[int, int]:
  """(H/P, tau) checked; tau None is the paper's 1, or 0 where a round of
  one step leaves nothing to overlap."""
  if H % P:
    raise _validate.fail("H", H, f"a multiple of fragments={P} (each round "
                         "is H/fragments steps)")
  period = H // P
  if delay is None:
    delay = 1 if period > 1 else 0
  if _validate.non_negative_int("delay", delay) >= period:
    raise _validate.fail("delay", delay, f"an integer in [0, H/fragments) = "
                         f"[0, {period}); 0 for no overlap")
  return period, delay


def _ids_of(t: _Streaming, params) -> list[int]:
  """Each leaf's fragment, the user's partition's or the pattern's."""
  if t.partition is not None:
    return user_fragments(params, t.partition, t.P)
  return fragment_of_leaves(params, t.P, t.pattern)


def _init(t: _Streaming):
  def init(params, num_workers_, key):
    state = _base.inner_init(t.inner, params, num_workers_, key, ())
    ids = _ids_of(t, params)
    return state._replace(comm=StreamingComm(
        params,
        tuple(t.outer.init(_split(params, ids, p)) for p in range(t.P)),
        tuple(init_residual(t.comp, _split(state.params_W, ids, p))
              for p in range(t.P))))

  return init


def _fragment_at(t: _Streaming, sync_step):
  """The fragment the sync at ``sync_step`` (a multiple of the period)
  moves."""
  return (sync_step // t.period - 1) % t.P


def _merge(t: _Streaming, state, p: int, ids):
  """Every worker mixes fragment ``p`` with its global parameters."""
  c = state.comm
  mixed = _mix(t.alpha, _split(state.params_W, ids, p),
               _split(c.global_params, ids, p))
  return state._replace(params_W=_join(state.params_W, ids, p, mixed))


def _local(t: _Streaming):
  """The inner step, then the merge of the sync ``delay`` steps back (if
  one was then)."""

  def local(state, grads_W):
    state = _base.inner_update(t.inner, state, grads_W)
    if t.delay == 0:
      return state, {}
    ids = _ids_of(t, state.comm.global_params)
    branches = [lambda s, p=p: _merge(t, s, p, ids) for p in range(t.P)]
    synced = state.step - t.delay  # the sync whose merge lands now, if any
    due = (synced >= t.period) & (synced % t.period == 0)
    state = jax.lax.cond(
        due, lambda s: jax.lax.switch(_fragment_at(t, synced), branches, s),
        lambda s: s, state)
    return state, {}

  return local


def _sync_fragment(t: _Streaming, state, p: int):
  """Fragment ``p``'s outer step (merged at once when tau is 0)."""
  c = state.comm
  ids = _ids_of(t, c.global_params)
  global_p, outer_p, res_p, pseudo_grad = outer_step(t.outer, t.comp)(
      _split(c.global_params, ids, p), _split(state.params_W, ids, p),
      c.outer_states[p], c.residual_W[p], _base.comm_key(state))
  state = state._replace(comm=c._replace(
      global_params=_join(c.global_params, ids, p, global_p),
      outer_states=_replace_at(c.outer_states, p, outer_p),
      residual_W=_replace_at(c.residual_W, p, res_p)))
  if t.delay == 0:
    state = _merge(t, state, p, ids)
  return state, {**_base.events(**{_channel(q): int(q == p)
                                   for q in range(t.P)}),
                 **_base.metrics(pseudo_grad_norm=optax.tree.norm(
                     pseudo_grad))}


def _sync(t: _Streaming):
  def sync(state):
    branches = [lambda s, p=p: _sync_fragment(t, s, p) for p in range(t.P)]
    return jax.lax.switch(_fragment_at(t, state.step), branches, state)

  return sync


def _channels(t: _Streaming):
  def channels(params, num_workers_):
    ids = _ids_of(t, params)
    return {_channel(p): comm_channel(t.comp, _split(params, ids, p),
                                      num_workers_) for p in range(t.P)}

  return channels


def streaming_diloco(
    inner: optax.GradientTransformation | None = None,
    outer: optax.GradientTransformation | None = None,
    H: int = 100,
    fragments: int = 2,
    pattern: str = "strided",
    delay: int | None = None,
    alpha: float = 0.5,
    codec: Codec | str | None = "e3m0",
    error_feedback: float | None = None,
    partition: dict | None = None,
) -> _base.Strategy:
  """Streaming DiLoCo: P fragments synced in turn, merged tau steps later.

  Defaults follow arXiv 2501.18512 where the paper fixes them: inner AdamW
  (lr 4e-4, weight decay 0.1), outer SGD with Nesterov momentum (lr 0.7,
  momentum 0.9), strided fragments, merge weight alpha 0.5, tau = 1 (its
  overlap runs use tau = 1 to 5) and 4-bit E3M0 pseudo-gradients (its
  section 2.3). H = 100 as lowbw's DiLoCo; P = 2 here. P = 1, tau = 0,
  alpha = 0 and ``codec=None`` is DiLoCo exactly.

  Bytes per worker: fragment p's sync sends its pseudo-gradient (4 bytes per
  parameter of the fragment in float32, or the codec's payload), so the most
  one sync moves is about 1/P of DiLoCo's; in total, the same as DiLoCo.

  Args:
    inner: per-worker optimizer, state kept across rounds.
    outer: optimizer of the global parameters, one state per fragment.
    H: inner steps between two syncs of the same fragment; a multiple of P.
    fragments: P, how many fragments the blocks are split into.
    pattern: "strided" (block i in fragment i mod P) or "sequential"
      (block i of n in fragment floor(i·P/n)).
    delay: tau, inner steps between a fragment's outer update and the
      workers' merge of it (0 <= tau < H/P; 0: no overlap). None: 1, the
      paper's, or 0 where H/P = 1 leaves no step to overlap.
    alpha: weight of the worker's own parameters in the merge, in [0, 1]
      (0: every worker takes the new global fragment, as DiLoCo does).
    codec: codec of the fragments' pseudo-gradients (default E3M0 4-bit
      floats), or None (float32).
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None.
    partition: your own fragments instead of ``pattern``'s: the parameters'
      tree, or a prefix of it such as ``{"block_0": 0, "head": 1, ...}``,
      with a fragment id in [0, P) at each leaf; or None.
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, default_outer)
  H = _validate.positive_int("H", H)
  P = _validate.positive_int("fragments", fragments)
  _validate.one_of("pattern", pattern, PATTERNS)
  period, delay = _period_and_delay(H, P, delay)
  alpha = _validate.fraction("alpha", alpha, low_open=False)
  comp = compression(codec, error_feedback)
  if partition is not None and not isinstance(partition, dict):
    raise _validate.fail("partition", partition, "expected a dict tree of "
                         "fragment ids (the parameters' tree or a prefix)")
  t = _Streaming(inner, outer, comp, P, period, delay, alpha, pattern,
                 partition)
  return _base.make(
      "streaming_diloco", period, _base.Parts(
          _init(t), _local(t), _sync(t), lambda s: s.comm.global_params,
          _channels(t)),
      {"name": "streaming_diloco", "inner": _base.describe(inner),
       "outer": _base.describe(outer), "H": H, "fragments": P,
       "pattern": "user" if partition is not None else pattern,
       "delay": delay, "alpha": alpha, **comp.config},
      overlap_steps=delay, outer_places={"outer": "outer_states"},
      inner=inner)


def _channel(p: int) -> str:
  return f"fragment_{p}"


def _replace_at(items: tuple, i: int, value) -> tuple:
  return items[:i] + (value,) + items[i + 1:]


SPEC = _spec.spec(
    streaming_diloco, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Douillard et al. 2025, arXiv 2501.18512",
    where="§2: strided fragments, overlap tau = 1 (tau 1 to 5 in its overlap runs), merge alpha 0.5, 4-bit E3M0 outer gradients; DiLoCo's optimizers",
    help={"fragments": "P: fragments synced in turn (H must be a multiple)",
          "pattern": "which blocks form a fragment: strided (block i in "
                     "fragment i mod P) or sequential",
          "delay": "tau: inner steps between a fragment's outer update and "
                   "its merge (overlapped communication), < H/P; default "
                   "1, 0 when H/P = 1",
          "alpha": "merge weight of the worker's own parameters, in [0, 1]",
          "codec": "codec of the fragments' pseudo-gradients",
          "partition": "your own fragment id per leaf (Python only)"},
    choices={"pattern": PATTERNS})
