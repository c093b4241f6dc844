"""Tests for kernels.distributions.softmax against float64 and jax.nn.softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode import sampling
from spec_decode.kernels import distributions


@pytest.fixture(scope='module', autouse=True)
def built():
  assert kernels.available(), 'the kernels did not build on this machine'


def _reference(x: np.ndarray) -> np.ndarray:
  """Softmax in float64 of the float32 differences x - max, as jax.nn.softmax forms them."""
  d = (x - x.max(axis=-1, keepdims=True)).astype(np.float64)
  e = np.exp(d)
  return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize('vocab', [1, 7, 8, 9, 100, 8192, 32128])
def test_matches_float64_within_a_few_roundings(vocab):
  rng = np.random.default_rng(vocab)
  x = (rng.standard_normal((5, vocab)) * np.array([[0.1], [1], [3], [30], [3]])).astype(np.float32)
  x[4, 1::3] = -np.inf  # top-k's mask
  x[4, 2::3] = -1e30  # a pruned head's logit
  got = np.asarray(jax.jit(distributions.softmax)(jnp.asarray(x)))
  want = _reference(x)
  cut = x - x.max(axis=-1, keepdims=True) < -87  # exp's float32 normal range ends at -87.3
  assert np.all(got[cut] == 0)
  normal = ~cut & (want > 1e-36)  # and results below float32's normal range
  np.testing.assert_allclose(got[normal], want[normal], rtol=1e-6)
  assert np.all(got[~cut & ~normal] <= 1e-36)
  np.testing.assert_allclose(got, np.asarray(jax.nn.softmax(jnp.asarray(x), axis=-1)),
                             rtol=1e-6, atol=1e-37)


def test_a_row_without_a_finite_maximum_is_nan_as_in_jax():
  x = np.zeros((4, 16), np.float32)
  x[0] = -np.inf
  x[1, 3] = np.inf
  x[2, 5] = np.nan
  got = np.asarray(distributions.softmax(jnp.asarray(x)))
  assert np.all(np.isnan(got[:3])) and np.all(np.isnan(jax.nn.softmax(jnp.asarray(x[:3]))))
  np.testing.assert_allclose(got[3], 1 / 16, rtol=1e-7)


def test_rows_are_independent_under_vmap_too():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 1000)) * 4, jnp.float32)
  together = np.asarray(distributions.softmax(x))
  for b in range(2):
    for r in range(3):
      np.testing.assert_array_equal(np.asarray(distributions.softmax(x[b, r][None]))[0],
                                    together[b, r])
  np.testing.assert_array_equal(np.asarray(jax.vmap(distributions.softmax)(x)), together)


def test_gradient_is_softmax_gradient():
  x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 50)) * 2, jnp.float32)
  w = jnp.asarray(np.random.default_rng(2).standard_normal((3, 50)), jnp.float32)
  loss = lambda f: lambda x: jnp.sum(f(x) * w)
  np.testing.assert_allclose(jax.grad(loss(distributions.softmax))(x),
                             jax.grad(loss(lambda x: jax.nn.softmax(x, axis=-1)))(x),
                             rtol=1e-5, atol=1e-7)


def test_applies_to_a_few_float32_rows_with_the_kernels_on(monkeypatch):
  assert distributions.softmax_applies(jnp.zeros((1, 4, 8192), jnp.float32))
  assert distributions.softmax_applies(jnp.zeros((distributions.SOFTMAX_MAX_ROWS, 8)))
  assert not distributions.softmax_applies(jnp.zeros((distributions.SOFTMAX_MAX_ROWS + 1, 8)))
  assert not distributions.softmax_applies(jnp.zeros((2, 8), jnp.bfloat16))
  monkeypatch.setenv(kernels.SWITCH, '0')
  assert not distributions.softmax_applies(jnp.zeros((1, 8), jnp.float32))


def test_sampling_takes_it_with_the_same_distribution_as_xla(monkeypatch):
  logits = jnp.asarray(np.random.default_rng(3).standard_normal((2, 4, 8192)) * 3, jnp.float32)
  params = sampling.SamplingParams.create(0.7, 40, 0.9)
  with_kernel = np.asarray(jax.jit(lambda x: sampling.adjust(x, params))(logits))
  monkeypatch.setattr(distributions, 'softmax_applies', lambda x: False)
  with_xla = np.asarray(jax.jit(lambda x: sampling.adjust(x, params))(logits))
  np.testing.assert_array_equal(with_kernel > 0, with_xla > 0)  # the same truncation
  np.testing.assert_allclose(with_kernel, with_xla, rtol=2e-6, atol=1e-37)
