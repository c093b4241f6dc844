"""Tests for spec_decode.t5: configs, the T5X parameter tree, cached decoding."""

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from spec_decode import cache as cache_lib
from spec_decode.t5 import config as config_lib
from spec_decode.t5 import layers
from spec_decode.t5 import network
from tests import tolerances

# Official T5 1.1 sizes with vocab 32128: (arrays, parameters).
PARAM_COUNTS = {
    'small': (190, 76_961_152),
    'base': (282, 247_577_856),
    'large': (558, 783_150_080),
    'xl': (558, 2_849_757_184),
    'xxl': (558, 11_135_332_352),
}

CONFIG = config_lib.t5_1_1('tiny', vocab_size=100)
BATCH, ENCODER_LEN, DECODER_LEN = 3, 12, 20


def _expected_tree(cfg: config_lib.T5Config) -> dict:
  """T5X's minimal T5 parameter names and shapes, written out independently."""
  e, v, f, inner = cfg.emb_dim, cfg.vocab_size, cfg.mlp_dim, cfg.num_heads * cfg.head_dim
  attention = lambda p: {f'{p}/{n}/kernel': (e, inner) for n in ('query', 'key', 'value')} | {
      f'{p}/out/kernel': (inner, e)}
  mlp = lambda p: {f'{p}/mlp/wi_0/kernel': (e, f), f'{p}/mlp/wi_1/kernel': (e, f),
                   f'{p}/mlp/wo/kernel': (f, e)}
  tree = {
      'token_embedder/embedding': (v, e),
      'encoder/relpos_bias/rel_embedding': (cfg.num_heads, 32),
      'encoder/encoder_norm/scale': (e,),
      'decoder/relpos_bias/rel_embedding': (cfg.num_heads, 32),
      'decoder/decoder_norm/scale': (e,),
      'decoder/logits_dense/kernel': (e, v),
  }
  for i in range(cfg.num_encoder_layers):
    p = f'encoder/layers_{i}'
    tree |= attention(f'{p}/attention') | mlp(p)
    tree |= {f'{p}/{n}/scale': (e,) for n in ('pre_attention_layer_norm', 'pre_mlp_layer_norm')}
  for i in range(cfg.num_decoder_layers):
    p = f'decoder/layers_{i}'
    tree |= attention(f'{p}/self_attention') | attention(f'{p}/encoder_decoder_attention')
    tree |= mlp(p) | {f'{p}/{n}/scale': (e,) for n in (
        'pre_self_attention_layer_norm', 'pre_cross_attention_layer_norm', 'pre_mlp_layer_norm')}
  return tree


def _param_shapes(cfg: config_lib.T5Config) -> dict:
  tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  shapes = jax.eval_shape(network.Transformer(cfg).init, jax.random.key(0), tokens, tokens)
  return traverse_util.flatten_dict(shapes['params'], sep='/')


@pytest.mark.parametrize('name', sorted(PARAM_COUNTS))
def test_official_sizes_have_t5x_parameter_tree(name):
  cfg = config_lib.t5_1_1(name)
  shapes = _param_shapes(cfg)
  assert {k: v.shape for k, v in shapes.items()} == _expected_tree(cfg)
  assert all(v.dtype == jnp.float32 for v in shapes.values())
  arrays, params = PARAM_COUNTS[name]
  assert len(shapes) == arrays
  assert sum(int(np.prod(v.shape)) for v in shapes.values()) == params


def test_config_lookup_and_validation():
  small = config_lib.t5_1_1('small')
  assert (small.vocab_size, small.emb_dim, small.num_heads, small.mlp_dim) == (32128, 512, 6, 1024)
  assert config_lib.t5_1_1('xxl', dtype='bfloat16').compute_dtype == jnp.bfloat16
  with pytest.raises(ValueError, match='unknown T5 1.1 size'):
    config_lib.t5_1_1('huge')
  with pytest.raises(ValueError, match='dtype'):
    config_lib.t5_1_1('small', dtype='float16')
  with pytest.raises(ValueError, match='num_heads'):
    config_lib.t5_1_1('small', num_heads=0)
  hash(small)  # static jit argument


