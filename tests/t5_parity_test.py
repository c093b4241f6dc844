"""Parity of spec_decode.t5 with Hugging Face's T5ForConditionalGeneration (fp32).

The same random weights are mapped from the T5X layout into the PyTorch model
(T5 1.1: gated-gelu with tanh GELU, untied lm_head, no logit rescaling). The
sequences are longer than max_distance = 128, so the logarithmic and the last
relative-position buckets are exercised in both directions.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.t5.config import T5Config
from spec_decode.t5 import layers, network

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

# H * Dh != E, so transposed or mis-reshaped projections cannot pass.
CONFIG = T5Config(vocab_size=100, emb_dim=48, num_heads=4, num_encoder_layers=2,
                  num_decoder_layers=2, head_dim=16, mlp_dim=96)
ENCODER_LEN, DECODER_LEN = 160, 140
TOLERANCE = 1e-4


def _hf_state_dict(params, cfg: T5Config) -> dict:
  """T5X-layout params -> HF T5ForConditionalGeneration state dict."""
  t = lambda x: torch.from_numpy(np.array(x))  # copy, writable
  dense = lambda p: t(p['kernel']).T.contiguous()  # [in, out] -> torch [out, in]
  attention = lambda p, prefix: {f'{prefix}.{hf}.weight': dense(p[ours]) for hf, ours in
                                 (('q', 'query'), ('k', 'key'), ('v', 'value'), ('o', 'out'))}
  mlp = lambda p, prefix: {f'{prefix}.DenseReluDense.{n}.weight': dense(p[n])
                           for n in ('wi_0', 'wi_1', 'wo')}
  enc, dec = params['encoder'], params['decoder']
  sd = {
      'shared.weight': t(params['token_embedder']['embedding']),
      'encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight':
          t(enc['relpos_bias']['rel_embedding']).T.contiguous(),
      'encoder.final_layer_norm.weight': t(enc['encoder_norm']['scale']),
      'decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight':
          t(dec['relpos_bias']['rel_embedding']).T.contiguous(),
      'decoder.final_layer_norm.weight': t(dec['decoder_norm']['scale']),
      'lm_head.weight': dense(dec['logits_dense']),
  }
  for i in range(cfg.num_encoder_layers):
    p, prefix = enc[f'layers_{i}'], f'encoder.block.{i}.layer'
    sd.update(attention(p['attention'], f'{prefix}.0.SelfAttention'))
    sd[f'{prefix}.0.layer_norm.weight'] = t(p['pre_attention_layer_norm']['scale'])
    sd.update(mlp(p['mlp'], f'{prefix}.1'))
    sd[f'{prefix}.1.layer_norm.weight'] = t(p['pre_mlp_layer_norm']['scale'])
  for i in range(cfg.num_decoder_layers):
    p, prefix = dec[f'layers_{i}'], f'decoder.block.{i}.layer'
    sd.update(attention(p['self_attention'], f'{prefix}.0.SelfAttention'))
    sd[f'{prefix}.0.layer_norm.weight'] = t(p['pre_self_attention_layer_norm']['scale'])
    sd.update(attention(p['encoder_decoder_attention'], f'{prefix}.1.EncDecAttention'))
    sd[f'{prefix}.1.layer_norm.weight'] = t(p['pre_cross_attention_layer_norm']['scale'])
    sd.update(mlp(p['mlp'], f'{prefix}.2'))
    sd[f'{prefix}.2.layer_norm.weight'] = t(p['pre_mlp_layer_norm']['scale'])
  return sd


def _hf_model(params, cfg: T5Config):
  hf_config = transformers.T5Config(
      vocab_size=cfg.vocab_size, d_model=cfg.emb_dim, d_kv=cfg.head_dim, d_ff=cfg.mlp_dim,
      num_layers=cfg.num_encoder_layers, num_decoder_layers=cfg.num_decoder_layers,
      num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.num_buckets,
      relative_attention_max_distance=cfg.max_distance, dropout_rate=0.0,
      layer_norm_epsilon=1e-6, feed_forward_proj='gated-gelu', tie_word_embeddings=False,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  model = transformers.T5ForConditionalGeneration(hf_config).eval()
  # Recent transformers versions tie lm_head to the shared embedding whatever the
  # config says; T5 1.1 has its own output layer, so untie it.
  model.lm_head.weight = torch.nn.Parameter(torch.empty(cfg.vocab_size, cfg.emb_dim))
  state = _hf_state_dict(params, cfg)
  missing, unexpected = model.load_state_dict(state, strict=False)
  tied = {'encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'}
  assert set(missing) <= tied and not unexpected, (missing, unexpected)
  assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()
  assert not getattr(model.config, 'scale_decoder_outputs', False)
  return model


@pytest.fixture(scope='module')
def setup():
  cfg = CONFIG
  model = network.Transformer(cfg)
  rng = np.random.default_rng(0)
  encoder_tokens = rng.integers(2, cfg.vocab_size, (2, ENCODER_LEN)).astype(np.int32)
  encoder_tokens[1, 121:] = 0  # padding
  decoder_tokens = rng.integers(1, cfg.vocab_size, (2, DECODER_LEN)).astype(np.int32)
  decoder_tokens[:, 0] = 0  # BOS
  params = model.init(jax.random.key(0), encoder_tokens[:, :4], decoder_tokens[:, :4])['params']
  # Norm scales start at one: randomise them so a mis-mapped norm shows.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * (1 + 0.2 * jax.random.normal(
          jax.random.key(len(str(path))), x.shape)) if path[-1].key == 'scale' else x, params)
  hf = _hf_model(params, cfg)
  return cfg, model, params, hf, encoder_tokens, decoder_tokens


def _hf_outputs(hf, encoder_tokens, decoder_tokens):
  with torch.no_grad():
    ids = torch.from_numpy(encoder_tokens).long()
    mask = (ids != 0).long()
    encoded = hf.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = hf(input_ids=ids, attention_mask=mask,
                decoder_input_ids=torch.from_numpy(decoder_tokens).long(),
                use_cache=False).logits
  return encoded.numpy(), logits.numpy()


def _max_diff(ours, theirs, valid=None):
  diff = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))
  return float(diff[valid].max() if valid is not None else diff.max())


def test_relative_position_buckets_match_hf():
  relative = np.arange(-400, 401)
  hf_bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
  for bidirectional in (True, False):
    ours = layers.relative_position_bucket(jnp.asarray(relative), bidirectional, 32, 128)
    theirs = hf_bucket(torch.from_numpy(relative), bidirectional=bidirectional,
                       num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


def test_encoder_and_logits_match_hf(setup):
  cfg, model, params, hf, encoder_tokens, decoder_tokens = setup
  hf_encoded, hf_logits = _hf_outputs(hf, encoder_tokens, decoder_tokens)
  variables = {'params': params}
  encoded = model.apply(variables, encoder_tokens, method='encode')
  logits = model.apply(variables, encoder_tokens, decoder_tokens)
  assert logits.dtype == jnp.float32 and logits.shape == (2, DECODER_LEN, cfg.vocab_size)
  valid = encoder_tokens != 0  # padded encoder outputs are never attended to
  assert _max_diff(encoded, hf_encoded, valid) < TOLERANCE
  assert _max_diff(logits, hf_logits) < TOLERANCE
  assert np.abs(hf_logits).max() > 1.0  # the comparison is not between near-zeros


def test_chunked_cached_decode_matches_hf(setup):
  cfg, model, params, hf, encoder_tokens, decoder_tokens = setup
  _, hf_logits = _hf_outputs(hf, encoder_tokens, decoder_tokens)
  variables = {'params': params}
  encoded = model.apply(variables, encoder_tokens, method='encode')
  cache = model.apply(variables, encoded, encoder_tokens, DECODER_LEN, method='init_cache')
  decode = jax.jit(lambda tokens, cache: model.apply(variables, tokens, cache, method='decode'))
  chunks, start = [], 0
  for size in (1, 6, 33, 100):  # 140 positions in all
    logits, cache = decode(decoder_tokens[:, start:start + size], cache)
    chunks.append(logits)
    start += size
  assert start == DECODER_LEN
  assert _max_diff(np.concatenate(chunks, axis=1), hf_logits) < TOLERANCE
