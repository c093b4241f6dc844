"""The CPU kernels (spec_decode.kernels): accuracy, row independence, dispatch, fallback."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode import models
from spec_decode.t5.config import t5_1_1

# Relative to the largest output: |kernel - exact| <= TOLERANCE * max|exact|.
TOLERANCE = 1e-5
# (in, out): the demo target's products, T5 1.1 base's, the demo's output layer (two threads),
# and widths that leave a 16-column tile, single columns, or fewer columns than a vector.
SHAPES = [(384, 384), (384, 768), (768, 384), (768, 2048), (384, 8192), (100, 37), (5, 3),
          (64, 48), (7, 1)]


def _dense(x, w):
  return np.asarray(jax.jit(kernels.dense)(x, w))


@pytest.fixture(scope='module', autouse=True)
def built():
  assert kernels.available(), 'the kernels did not build on this machine'


@pytest.mark.parametrize('shape', SHAPES)
def test_products_match_float64_for_every_row_count(shape):
  rng = np.random.default_rng(sum(shape))
  w = rng.standard_normal(shape).astype(np.float32)
  for rows in range(1, kernels.MAX_ROWS + 1):
    x = rng.standard_normal((rows, shape[0])).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    error = np.max(np.abs(_dense(x, w) - exact)) / np.max(np.abs(exact))
    assert error <= TOLERANCE, (rows, error)


@pytest.mark.parametrize('shape', [(384, 384), (384, 8192), (100, 37)])
def test_a_row_does_not_depend_on_the_rows_beside_it(shape):
  """Bitwise: each row of a 1..16-row product equals that row multiplied alone."""
  rng = np.random.default_rng(0)
  w = rng.standard_normal(shape).astype(np.float32)
  x = rng.standard_normal((kernels.MAX_ROWS, shape[0])).astype(np.float32)
  alone = np.concatenate([_dense(x[i:i + 1], w) for i in range(len(x))])
  for rows in range(2, kernels.MAX_ROWS + 1):
    np.testing.assert_array_equal(_dense(x[:rows], w), alone[:rows], err_msg=f'{rows} rows')


def _uses_kernel(fn, *args) -> bool:
  return 'spec_decode_dense' in jax.jit(fn).lower(*args).as_text()


def test_dot_general_takes_the_kernel_only_where_it_applies(monkeypatch):
  product = lambda x, w: kernels.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))
  w = jnp.ones((8, 4), jnp.float32)
  assert _uses_kernel(product, jnp.ones((2, 3, 8), jnp.float32), w)  # 6 rows
  assert not _uses_kernel(product, jnp.ones((17, 8), jnp.float32), w)  # too many rows
  assert not _uses_kernel(product, jnp.ones((4, 8), jnp.bfloat16), w.astype(jnp.bfloat16))
  transposed = lambda x, w: kernels.dot_general(x, w, (((1,), (1,)), ((), ())))
  assert not _uses_kernel(transposed, jnp.ones((4, 4), jnp.float32), w)
  monkeypatch.setenv(kernels.SWITCH, '0')
  assert not _uses_kernel(product, jnp.ones((2, 8), jnp.float32), w)


def test_gradients_are_xla_s():
  rng = np.random.default_rng(1)
  x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((3, 5, 8), (8, 6)))
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
  ours = jax.grad(loss(kernels.dense), argnums=(0, 1))(x, w)
  theirs = jax.grad(loss(jnp.matmul), argnums=(0, 1))(x, w)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_t5_steps_take_the_kernel_and_match_xla(monkeypatch):
  """A T5 decoding step over 3 positions: its products and attention go through the kernels,
  and the logits equal XLA's to float32 rounding."""
  model = models.T5Model.random(t5_1_1('nano', vocab_size=256), jax.random.key(0))
  inputs = jnp.asarray(np.random.default_rng(0).integers(2, 256, (2, 9)), jnp.int32)

  def logits(model, inputs):
    step_fn, cache = model.start(models.Batch(inputs), 8)
    return step_fn(jnp.full((2, 3), 5, jnp.int32), cache)[0]

  assert _uses_kernel(logits, model, inputs)
  assert 'spec_decode_attention' in jax.jit(logits).lower(model, inputs).as_text()
  ours = np.asarray(jax.jit(logits)(model, inputs))
  monkeypatch.setenv(kernels.SWITCH, '0')
  jax.clear_caches()
  assert not _uses_kernel(logits, model, inputs)
  theirs = np.asarray(jax.jit(logits)(model, inputs))
  assert np.max(np.abs(ours - theirs)) <= 1e-5 * np.max(np.abs(theirs))


_NO_COMPILER = textwrap.dedent('''
    import warnings
    import jax, jax.numpy as jnp, numpy as np
    from spec_decode import kernels
    x, w = jnp.ones((3, 8), jnp.float32), jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      y = jax.jit(lambda x, w: kernels.dot_general(x, w, (((1,), (0,)), ((), ()))))(x, w)
      kernels.applies(x, w)
    assert np.array_equal(y, x @ w)
    print(len(caught), caught[0].message if caught else '')
''')


