"""Tests of the bundled demo pair: configs, checkpoints, exact greedy speculation."""

import gin
import jax
import numpy as np
import pytest

from spec_decode.cli import gin_utils
from spec_decode import data
from spec_decode import demo
from spec_decode.harness import loading
from spec_decode import models
from spec_decode.t5 import T5Config


@pytest.mark.parametrize('name', demo.NAMES)
def test_gin_model_files_match_the_bundled_configs(name):
  gin.clear_config()
  gin.add_config_file_search_path(str(gin_utils.GIN_DIR))
  gin.parse_config_files_and_bindings([f'models/demo/{name}.gin'], None, finalize_config=False)
  from_gin = gin.get_configurable(f'demo_{name}/spec_decode.t5.T5Config')()
  gin.clear_config()
  expected = demo.config(name)
  assert isinstance(from_gin, T5Config)
  for field in ('vocab_size', 'emb_dim', 'num_heads', 'num_encoder_layers',
                'num_decoder_layers', 'head_dim', 'mlp_dim'):
    assert getattr(from_gin, field) == getattr(expected, field), field


def test_unknown_demo_model_is_an_error():
  with pytest.raises(ValueError, match='unknown demo model'):
    demo.config('draft_huge')


@pytest.fixture(scope='module')
def pair():
  return demo.load('target'), demo.load('draft_small')


def test_bundled_checkpoints_load_in_float32(pair):
  for model in pair:
    leaves = jax.tree.leaves(model.params)
    assert all(x.dtype == np.float32 for x in leaves)


def test_greedy_speculation_on_the_bundled_pair_equals_the_baseline(pair):
  target, draft = pair
  examples = data.load_examples('demo_ende', 'test_multi30k', 4)
  inputs = loading.encode_texts([e['inputs'] for e in examples], 64)
  key = jax.random.split(jax.random.key(0), len(examples))
  base = models.generate(target, inputs, key, max_decode_len=32)
  spec = models.speculative_generate(target, draft, inputs, key, gamma=3, max_decode_len=32)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  assert int(np.sum(spec.loop_target_calls)) < int(np.sum(base.loop_target_calls))


def test_the_demo_draft_scores_the_most_frequent_half_of_the_vocabulary():
  pruned = demo.load_draft('draft_small', head_size=4096)  # the demo's draft
  assert isinstance(pruned, models.PrunedHeadDraft)
  stream = loading.target_token_stream('demo_ende', 'train')
  counts = np.bincount(stream, minlength=demo.DEMO_VOCAB_SIZE)
  ids = np.asarray(pruned.ids)
  assert ids.shape == (4096,) and {0, 1} <= set(ids.tolist())  # BOS and EOS
  others = np.setdiff1d(np.arange(demo.DEMO_VOCAB_SIZE), ids)
  assert counts[ids[ids > 1]].min() >= counts[others].max()  # no left-out token is more frequent


def test_head_size_needs_a_draft_model_and_a_size_of_the_vocabulary():
  with pytest.raises(ValueError, match='head_size applies to draft models'):
    demo.load_draft('bigram', head_size=64)
  for size in (-1, 1, 8193):
    with pytest.raises(ValueError, match=r'head_size must be 0 or in 2\.\.8192'):
      demo.load_draft('draft_small', head_size=size)


def test_the_console_table_is_short_and_says_what_bounds_the_speedup():
  from spec_decode.harness import report
  rows = [dict(temperature=t, top_k=k, top_p=p, q_untruncated=bool(k or p < 1), gamma=3,
               alpha=0.7436, measured_speedup=0.98, baseline_token_ms=0.778, identical=1.0,
               predicted_speedup=1.36, c=0.156, c_first=0.395, predicted_decode_speedup=1.11,
               speculative_fixed_ms=8.5)
          for t, k, p in ((0.0, 0, 1.0), (1.0, 0, 1.0), (1.0, 40, 1.0), (1.0, 0, 0.9))]
  table = report.markdown_table(rows, demo.CONSOLE_COLUMNS)
  lines = table.splitlines()
  assert max(map(len, lines)) <= 100 and lines[0].count('|') == 8  # 7 columns
  assert '| T=0 | 3 | 0.744 | 0.98X | 0.778 | 0.794 | yes |' in lines
  line = demo.bound_line(rows)
  assert '1.36X' in line and '8.5 ms' in line and '1.11X predicted for whole decodes' in line
