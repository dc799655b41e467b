"""Expert parameters of a mixture-of-experts model, for SPES: which leaves are
experts, who owns which, the owned slices of a worker-stacked tree, and the
expert-merging step.

An *experts module* is a dict entry named ``experts`` anywhere in the
parameter tree (``models.moe_gpt`` has one per layer); each of its leaves is
stacked on a leading expert axis of the same size E. A user's flax model
follows the same convention to be trained with SPES. Every other leaf is
*shared*.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate
from lowbw._types import Array, Params, PyTree

EXPERTS_KEY = "experts"
# The input projection whose similarity picks merge partners: the SwiGLU
# gate projection (the one fed to SiLU), as the SPES authors' code compares.
SIMILARITY_LEAF = "w_gate"


def _is_expert_path(path) -> bool:
  return any(getattr(k, "key", None) == EXPERTS_KEY for k in path)


def expert_flags(params: Params) -> PyTree:
  """A tree of bools shaped like ``params``: True for expert leaves."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: _is_expert_path(path), params)


def num_experts(params: Params) -> int:
  """E, checked: at least one expert leaf, all with the same leading size."""
  sizes = {tuple(x.shape[:1]) for x, flag in zip(
      jax.tree.leaves(params), jax.tree.leaves(expert_flags(params))) if flag}
  if not sizes:
    raise _validate.fail(
        "strategy", "spes", "needs a mixture-of-experts model, expert "
        f"weights stacked on a leading axis under an {EXPERTS_KEY!r} entry "
        "(e.g. models.moe_gpt, --model moe_gpt); this model has none")
  if len(sizes) > 1 or () in sizes:
    raise _validate.fail(
        "strategy", "spes", "needs every expert leaf to have the same "
        f"leading (expert) axis; found leading sizes {sorted(sizes)}")
  return next(iter(sizes))[0]


def assignment(E: int, W: int, experts_per_worker: int | None,
               owners) -> np.ndarray:
  """int32 (W, k): the experts each worker owns, in increasing order.

  ``owners`` (a sequence of E worker ids, expert e owned by ``owners[e]``)
  or ``experts_per_worker`` (consecutive runs: worker w owns experts
  ``w*k .. w*k + k - 1``); with neither, E/W each. Every expert has exactly
  one owner and every worker the same number (the state is one stacked
  array).
  """
  if owners is not None:
    return _from_owners(E, W, owners)
  k = E // W if experts_per_worker is None else experts_per_worker
  if E % W or k * W != E:
    got = "E/W" if experts_per_worker is None else experts_per_worker
    raise _validate.fail(
        "experts_per_worker", got, f"the model has {E} experts for {W} "
        f"workers: every expert needs exactly one owner and every worker "
        f"the same number, so W must divide E (W * experts_per_worker == "
        f"{E}); or pass assignment=")
  return np.arange(E, dtype=np.int32).reshape(W, k)


def _from_owners(E: int, W: int, owners) -> np.ndarray:
  owners = np.asarray(owners)
  if owners.shape != (E,) or not np.issubdtype(owners.dtype, np.integer):
    raise _validate.fail("assignment", owners.tolist(), f"expected {E} "
                         "integer worker ids, one per expert")
  if owners.min() < 0 or owners.max() >= W:
    raise _validate.fail("assignment", owners.tolist(),
                         f"worker ids must be in [0, {W})")
  counts = np.bincount(owners, minlength=W)
  if counts.min() != counts.max():
    raise _validate.fail(
        "assignment", owners.tolist(), f"every worker must own the same "
        f"number of experts (counts per worker: {counts.tolist()})")
  return np.stack([np.flatnonzero(owners == w) for w in range(W)]).astype(
      np.int32)


def owned(tree_W: PyTree, flags: PyTree, owned_W: Array) -> PyTree:
  """The trainable view: expert leaves (W, E, ...) -> the owned rows
  (W, k, ...); shared leaves as they are."""
  def one(x, flag):
    return jax.vmap(lambda x, o: x[o])(x, owned_W) if flag else x
  return jax.tree.map(one, tree_W, flags)


def put_owned(tree_W: PyTree, view_W: PyTree, flags: PyTree,
              owned_W: Array) -> PyTree:
  """``tree_W`` with the trainable view written back (the other experts'
  rows untouched, bit for bit)."""
  def one(x, v, flag):
    if not flag:
      return v
    return jax.vmap(lambda x, v, o: x.at[o].set(v.astype(x.dtype)))(
        x, v, owned_W)
  return jax.tree.map(one, tree_W, view_W, flags)


def at_experts(E: int):
  """``(rows (k, ...), owned (k,)) -> (E, ...)``: one worker's rows placed at
  its experts, zeros elsewhere."""
  return lambda v, o: jnp.zeros((E,) + v.shape[1:], v.dtype).at[o].set(v)


def merge(params: Params, alpha: Array, top_k: int) -> Params:
  """SPES's expert-merging step (Section 3.3, eqs. 5-6), on every experts
  module: each expert moves towards the mean of its ``top_k`` most similar
  peers, theta_i + alpha * mean_j (theta_j - theta_i), similarity being the
  cosine of the flattened ``w_gate`` (all leaves concatenated when there is
  none). All experts move at once, from the weights before the merge."""
  if isinstance(params, dict):
    return {k: (_merge_module(v, alpha, top_k)
                if k == EXPERTS_KEY and isinstance(v, dict)
                else merge(v, alpha, top_k)) for k, v in params.items()}
  return params


def _merge_module(module: dict, alpha: Array, top_k: int) -> dict:
  leaves = ([module[SIMILARITY_LEAF]] if SIMILARITY_LEAF in module
            else jax.tree.leaves(module))
  flat_ExN = jnp.concatenate(
      [x.reshape(x.shape[0], -1).astype(jnp.float32) for x in leaves], 1)
  unit_ExN = flat_ExN / jnp.maximum(
      jnp.linalg.norm(flat_ExN, axis=1, keepdims=True), 1e-12)
  sim_ExE = unit_ExN @ unit_ExN.T
  sim_ExE = jnp.where(jnp.eye(sim_ExE.shape[0], dtype=bool), -jnp.inf, sim_ExE)
  _, peers_ExK = jax.lax.top_k(sim_ExE, top_k)

  def move(x):
    mean = jnp.mean(x[peers_ExK], axis=1)
    return (x + alpha * (mean - x)).astype(x.dtype)

  return jax.tree.map(move, module)
