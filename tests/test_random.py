"""The keyed bijection behind sampling without replacement and SPARTA indices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbw._random import random_bijection


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 3000), extra=st.integers(0, 5000),
       seed=st.integers(0, 2**31 - 1))
def test_is_a_permutation_of_the_domain(n, extra, seed):
  image = np.asarray(random_bijection(jax.random.PRNGKey(seed),
                                      jnp.arange(n), n, n + extra))
  np.testing.assert_array_equal(np.sort(image), np.arange(n))


def test_traced_domain_per_worker_and_key_dependence():
  sizes = jnp.array([5, 17, 64])
  perms = jax.jit(jax.vmap(
      lambda n: random_bijection(jax.random.PRNGKey(0), jnp.arange(5), n, 64)))(
          sizes)
  for row, n in zip(np.asarray(perms), [5, 17, 64]):
    assert len(set(row.tolist())) == 5 and row.max() < n
  a = random_bijection(jax.random.PRNGKey(1), jnp.arange(100), 100, 100)
  b = random_bijection(jax.random.PRNGKey(2), jnp.arange(100), 100, 100)
  assert not np.array_equal(a, b)
  assert not np.array_equal(a, np.arange(100))  # it does shuffle


def test_rejects_bad_width():
  with pytest.raises(ValueError, match="max_n"):
    random_bijection(jax.random.PRNGKey(0), jnp.arange(1), 1, 0)