def test_without_a_compiler_xla_s_products_run_after_one_warning(tmp_path):
  env = {**os.environ, 'PATH': str(tmp_path), 'CXX': '', 'SPEC_DECODE_KERNEL_CACHE': str(tmp_path)}
  done = subprocess.run([sys.executable, '-c', _NO_COMPILER], capture_output=True, text=True,
                        env=env, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.startswith('1 spec_decode CPU kernels unavailable') and 'no C++ compiler' \
      in done.stdout, done.stdout


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_embedding_rows_are_take_s_as_float32_bitwise(dtype):
  rng = np.random.default_rng(0)
  table = rng.standard_normal((50, 48)).astype(np.float32)
  table[3, :4] = [np.inf, -np.inf, np.nan, -0.0]
  table[4, :2] = [1e-40, -3e-39]  # subnormal in float32, kept by bfloat16's exponent range
  table = jnp.asarray(table, dtype)
  # 50 and -1: outside 0..49, NaN rows (the kernel does not wrap negative ids as take does).
  ids = jnp.asarray([[3, 4, 0, 49], [50, -1, 7, 3]], jnp.int32)
  outside = jnp.where(ids < 0, 50, ids)
  assert kernels.embed_applies(table, ids)
  got = jax.jit(kernels.embed)(table, ids)
  want = jnp.take(table, outside, axis=0, mode='fill').astype(jnp.float32)
  assert got.shape == (2, 4, 48) and got.dtype == jnp.float32
  np.testing.assert_array_equal(got.view(jnp.uint32)[np.isfinite(want) | np.isinf(want)],
                                want.view(jnp.uint32)[np.isfinite(want) | np.isinf(want)])
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  assert np.isnan(got[1, :2]).all()
  dy = jnp.asarray(rng.standard_normal(got.shape), jnp.float32)
  grad = jax.grad(lambda t: jnp.sum(kernels.embed(t, ids) * dy))(table)
  want_grad = jax.grad(lambda t: jnp.sum(jnp.take(t, outside, axis=0).astype(jnp.float32) * dy))(
      table)
  np.testing.assert_array_equal(np.asarray(grad, np.float32), np.asarray(want_grad, np.float32))


@pytest.mark.parametrize('value, on', [('0', False), ('false', False), (' OFF ', False),
                                       ('no', False), ('1', True), ('true', True), ('on', True),
                                       ('yes', True), ('', True), (None, True)])
def test_the_switch_reads_its_documented_values(monkeypatch, value, on):
  if value is None:
    monkeypatch.delenv(kernels.SWITCH, raising=False)
  else:
    monkeypatch.setenv(kernels.SWITCH, value)
  assert kernels.enabled() is on


@pytest.mark.parametrize('value', ['disabled', '2', 'O'])
def test_another_value_of_the_switch_is_an_error_naming_it(monkeypatch, value):
  monkeypatch.setenv(kernels.SWITCH, value)
  with pytest.raises(ValueError, match=rf"SPEC_DECODE_CPU_KERNELS='{value}': set it to 0 "):
    kernels.enabled()
  with pytest.raises(ValueError, match='SPEC_DECODE_CPU_KERNELS'):
    jax.jit(lambda x: kernels.dot_general(x, x, (((1,), (0,)), ((), ()))))(jnp.ones((2, 2)))


_UNBUILT = textwrap.dedent("""
    import warnings
    import jax.numpy as jnp
    import numpy as np
    from spec_decode import kernels
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      x = jnp.arange(12.0).reshape(3, 4)
      y = kernels.dot_general(x, x.T, (((1,), (0,)), ((), ())))
    np.testing.assert_allclose(y, np.asarray(x) @ np.asarray(x).T)
    print(kernels.in_use(), *[str(w.message) for w in caught], sep='\\n')
""")


# A read-only folder is not among the cases: root (CI) writes into one; /proc is unwritable to all.
@pytest.mark.parametrize('where', ['a_file', 'under_a_file', 'proc'])
def test_an_unwritable_cache_folder_warns_and_uses_xla(tmp_path, where):
  (tmp_path / 'file').write_text('not a folder')
  folder = {'a_file': tmp_path / 'file', 'under_a_file': tmp_path / 'file' / 'cache',
            'proc': '/proc/spec_decode_kernels'}[where]
  env = {**os.environ, 'SPEC_DECODE_KERNEL_CACHE': str(folder), kernels.SWITCH: '1'}
  run = subprocess.run([sys.executable, '-c', _UNBUILT], capture_output=True, text=True,
                       env=env, timeout=300, check=False)
  assert run.returncode == 0, run.stderr
  in_use, message = run.stdout.splitlines()[:2]
  assert in_use == 'False'
  assert message.startswith("spec_decode CPU kernels unavailable, XLA's products are used "
                            f'instead: cannot write the library to the cache folder {folder} '
                            '($SPEC_DECODE_KERNEL_CACHE sets it): '), message