@pytest.fixture(scope='module')
def model():
  """The tiny network, its params, inputs, and jitted entry points."""
  net = network.Transformer(CONFIG)
  rng = np.random.default_rng(0)
  encoder_tokens = rng.integers(2, CONFIG.vocab_size, (BATCH, ENCODER_LEN)).astype(np.int32)
  encoder_tokens[1, 7:] = 0  # padding
  decoder_tokens = rng.integers(1, CONFIG.vocab_size, (BATCH, DECODER_LEN)).astype(np.int32)
  decoder_tokens[:, 0] = 0
  params = jax.jit(net.init)(jax.random.key(0), encoder_tokens, decoder_tokens)['params']
  full = jax.jit(lambda p, e, d: net.apply({'params': p}, e, d))

  @jax.jit
  def start(p, e):
    encoded = net.apply({'params': p}, e, method='encode')
    return net.apply({'params': p}, encoded, e, DECODER_LEN + 4, method='init_cache')

  decode = jax.jit(lambda p, tokens, cache: net.apply({'params': p}, tokens, cache,
                                                      method='decode'))
  return dict(params=params, encoder_tokens=encoder_tokens, decoder_tokens=decoder_tokens,
              full=full, start=start, decode=decode)


def _decode_chunks(m, cache, tokens, size):
  """Feeds `tokens` [B, L] in chunks of `size` -> logits [B, L, V], cache."""
  chunks = []
  for start in range(0, tokens.shape[1], size):
    logits, cache = m['decode'](m['params'], tokens[:, start:start + size], cache)
    chunks.append(logits)
  return jnp.concatenate(chunks, axis=1), cache


def test_init_folds_attention_scaling_into_query():
  params = jax.jit(network.Transformer(config_lib.t5_1_1('nano', vocab_size=64)).init)(
      jax.random.key(1), jnp.ones((1, 1), jnp.int32), jnp.ones((1, 1), jnp.int32))['params']
  attention = params['encoder']['layers_0']['attention']
  emb_dim = attention['key']['kernel'].shape[0]
  head_dim = 16
  key_std, query_std = (float(jnp.std(attention[n]['kernel'])) for n in ('key', 'query'))
  assert key_std == pytest.approx(emb_dim**-0.5, rel=0.1)
  assert query_std == pytest.approx(key_std / head_dim**0.5, rel=0.1)
  assert float(jnp.std(params['token_embedder']['embedding'])) == pytest.approx(1.0, rel=0.1)


@pytest.mark.parametrize('param_dtype,dtype', [(jnp.float32, jnp.float32),
                                               (jnp.float32, jnp.bfloat16),
                                               (jnp.bfloat16, jnp.float32)])
@pytest.mark.parametrize('shape', [(1, 1), (1, 5), (2, 8), (3, 7)])
def test_embed_looks_up_as_flax_embed_in_range_or_not(shape, param_dtype, dtype):
  rng = np.random.default_rng(sum(shape))
  ids = jnp.asarray(rng.integers(-12, 12, size=shape), jnp.int32)  # V = 10: some out of range
  ours = layers.Embed(10, 4, dtype=dtype, param_dtype=param_dtype)
  flax_embed = nn.Embed(10, 4, dtype=dtype, param_dtype=param_dtype)
  variables = flax_embed.init(jax.random.key(0), ids)
  want = flax_embed.apply(variables, ids)
  got = jax.jit(ours.apply)(variables, ids)
  assert got.dtype == want.dtype and got.shape == want.shape
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  jaxpr = str(jax.make_jaxpr(lambda i: ours.apply(variables, i))(ids))
  # Computing in float32 (on a CPU with the kernels) one kernel call; else jnp.take's gather.
  assert ('spec_decode_embed' in jaxpr) == (dtype == jnp.float32) == ('gather' not in jaxpr)
  # The rows looked up are cast, not the table (10 x 4).
  assert not re.search(r'\[10,4\] = convert_element_type', jaxpr)


def test_cache_layout(model):
  cache = model['start'](model['params'], model['encoder_tokens'])
  assert cache.capacity == DECODER_LEN + 4
  np.testing.assert_array_equal(cache.index, np.zeros(BATCH))
  state = cache.layers
  assert len(state.self_attention) == len(state.cross_attention) == CONFIG.num_decoder_layers
  kv_shape = (BATCH, CONFIG.num_heads, DECODER_LEN + 4, CONFIG.head_dim)
  assert all(kv.key.shape == kv.value.shape == kv_shape for kv in state.self_attention)
  assert not any(jnp.any(kv.key) for kv in state.self_attention)
  cross_shape = (BATCH, CONFIG.num_heads, ENCODER_LEN, CONFIG.head_dim)
  assert all(kv.key.shape == kv.value.shape == cross_shape for kv in state.cross_attention)
  np.testing.assert_array_equal(state.encoder_mask, model['encoder_tokens'] > 0)


