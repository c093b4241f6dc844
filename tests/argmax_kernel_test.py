"""Tests for kernels.distributions.argmax against numpy and sampling's XLA argmax."""

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


def _xla_argmax(x, monkeypatch):
  monkeypatch.setattr(distributions, 'argmax_applies', lambda x: False)
  out = np.asarray(jax.jit(sampling.argmax)(x))  # a fresh trace
  monkeypatch.undo()
  return out


@pytest.mark.parametrize('vocab', [1, 2, 7, 15, 16, 17, 31, 32, 33, 100, 8192, 32128])
def test_first_index_of_the_maximum_as_numpy(vocab, monkeypatch):
  rng = np.random.default_rng(vocab)
  x = rng.integers(-4, 4, size=(9, vocab)).astype(np.float32)  # many ties
  x[1] = rng.standard_normal(vocab)
  x[2] = -np.inf  # all -inf: index 0
  x[3, ::2] = -np.inf
  x[4, vocab // 2:] = np.inf  # the first +inf
  x[5] = 0.0
  x[5, 1::2] = -0.0  # -0.0 ties with 0.0
  x[6, -1] = 100.0  # the maximum in the last entry (a vector lane's or the tail's)
  x[7, 0] = 100.0
  x[8, vocab // 3] = 1e30
  got = np.asarray(jax.jit(distributions.argmax)(jnp.asarray(x)))
  assert got.dtype == np.int32
  np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
  np.testing.assert_array_equal(got, _xla_argmax(jnp.asarray(x), monkeypatch))


@pytest.mark.parametrize('vocab', [5, 16, 40, 8192])
def test_a_row_with_a_nan_gives_its_first_nan_as_jnp_argmax(vocab):
  x = np.zeros((3, vocab), np.float32)
  x[0, 1] = np.nan
  x[0, 3:] = np.nan
  x[1, -1] = np.nan
  x[1, 0] = 5.0
  x[2, 2] = 3.0  # no NaN: index 2
  got = np.asarray(distributions.argmax(jnp.asarray(x)))
  np.testing.assert_array_equal(got, [1, vocab - 1, 2])
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))


def test_rows_are_independent_under_vmap_and_any_leading_shape():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 1000)), jnp.float32)
  together = np.asarray(distributions.argmax(x))
  assert together.shape == (2, 3)
  np.testing.assert_array_equal(together, np.argmax(np.asarray(x), axis=-1))
  np.testing.assert_array_equal(np.asarray(jax.vmap(distributions.argmax)(x)), together)
  assert int(distributions.argmax(x[0, 0])) == together[0, 0]  # a single row, shape []


def test_a_gradient_through_it_is_zero_not_an_error():
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 50)), jnp.float32)
  grad = jax.grad(lambda x: jnp.sum(x * distributions.argmax(x)[:, None]))(x)
  np.testing.assert_array_equal(grad, np.broadcast_to(np.argmax(x, -1)[:, None], x.shape))


def test_sampling_takes_it_for_float32_with_the_kernels_on(monkeypatch):
  x = jnp.zeros((4, 8192), jnp.float32)
  assert distributions.argmax_applies(x)
  traced = lambda: str(jax.make_jaxpr(lambda x: sampling.argmax(x))(x))  # a fresh trace
  assert 'spec_decode_argmax' in traced()
  assert not distributions.argmax_applies(x.astype(jnp.bfloat16))
  assert not distributions.argmax_applies(x > 0)
  monkeypatch.setenv(kernels.SWITCH, '0')
  assert not distributions.argmax_applies(x)
  assert 'spec_decode_argmax' not in traced()
