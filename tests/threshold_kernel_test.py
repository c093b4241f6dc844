"""Tests for kernels.distributions' top-k and top-p thresholds against a full sort."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode.kernels import distributions


@pytest.fixture(scope='module', autouse=True)
def built():
  assert kernels.available(), 'the kernels did not build on this machine'


def _kth_largest(row, k):
  return -np.sort(-row)[k - 1]


def _nucleus_threshold(row, top_p):
  """The smallest probability whose preceding mass (float64, sorted) is below top_p."""
  ranked = -np.sort(-row)
  mass_before = np.cumsum(ranked, dtype=np.float64) - ranked
  return np.min(np.where(mass_before < top_p, ranked, np.inf))


def _rows(vocab, rng):
  """Rows that stress a threshold: spread, peaked, tied, -inf, signed zeros, a constant."""
  x = rng.standard_normal((6, vocab)).astype(np.float32)
  x[1] *= 8.0
  x[2] = np.round(x[2] * 2)  # ties at every rank
  x[3, : vocab // 2] = -np.inf
  x[4] = np.where(np.arange(vocab) % 2, 0.0, -0.0)
  x[5] = 1.5
  return x


@pytest.mark.parametrize('vocab', [1, 7, 8, 9, 100, 8192, 32128])
def test_top_k_threshold_is_the_kth_largest(vocab):
  rng = np.random.default_rng(vocab)
  x = _rows(vocab, rng)
  for k in sorted({1, min(2, vocab), min(40, vocab), max(vocab // 2, 1), vocab}):
    got = np.asarray(jax.jit(distributions.top_k_threshold)(jnp.asarray(x), k))
    assert got.shape == (6, 1)
    np.testing.assert_array_equal(got[:, 0], [_kth_largest(row, k) for row in x])


@pytest.mark.parametrize('vocab', [1, 9, 100, 8192, 32128])
def test_top_p_threshold_is_the_sorted_definition(vocab):
  rng = np.random.default_rng(vocab + 1)
  logits = _rows(vocab, rng)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1))
  for top_p in (0.05, 0.3, 0.5, 0.9, 0.99, 0.999, 1.0):
    p = np.float32(top_p)
    got = np.asarray(jax.jit(distributions.top_p_threshold)(jnp.asarray(probs), p))
    np.testing.assert_array_equal(got[:, 0], [_nucleus_threshold(row, p) for row in probs])
  exact = np.array([[0.5, 0.25, 0.125, 0.125]], np.float32)  # masses that meet top_p exactly
  got = [float(distributions.top_p_threshold(jnp.asarray(exact), p)[0, 0]) for p in (0.5, 0.75, 0.8)]
  assert got == [0.5, 0.25, 0.125]


def test_rows_are_independent_and_a_bound_not_above_zero_cuts_nothing():
  rng = np.random.default_rng(3)
  probs = np.asarray(jax.nn.softmax(jnp.asarray(rng.standard_normal((2, 3, 500)), jnp.float32)))
  top_p = jnp.asarray([[[0.9], [-1.0], [0.5]], [[0.0], [0.7], [0.9]]], jnp.float32)
  got = np.asarray(jax.jit(distributions.top_p_threshold)(jnp.asarray(probs), top_p))
  assert got.shape == (2, 3, 1)
  assert got[0, 1, 0] == got[1, 0, 0] == -np.inf  # every entry kept
  for b, k in [(0, 0), (0, 2), (1, 1), (1, 2)]:
    alone = distributions.top_p_threshold(jnp.asarray(probs[b, k][None]), top_p[b, k, 0])
    assert got[b, k, 0] == float(alone[0, 0]) == _nucleus_threshold(probs[b, k],
                                                                     float(top_p[b, k, 0]))
  # Under vmap the mapped axis is one more row axis of the call, with the same results.
  mapped = jax.vmap(distributions.top_p_threshold)(jnp.asarray(probs), top_p)
  np.testing.assert_array_equal(np.asarray(mapped), got)