def test_cached_decoding_matches_full_sequence(model):
  full = model['full'](model['params'], model['encoder_tokens'], model['decoder_tokens'])
  cache = model['start'](model['params'], model['encoder_tokens'])
  for size in (1, 4, DECODER_LEN):
    logits, out = _decode_chunks(model, cache, model['decoder_tokens'], size)
    tolerances.assert_close(logits, full, ulps=64, err_msg=f'K={size}')
    np.testing.assert_array_equal(out.index, np.full(BATCH, DECODER_LEN))


def test_chunk_equals_single_steps_in_logits_and_cache(model):
  cache = model['start'](model['params'], model['encoder_tokens'])
  prefix = model['decoder_tokens'][:, :4]
  _, cache = _decode_chunks(model, cache, prefix, 4)
  chunk = model['decoder_tokens'][:, 4:8]
  chunk_logits, chunk_cache = _decode_chunks(model, cache, chunk, 4)
  step_logits, step_cache = _decode_chunks(model, cache, chunk, 1)
  tolerances.assert_close(chunk_logits, step_logits, ulps=64)
  np.testing.assert_array_equal(chunk_cache.index, step_cache.index)
  for a, b in zip(jax.tree.leaves(chunk_cache.layers), jax.tree.leaves(step_cache.layers)):
    tolerances.assert_close(a, b, ulps=64)


def test_rewind_to_per_row_indices_then_decode_equals_fresh(model):
  """Stale entries past a rewound index are never seen; rows are independent."""
  tokens = model['decoder_tokens']
  cache = model['start'](model['params'], model['encoder_tokens'])
  _, cache = _decode_chunks(model, cache, tokens[:, :12], 4)
  index = np.array([5, 9, 2])
  cache = cache_lib.rewind(cache, index)
  new = np.random.default_rng(1).integers(1, CONFIG.vocab_size, (BATCH, 4)).astype(np.int32)
  logits, cache = model['decode'](model['params'], new, cache)
  np.testing.assert_array_equal(cache.index, index + 4)

  # Fresh sequences: each row's kept prefix, then its new tokens, then filler.
  fresh = tokens.copy()
  for b, i in enumerate(index):
    fresh[b, i:i + 4] = new[b]
  full = model['full'](model['params'], model['encoder_tokens'], fresh)
  for b, i in enumerate(index):
    tolerances.assert_close(logits[b], full[b, i:i + 4], ulps=64)


def test_encoder_padding_is_ignored(model):
  padded = np.pad(model['encoder_tokens'], ((0, 0), (0, 5)))
  short = model['full'](model['params'], model['encoder_tokens'], model['decoder_tokens'])
  long = model['full'](model['params'], padded, model['decoder_tokens'])
  tolerances.assert_close(long, short, ulps=64)


def test_dropout_only_when_enabled(model):
  net = network.Transformer(dataclasses.replace(CONFIG, dropout_rate=0.3))
  apply = jax.jit(lambda key, enable: net.apply(
      {'params': model['params']}, model['encoder_tokens'], model['decoder_tokens'],
      enable_dropout=enable, rngs={'dropout': key}), static_argnums=1)
  off = apply(jax.random.key(0), False)
  reference = model['full'](model['params'], model['encoder_tokens'], model['decoder_tokens'])
  tolerances.assert_close(off, reference, ulps=64)
  on_0, on_1 = apply(jax.random.key(0), True), apply(jax.random.key(1), True)
  assert not np.allclose(on_0, off, atol=1e-3)
  assert not np.allclose(on_0, on_1, atol=1e-3)


def test_bfloat16_compute_keeps_float32_params_and_logits(model):
  net = network.Transformer(dataclasses.replace(CONFIG, dtype='bfloat16'))

  @jax.jit
  def run(p, e, d):
    variables = {'params': p}
    encoded = net.apply(variables, e, method='encode')
    cache = net.apply(variables, encoded, e, DECODER_LEN, method='init_cache')
    return net.apply(variables, d, cache, method='decode')

  logits, cache = run(model['params'], model['encoder_tokens'], model['decoder_tokens'])
  assert logits.dtype == jnp.float32
  assert cache.layers.self_attention[0].key.dtype == jnp.bfloat16
  reference = model['full'](model['params'], model['encoder_tokens'], model['decoder_tokens'])
  scale = float(jnp.max(jnp.abs(reference)))
  assert float(jnp.max(jnp.abs(logits - reference))) < 0.1 * scale
