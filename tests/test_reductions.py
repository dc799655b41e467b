"""Worker reductions: every form of the leading sum agrees with ``jnp.sum``
up to float rounding, and the public reductions with a plain per-worker
loop, masked and unmasked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowbw import transforms
from lowbw.transforms import _leading_sum

SHAPES = [(1, 5), (3, 7), (8, 33), (12, 4), (16, 4, 9), (24, 2, 3, 5)]


def _x(shape, dtype, seed=0):
  return jax.random.normal(jax.random.key(seed), shape).astype(dtype)


@pytest.mark.parametrize("form", sorted(_leading_sum.FORMS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_forms_match_plain_sum(form, shape, dtype, masked):
  x = _x(shape, dtype)
  mask = (np.arange(shape[0]) % 3 != 1) if masked else None
  got = jax.jit(lambda x, m: _leading_sum.FORMS[form](x, m))(x, mask)
  assert got.dtype == jnp.float32
  rows = np.asarray(x, np.float64)
  if masked:
    rows = rows[mask]
  want = rows.sum(axis=0)
  tol = 1e-5 if dtype == jnp.float32 else 1e-5 * shape[0]
  np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)


def test_chosen_form_per_backend():
  f32, bf16, i32 = (jnp.zeros((16, 2), d) for d in
                    (jnp.float32, jnp.bfloat16, jnp.int32))
  assert _leading_sum.chosen_form(f32, "cpu") == "dot"
  assert _leading_sum.chosen_form(f32[:8], "cpu") == "fold_dot"
  assert _leading_sum.chosen_form(bf16, "cpu") == "fold_dot"
  assert _leading_sum.chosen_form(i32, "cpu") == "native"
  assert _leading_sum.chosen_form(f32, "gpu") == "native"
  with _leading_sum.sum_form("native"):
    assert _leading_sum.chosen_form(f32, "cpu") == "native"
  with pytest.raises(ValueError, match="'blocked' is not one of"):
    with _leading_sum.sum_form("blocked"):
      pass


@pytest.mark.parametrize("form", sorted(_leading_sum.FORMS))
def test_worker_mean_and_sum_against_a_loop(form):
  tree = {"a": _x((8, 3, 4), jnp.float32, 1), "b": _x((8, 5), jnp.bfloat16, 2)}
  active = np.array([1, 0, 1, 1, 0, 0, 1, 1], bool)
  with _leading_sum.sum_form(form):
    mean = transforms.worker_mean(tree)
    mean_active = transforms.worker_mean(tree, jnp.asarray(active))
    total_active = transforms.worker_sum(tree, jnp.asarray(active))
  for k, x in tree.items():
    rows = [np.asarray(x[w], np.float64) for w in range(8)]
    tol = 1e-6 if x.dtype == jnp.float32 else 2e-2
    assert mean[k].dtype == x.dtype and total_active[k].dtype == x.dtype
    np.testing.assert_allclose(np.asarray(mean[k], np.float64),
                               sum(rows) / 8, rtol=tol, atol=tol)
    kept = [r for r, a in zip(rows, active) if a]
    np.testing.assert_allclose(np.asarray(mean_active[k], np.float64),
                               sum(kept) / len(kept), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(total_active[k], np.float64),
                               sum(kept), rtol=tol, atol=5 * tol)


def test_mean_over_no_active_worker_is_zero():
  x = _x((4, 3), jnp.float32)
  out = transforms.worker_mean(x, jnp.zeros((4,), bool))
  np.testing.assert_array_equal(np.asarray(out), np.zeros(3))
