"""Packed weights for the CPU dense kernel (kernels.pack, kernels.dense_panels, the models' with_panels)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode import models
from spec_decode.llama.config import LlamaConfig
from spec_decode.t5.config import t5_1_1
from tests import stubs
from tests import tolerances

# (in, out): whole panels, a partial last panel, fewer columns than a panel, and more
# weight rows than one block of a panel pass (the sums resume from the output).
SHAPES = [(384, 768), (384, 200), (17, 5), (1300, 130)]


@pytest.fixture(scope='module', autouse=True)
def built():
  assert kernels.available(), 'the kernels did not build on this machine'


def test_pack_lays_out_64_column_panels_padded_with_zeros():
  w = jnp.arange(5 * 70, dtype=jnp.float32).reshape(5, 70)
  panels = np.asarray(kernels.pack(w))
  assert panels.shape == (2, 5, 64)
  np.testing.assert_array_equal(panels[0], w[:, :64])
  np.testing.assert_array_equal(panels[1, :, :6], w[:, 64:])
  assert not panels[1, :, 6:].any()


def test_bfloat16_panels_interleave_each_32_columns():
  w = jnp.arange(3 * 70, dtype=jnp.float32).reshape(3, 70)
  panels = np.asarray(kernels.pack(w, jnp.bfloat16).astype(jnp.float32))
  assert panels.shape == (2, 3, 64)
  order = np.arange(32).reshape(2, 16).T.reshape(-1)  # 0, 16, 1, 17, ..., 15, 31
  np.testing.assert_array_equal(panels[0, :, :32], w[:, order])
  np.testing.assert_array_equal(panels[0, :, 32:], w[:, 32 + order])
  np.testing.assert_array_equal(panels[1, :, 0:12:2], w[:, 64:])
  assert not panels[1, :, 1:12:2].any() and not panels[1, :, 12:].any()


@pytest.mark.parametrize('shape', SHAPES)
def test_panel_products_are_bitwise_the_kernel_s_and_accurate(shape):
  rng = np.random.default_rng(sum(shape))
  w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  panels = kernels.pack(w)
  by_panels = jax.jit(kernels.dense_panels)
  by_rows = jax.jit(kernels.dense)
  x = jnp.asarray(rng.standard_normal((kernels.MAX_ROWS, shape[0])), jnp.float32)
  alone = np.concatenate([np.asarray(by_panels(x[i:i + 1], panels, w)) for i in range(len(x))])
  for rows in range(1, kernels.MAX_ROWS + 1):
    ours = np.asarray(by_panels(x[:rows], panels, w))
    np.testing.assert_array_equal(ours, np.asarray(by_rows(x[:rows], w)), err_msg=f'{rows} rows')
    np.testing.assert_array_equal(ours, alone[:rows], err_msg=f'{rows} rows')
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  assert np.max(np.abs(alone - exact)) <= 1e-5 * np.max(np.abs(exact))


def test_panel_products_of_many_rows_are_each_row_s_alone():
  rng = np.random.default_rng(5)
  w = jnp.asarray(rng.standard_normal((200, 130)), jnp.bfloat16).astype(jnp.float32)
  x = jnp.asarray(rng.standard_normal((kernels.PANEL_MAX_ROWS, 200)), jnp.float32)
  by_panels = jax.jit(kernels.dense_panels)
  for dtype in (jnp.float32, jnp.bfloat16):
    panels = kernels.pack(w, dtype)
    alone = by_panels(x[:7], panels, w)
    for rows in (17, 40, kernels.PANEL_MAX_ROWS):  # row groups of 6 and a partial one
      np.testing.assert_array_equal(by_panels(x[:rows], panels, w)[:7], alone)
    assert kernels.panels_apply(x, panels, w) and not kernels.panels_apply(
        jnp.concatenate([x, x[:1]]), panels, w)  # 257 rows: XLA's product


@pytest.mark.parametrize('shape', SHAPES)
def test_bfloat16_panels_of_bfloat16_weights_give_the_float32_products_bitwise(shape):
  rng = np.random.default_rng(sum(shape) + 1)
  w = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16).astype(jnp.float32)
  assert kernels.exact_in_bfloat16(w)
  panels = kernels.pack(w, jnp.bfloat16)
  x = jnp.asarray(rng.standard_normal((kernels.MAX_ROWS, shape[0])), jnp.float32)
  for rows in (1, 2, 4, 5, 6, 7, 12, 16):
    np.testing.assert_array_equal(jax.jit(kernels.dense_panels)(x[:rows], panels, w),
                                  jax.jit(kernels.dense)(x[:rows], w), err_msg=f'{rows} rows')


def test_pack_tree_packs_in_bfloat16_only_what_bfloat16_holds():
  rng = np.random.default_rng(2)
  held = jnp.asarray(rng.standard_normal((8, 70)), jnp.bfloat16).astype(jnp.float32)
  params = {'a': {'kernel': held}, 'b': {'kernel': held + 1e-3}, 'c': {'scale': held[0]}}
  packed = kernels.pack_tree(params, lambda path: path[-1] == 'kernel')
  assert packed['a']['kernel'].dtype == jnp.bfloat16
  assert packed['b']['kernel'].dtype == jnp.float32
  assert 'c' not in packed


def test_pack_tree_packs_fused_siblings_side_by_side():
  rng = np.random.default_rng(3)
  a, b, c = (jnp.asarray(rng.standard_normal((8, n)), jnp.float32) for n in (70, 64, 30))
  params = {'m': {'a': {'kernel': a}, 'b': {'kernel': b}}, 'n': {'a': {'kernel': c}}}
  packed = kernels.pack_tree(params, lambda path: path[-1] == 'kernel',
                            lambda path: {'ab': ('a', 'b')})
  assert set(packed['m']) == {'ab'} and set(packed['n']) == {'a'}  # n lacks b: packed alone
  np.testing.assert_array_equal(packed['m']['ab'], kernels.pack(jnp.concatenate([a, b], 1)))


def test_pruned_head_drafts_read_packed_heads_bitwise():
  model = models.T5Model.random(t5_1_1('nano', vocab_size=256), jax.random.key(1))
  model = model.replace(params=jax.tree_util.tree_map(  # a bfloat16 checkpoint's weights
      lambda w: w.astype(jnp.bfloat16).astype(jnp.float32), model.params))
  draft = models.PrunedHeadDraft.create(model, np.arange(3, 200, 2)).with_panels()
  assert draft.head_panels.dtype == jnp.bfloat16 and draft.with_panels() is draft.with_panels()
  inputs = jnp.asarray(np.random.default_rng(1).integers(2, 256, (2, 9)), jnp.int32)
  unpacked = draft.replace(head_panels=None)
  assert jax.jit(_step_logits).lower(draft, inputs).as_text().count('panels_bf16') > (
      jax.jit(_step_logits).lower(unpacked, inputs).as_text().count('panels_bf16'))
  np.testing.assert_array_equal(jax.jit(_step_logits)(draft, inputs),
                                jax.jit(_step_logits)(unpacked, inputs))
  assert draft.replace(kernel=draft.kernel * 2).head_panels is None  # never stale


def test_panel_gradients_are_xla_s():
  rng = np.random.default_rng(1)
  x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((3, 8), (8, 70)))
  loss = lambda x, w: jnp.sum(jnp.sin(kernels.dense_panels(x, kernels.pack(w), w)))
  ours = jax.grad(loss, argnums=(0, 1))(x, w)
  theirs = jax.grad(lambda x, w: jnp.sum(jnp.sin(x @ w)), argnums=(0, 1))(x, w)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def _step_logits(model, inputs):
  step_fn, cache = model.start(models.Batch(inputs), 8)
  return step_fn(jnp.full((2, 3), 5, jnp.int32), cache)[0]


def test_t5_steps_read_the_panels_and_equal_the_unpacked_model_bitwise():
  model = models.T5Model.random(t5_1_1('nano', vocab_size=256), jax.random.key(0))
  assert model.panels is not None, 'T5Model.random did not pack on one CPU device'
  layer = model.panels['decoder']['layers_0']
  # The products of one input are packed side by side (cross-attention's keys and values
  # read the encoder's output, its query the decoder's).
  assert set(layer['encoder_decoder_attention']) == {'query', 'kv', 'out'}
  assert set(layer['self_attention']) == {'qkv', 'out'} and set(layer['mlp']) == {'wi', 'wo'}
  assert set(model.panels['encoder']['layers_0']['attention']) == {'qkv', 'out'}
  unpacked = models.T5Model(model.config, model.params)
  # 2 x 8 tokens: the unpacked encoder's products take the (unpacked) kernel too.
  inputs = jnp.asarray(np.random.default_rng(0).integers(2, 256, (2, 8)), jnp.int32)
  assert 'spec_decode_dense_panels' in jax.jit(_step_logits).lower(model, inputs).as_text()
  assert 'spec_decode_dense_panels' not in jax.jit(_step_logits).lower(unpacked,
                                                                        inputs).as_text()
  np.testing.assert_array_equal(jax.jit(_step_logits)(model, inputs),
                                jax.jit(_step_logits)(unpacked, inputs))


def _llama_step_logits(model, tokens):
  lengths = jnp.array([tokens.shape[1]] * len(tokens), jnp.int32)
  step_fn, cache = model.start(models.Batch.of(model, tokens, lengths), 8)
  return step_fn(jnp.full((len(tokens), 3), 5, jnp.int32), cache)[0]


def test_a_tied_llama_output_layer_reads_its_packed_transpose():
  # 200 words: three whole panels and a partial one.
  config = LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       tie_word_embeddings=True)
  model = stubs.llama_model(config, 0).with_panels()
  assert set(model.panels) == {'layers_0', 'head'}
  headless = model.replace(panels={'layers_0': model.panels['layers_0']})
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 200, (2, 5)), jnp.int32)
  products = [jax.jit(_llama_step_logits).lower(m, tokens).as_text().count(
      'spec_decode_dense_panels') for m in (model, headless)]
  assert products[0] == products[1] + 1 and products[1] > 0
  tolerances.assert_close(jax.jit(_llama_step_logits)(model, tokens),
                          jax.jit(_llama_step_logits)(headless, tokens), ulps=64)


def test_panels_are_dropped_with_new_params_and_kept_off_where_they_would_not_be_read(
    monkeypatch):
  model = models.T5Model.random(t5_1_1('nano', vocab_size=256), jax.random.key(0))
  assert model.with_panels() is model
  unpacked = model.replace(params=jax.tree_util.tree_map(lambda a: a * 2, model.params))
  assert unpacked.panels is None
  assert unpacked.with_panels() is unpacked.with_panels()  # packed once, then cached
  as_numpy = models.T5Model(model.config, jax.tree_util.tree_map(np.asarray, model.params))
  assert as_numpy.with_panels().panels is None  # a numpy array could change after packing
  fresh = models.T5Model(model.config, model.params)
  assert 'logits_dense' in fresh.with_panels().panels['decoder']
  assert 'logits_dense' not in fresh.with_panels(output_layer=False).panels['decoder']  # a draft's
  monkeypatch.setenv(kernels.SWITCH, '0')
  assert models.T5Model(model.config, model.params).with_panels().panels is None


def test_bfloat16_parameters_read_bfloat16_panels_and_equal_their_float32_copy_bitwise():
  config = t5_1_1('nano', vocab_size=256)
  rounded = jax.tree_util.tree_map(lambda w: w.astype(jnp.bfloat16).astype(jnp.float32),
                                   models.T5Model.random(config, jax.random.key(0)).params)
  as_float32 = models.T5Model(config, rounded).with_panels()
  bf16_config = dataclasses.replace(config, param_dtype='bfloat16')  # float32 compute
  model = models.T5Model(bf16_config, jax.tree_util.tree_map(
      lambda w: w.astype(jnp.bfloat16), rounded)).with_panels()
  assert model.panels is not None, 'bfloat16 parameters computing in float32 were not packed'
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(model.panels)} == {jnp.dtype('bfloat16')}
  # 2 x 20 tokens: an encoder's embedding, and a step's 2 x 3.
  inputs = jnp.asarray(np.random.default_rng(0).integers(2, 256, (2, 20)), jnp.int32)
  assert 'spec_decode_dense_panels_bf16' in jax.jit(_step_logits).lower(model, inputs).as_text()
  np.testing.assert_array_equal(jax.jit(_step_logits)(model, inputs),
                                jax.jit(_step_logits)(as_float32, inputs))
  # Computing in bfloat16 the kernels do not apply: nothing packed.
  compute_bf16 = dataclasses.replace(config, dtype='bfloat16', param_dtype='bfloat16')
  assert models.T5Model(compute_bf16, model.params).with_panels().panels is None
