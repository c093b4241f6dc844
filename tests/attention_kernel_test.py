"""The CPU attention kernel (spec_decode.kernels.attention): accuracy, independence, dispatch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode.t5 import layers

# Relative to the largest output: |kernel - exact| <= TOLERANCE * max|exact|.
TOLERANCE = 1e-5
# (B, H, T, Dh, bias shape as (B?, H?, L?) flags): T on and off a multiple of 16, head widths
# 16, 64 and 128, and every way the bias broadcasts (a decoder's causal and relative position
# bias per row, head and position; the encoder's padding mask per row only).
CASES = [(1, 6, 40, 64, (1, 1, 1)), (2, 4, 33, 64, (1, 0, 0)), (1, 2, 7, 128, (0, 1, 1)),
         (3, 3, 100, 16, (1, 1, 0)), (1, 1, 1, 16, (0, 0, 0)), (1, 8, 160, 64, (1, 1, 1))]


@pytest.fixture(scope='module', autouse=True)
def built():
  assert kernels.available(), 'the kernels did not build on this machine'


def _inputs(rng, b, h, t, d, length, flags, masked=0.3):
  q = rng.standard_normal((b, length, h, d)).astype(np.float32) / np.sqrt(d) * 3
  k, v = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(2))
  shape = tuple(n if f else 1 for n, f in zip((b, h, length), flags)) + (t,)
  bias = np.where(rng.random(shape) < masked, layers.NEG_INF, rng.standard_normal(shape))
  return q, k, v, bias.astype(np.float32)


def _exact(q, k, v, bias):
  s = np.einsum('blhd,bhtd->bhlt', q.astype(np.float64), k.astype(np.float64)) + bias
  w = np.exp(s - s.max(-1, keepdims=True))
  return np.einsum('bhlt,bhtd->blhd', w / w.sum(-1, keepdims=True), v.astype(np.float64))


_attention = jax.jit(kernels.attention)


@pytest.mark.parametrize('case', CASES)
def test_matches_float64_for_every_query_count(case):
  b, h, t, d, flags = case
  rng = np.random.default_rng(t)
  for length in range(1, kernels.MAX_ROWS + 1):
    q, k, v, bias = _inputs(rng, b, h, t, d, length, flags)
    assert kernels.attention_applies(*map(jnp.asarray, (q, k, v, bias)))
    exact = _exact(q, k, v, bias)
    error = np.max(np.abs(np.asarray(_attention(q, k, v, bias)) - exact)) / np.max(np.abs(exact))
    assert error <= TOLERANCE, (length, error)


def test_a_query_does_not_depend_on_the_queries_beside_it():
  """Bitwise: each of 16 query positions equals that position attended alone."""
  rng = np.random.default_rng(0)
  q, k, v, bias = _inputs(rng, 2, 6, 45, 64, kernels.MAX_ROWS, (1, 1, 1))
  alone = np.concatenate([_attention(q[:, i:i + 1], k, v, bias[:, :, i:i + 1])
                          for i in range(kernels.MAX_ROWS)], axis=1)
  for length in range(2, kernels.MAX_ROWS + 1):
    np.testing.assert_array_equal(_attention(q[:, :length], k, v, bias[:, :, :length]),
                                  alone[:, :length], err_msg=f'{length} queries')


def test_fully_masked_rows_average_the_values_as_xla_does():
  rng = np.random.default_rng(1)
  q, k, v, _ = _inputs(rng, 1, 2, 20, 16, 3, (0, 0, 0))
  bias = np.full((1, 1, 1, 20), layers.NEG_INF, np.float32)
  np.testing.assert_allclose(_attention(q, k, v, bias), np.broadcast_to(
      v.mean(axis=2)[:, None], q.shape), rtol=0, atol=TOLERANCE * np.abs(v).max())


def test_applies_only_where_the_kernel_computes_the_same_function(monkeypatch):
  ones = lambda *shape: jnp.ones(shape, jnp.float32)
  assert kernels.attention_applies(ones(1, 4, 2, 64), ones(1, 2, 9, 64), ones(1, 2, 9, 64),
                                   ones(1, 2, 4, 9))
  assert not kernels.attention_applies(ones(1, 17, 2, 64), ones(1, 2, 9, 64), ones(1, 2, 9, 64),
                                       ones(1, 1, 1, 9))  # too many queries
  assert not kernels.attention_applies(ones(1, 4, 2, 24), ones(1, 2, 9, 24), ones(1, 2, 9, 24),
                                       ones(1, 1, 1, 9))  # head width not a multiple of 16
  assert not kernels.attention_applies(ones(1, 4, 2, 64), ones(1, 2, 9, 64), ones(1, 2, 9, 64),
                                       ones(1, 2, 3, 9))  # a bias that does not broadcast
  half = jnp.ones((1, 2, 9, 64), jnp.bfloat16)
  assert not kernels.attention_applies(ones(1, 4, 2, 64), half, half, ones(1, 1, 1, 9))
  monkeypatch.setenv(kernels.SWITCH, '0')
  assert not kernels.attention_applies(ones(1, 4, 2, 64), ones(1, 2, 9, 64), ones(1, 2, 9, 64),
                                       ones(1, 2, 4, 9))


def test_gradients_are_xla_s():
  rng = np.random.default_rng(2)
  args = tuple(map(jnp.asarray, _inputs(rng, 1, 2, 10, 16, 3, (1, 1, 1), masked=0.0)))
  loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a)))
  ours = jax.grad(loss(kernels.attention), argnums=(0, 1, 2, 3))(*args)
  theirs = jax.grad(loss(kernels._attention_reference), argnums=(0, 1, 2, 3))(*args)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_attention_layers_take_the_kernel_unless_dropout_is_on():
  attention = layers.MultiHeadAttention(num_heads=2, head_dim=16, emb_dim=8, dropout_rate=0.1)
  x, kv = jnp.ones((1, 3, 8)), jnp.ones((1, 2, 5, 16))
  params = attention.init(jax.random.key(0), x, kv, kv, jnp.zeros((1, 1, 1, 5)))

  def lowered(deterministic):
    apply = lambda p: attention.apply(p, x, kv, kv, jnp.zeros((1, 1, 1, 5)), deterministic,
                                      rngs={'dropout': jax.random.key(1)})
    return jax.jit(apply).lower(params).as_text()

  assert 'spec_decode_attention' in lowered(True)
  assert 'spec_decode_attention' not in lowered(False)
