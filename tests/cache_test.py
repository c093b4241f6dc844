"""Tests for spec_decode.cache: per-row writes and rewinds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import cache as cache_lib


def _reference_write(buffer, values, index, axis):
  out = np.array(buffer)
  k = values.shape[axis + 1]
  for b, start in enumerate(index):
    where = [slice(None)] * (buffer.ndim - 1)
    where[axis] = slice(start, start + k)
    out[(b, *where)] = values[b]
  return out


@pytest.mark.parametrize('k', [1, 3])
@pytest.mark.parametrize('axis', [0, 1])
def test_write_sets_each_rows_positions(k, axis):
  rng = np.random.default_rng(k + axis)
  shape = (3, 7, 5) if axis == 0 else (3, 2, 7, 4)  # [B, T, D] or [B, H, T, Dh]
  buffer = rng.standard_normal(shape).astype(np.float32)
  values_shape = list(shape)
  values_shape[axis + 1] = k
  values = rng.standard_normal(values_shape).astype(np.float32)
  index = np.array([0, 7 - k, 2], np.int32)
  out = jax.jit(cache_lib.write, static_argnames='axis')(buffer, values, index, axis=axis)
  np.testing.assert_array_equal(out, _reference_write(buffer, values, index, axis))


def test_k_single_writes_equal_one_chunk():
  buffer = jnp.zeros((2, 2, 9, 3))
  values = jnp.asarray(np.random.default_rng(0).standard_normal((2, 2, 4, 3)), jnp.float32)
  index = jnp.array([1, 5])
  chunk = cache_lib.write(buffer, values, index, axis=1)
  single = buffer
  for i in range(4):
    single = cache_lib.write(single, values[:, :, i:i + 1], index + i, axis=1)
  np.testing.assert_array_equal(chunk, single)


def test_rewind_sets_the_index_only():
  cache = cache_lib.Cache(index=jnp.array([4, 6]), layers=jnp.ones((2, 8)), capacity=8)
  rewound = cache_lib.rewind(cache, jnp.array([2, 6]))
  np.testing.assert_array_equal(rewound.index, [2, 6])
  assert rewound.layers is cache.layers and rewound.capacity == 8
