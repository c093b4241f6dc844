"""The memory a decoding run needs (spec_decode.cli.memory), against a hand count."""

import pytest

from spec_decode.cli import memory
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.t5 import t5_1_1

# tiny: E = 64, H = 4, 2 + 2 layers, Dh = 16, mlp 128, 32 buckets; V = 100; float32.
TINY = t5_1_1('tiny', vocab_size=100)
E, H, DH, MLP, V = 64, 4, 16, 128, 100
ENCODER_LAYER = 4 * E * H * DH + 3 * E * MLP + 2 * E  # q, k, v, out; wi_0, wi_1, wo; 2 norms
DECODER_LAYER = 8 * E * H * DH + 3 * E * MLP + 3 * E  # self and cross attention; 3 norms
WEIGHTS = (V * E + 2 * ENCODER_LAYER + 32 * H + E  # embedding, encoder, its relpos and norm
           + 2 * DECODER_LAYER + 32 * H + E + E * V)  # decoder, its relpos, norm, logits


def test_estimate_against_a_hand_count():
  rows, input_len, max_decode_len, gamma = 3, 5, 7, 2
  capacity = max_decode_len + gamma + 1  # cache_length
  parts = memory.estimate({'target': TINY, 'draft': TINY}, rows=rows, input_len=input_len,
                          max_decode_len=max_decode_len, gamma=gamma)
  kv_per_position = 2 * 2 * rows * H * DH * 4  # keys and values, 2 decoder layers, float32
  assert parts == {
      'parameters': 2 * WEIGHTS * 4,
      'encoder outputs': 2 * rows * input_len * E * 4,
      'KV caches': 2 * kv_per_position * (input_len + capacity),  # cross and self attention
      'tokens': rows * (max_decode_len + gamma + 2) * 4,
  }
  assert WEIGHTS * 4 == 841728


def test_bfloat16_halves_parameters_and_caches():
  half = t5_1_1('tiny', vocab_size=100, dtype='bfloat16', param_dtype='bfloat16')
  full, bf16 = (memory.estimate({'target': c}, rows=2, input_len=4, max_decode_len=6, gamma=0)
                for c in (TINY, half))
  for part in ('parameters', 'encoder outputs', 'KV caches'):
    assert 2 * bf16[part] == full[part]


@pytest.mark.parametrize('decode, speculate, rows', [
    ('sample', True, 8), ('beam', False, 8 * 4), ('beam', True, 8 * 4 * 3)])
def test_cache_rows(decode, speculate, rows):
  assert memory.cache_rows(batch_size=8, decode=decode, beam_size=4, draft_width=3,
                           speculate=speculate) == rows


def test_check_names_the_settings_the_estimate_and_the_limit():
  parts = {'parameters': 1 * memory.GB, 'KV caches': 3 * memory.GB}
  memory.check(parts, limit_gb=4.0)
  with pytest.raises(ConfigError, match=r'MAX_DECODE_LEN and BATCH_SIZE .* need at least 4 GB '
                                        r'\(KV caches 3 GB, parameters 1 GB\) but '
                                        r'MEMORY_LIMIT_GB is 3.5 GB: lower MAX_DECODE_LEN'):
    memory.check(parts, limit_gb=3.5)


def test_available_memory_of_this_host():
  found = memory.available_bytes()
  assert found is not None and found[0] > 0, found


def test_panels_count_each_dense_kernel_at_two_bytes_where_the_kernels_pack_them():
  kernel_weights = (2 * (4 * E * H * DH + 3 * E * MLP)  # encoder layers
                    + 2 * (8 * E * H * DH + 3 * E * MLP) + E * V)  # decoder layers, logits
  sizes = dict(rows=2, input_len=4, max_decode_len=6, gamma=1)
  both = {'target': TINY, 'draft': TINY}
  with_panels = memory.estimate(both, panels=True, **sizes)
  assert with_panels.pop('panels') == 2 * 2 * kernel_weights
  assert with_panels == memory.estimate(both, **sizes)
  # Computing in bfloat16 the kernels do not apply: nothing packed.
  half = t5_1_1('tiny', vocab_size=100, dtype='bfloat16', param_dtype='bfloat16')
  assert 'panels' not in memory.estimate({'target': half}, panels=True, **sizes)
