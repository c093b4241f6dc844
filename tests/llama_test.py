"""Tests for spec_decode.llama on random weights: the prompt cache, the loops, exactness, errors.

The Hugging Face parity tests are in llama_hf_parity_test.py; these need no
PyTorch. Checkpoint folders are written here from our own parameters.
"""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from spec_decode import cache as cache_lib
from spec_decode import checks
from spec_decode import kernels
from spec_decode import sampling
from spec_decode.checkpoints.hf import HF_FILE
from spec_decode.checkpoints.param_trees import flatten
from spec_decode.llama import LlamaConfig
from spec_decode.models import LlamaModel, beam_generate, generate, speculative_generate
from spec_decode.models import PRUNED_LOGIT, PrunedHeadDraft, T5Model
from spec_decode.models import drafts
from spec_decode.models import front_ends
from spec_decode.models import llama as llama_model
from spec_decode.models import protocol
from spec_decode.options import Knobs, LoopOptions
from spec_decode.t5 import t5_1_1
from tests import stubs
from tests import tolerances

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4)
GQA = LlamaConfig(**SIZES, num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                  eos_token_ids=(2,))
MHA = LlamaConfig(**SIZES, num_hidden_layers=2, num_key_value_heads=4, head_dim=24,
                  tie_word_embeddings=True, rope_theta=500000.0)
DRAFT = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, eos_token_ids=(2,))
PROMPTS = np.array([[5, 17, 99, 3, 42, 8, 61], [7, 0, 0, 0, 0, 0, 0], [9, 80, 4, 0, 0, 0, 0]])
LENGTHS = np.array([7, 1, 3])


def _noisy_copy(model: LlamaModel) -> LlamaModel:
  """The model with noise on every weight: a draft that guesses some tokens right, some wrong."""
  noise = stubs.llama_model(model.config, 1, scale=0.5).params
  return model.replace(params=jax.tree.map(jnp.add, model.params, noise))


def _batch(model: LlamaModel, prompts, lengths) -> protocol.Batch:
  """The prompts as the model reads them (what `start` takes)."""
  return protocol.Batch(prompts, lengths, reads=model.reads)


def _check_shared_vocabulary(target: LlamaModel, draft: LlamaModel, *,
                             allow_tokenizer_mismatch: bool = False) -> None:
  """What speculative_generate checks of a pair: sizes and family, then the tokenizers."""
  checks.check_pair(target, draft)
  if not allow_tokenizer_mismatch:
    llama_model.check_tokenizers(target, draft)


@jax.jit
def _forward(model: LlamaModel, tokens: jax.Array) -> jax.Array:
  """[B, L] tokens at positions 0..L-1 -> [B, L, V] logits (no cache)."""
  return model.network.apply({'params': model.params}, tokens)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _logits_after(model, tokens, lengths, capacity, chunks):
  """Logits of `tokens` fed after the prompts, in calls of the static sizes `chunks`."""
  step_fn, cache = model.start(_batch(model, PROMPTS, lengths), capacity)
  out, start = [], 0
  for size in chunks:
    logits, cache = step_fn(tokens[:, start:start + size], cache)
    out.append(logits)
    start += size
  return jnp.concatenate(out, axis=1), cache.index


@pytest.mark.parametrize('config', [GQA, MHA], ids=['gqa', 'mha_tied'])
def test_multi_token_steps_equal_single_steps_and_the_full_sequence(config):
  model = stubs.llama_model(config, 0)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 128, (3, 6)), jnp.int32)
  single, index = _logits_after(model, tokens, LENGTHS, 8, (1,) * 6)
  chunked, chunk_index = _logits_after(model, tokens, LENGTHS, 8, (4, 2))
  np.testing.assert_array_equal(index, [6, 6, 6])
  np.testing.assert_array_equal(chunk_index, [6, 6, 6])
  tolerances.assert_close(chunked, single, ulps=64)
  # Loop position 0 stands for the prompt's last token, whatever the loop feeds there;
  # the rows are right-padded to one length (causal: the padding changes nothing before it).
  sequences = np.zeros((3, PROMPTS.shape[1] + 5), np.int32)
  for b, length in enumerate(LENGTHS):
    sequences[b, :length + 5] = np.concatenate([PROMPTS[b, :length], tokens[b, 1:]])
  full = _forward(model, sequences)
  for b, length in enumerate(LENGTHS):
    tolerances.assert_close(single[b], full[b, length - 1:length + 5], ulps=64, err_msg=f'row {b}')


@jax.jit
def _rewound_and_clean(model, tokens, garbage):
  """Logits of `garbage` at loop position 1 after writing `tokens` and rewinding, and without.

  Rewound, the entries of tokens[:, 3:] stay in the buffers, past the garbage.
  """
  step_fn, cache = model.start(_batch(model, PROMPTS, LENGTHS), 8)
  _, written = step_fn(tokens, cache)
  rewound, _ = step_fn(garbage, cache_lib.rewind(written, jnp.ones((3,), jnp.int32)))
  _, clean = step_fn(tokens[:, :1], cache)
  return rewound, step_fn(garbage, clean)[0]


def test_rewound_entries_are_never_read():
  rng = np.random.default_rng(2)
  rewound, clean = _rewound_and_clean(stubs.llama_model(GQA, 0), rng.integers(0, 128, (3, 5)),
                                      rng.integers(0, 128, (3, 2)))
  tolerances.assert_close(rewound, clean, ulps=64)


@pytest.mark.parametrize('gamma', [0, 3])
def test_ragged_batch_rows_equal_their_batch_1_runs(gamma):
  target = stubs.llama_model(GQA, 0)
  draft = _noisy_copy(target)
  run = functools.partial(speculative_generate, target, draft, gamma=gamma) if gamma else (
      functools.partial(generate, target))
  batch = run(PROMPTS, jax.random.key(0), lengths=LENGTHS, max_decode_len=10)
  assert np.all(np.asarray(batch.generated) >= 1)
  for b in range(len(PROMPTS)):
    alone = run(PROMPTS[b:b + 1], jax.random.key(0), lengths=LENGTHS[b:b + 1], max_decode_len=10)
    np.testing.assert_array_equal(batch.tokens[b], alone.tokens[0], err_msg=f'row {b}')
  if gamma:  # speculative greedy is the baseline's greedy
    baseline = generate(target, PROMPTS, jax.random.key(0), lengths=LENGTHS, max_decode_len=10)
    np.testing.assert_array_equal(batch.tokens, baseline.tokens)
    hist = np.asarray(batch.accept_histogram)
    assert hist[0] > 0 and hist[1:].sum() > 0, hist  # rejections, and drafts kept


def test_speculative_beam_search_over_prompt_caches_equals_beam_search():
  """Beam search reorders cache rows (every leaf of the prompt cache) between steps."""
  target = stubs.llama_model(GQA, 0)
  draft = _noisy_copy(target)
  beams = functools.partial(beam_generate, target, PROMPTS, lengths=LENGTHS, beam_size=3,
                            max_decode_len=8, eos_id=2)
  plain, spec = beams(), beams(draft=draft, gamma=2)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  np.testing.assert_allclose(spec.scores, plain.scores, rtol=1e-5)


TINY = LlamaConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=8)
TINY_DRAFT = LlamaConfig(vocab_size=6, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=8)


@functools.partial(jax.jit, static_argnums=(4,), compiler_options=stubs.OPTIMIZED)
def _sample(target, draft, prompts, lengths, options, rng):
  return front_ends.decode(target, draft, _batch(target, prompts, lengths), rng, options,
                           Knobs.create(sampling.SamplingParams.create(temperature=1.0)))


@pytest.mark.parametrize('gamma', [0, 2])
def test_sampled_sequences_follow_the_target(gamma):
  """Joint law of the first three tokens after two ragged prompts == p's, by chi-square.

  Two tests per case (one per prompt), each at FALSE_POSITIVE_RATE.
  """
  target, draft = stubs.llama_model(TINY, 3, scale=3.0), stubs.llama_model(TINY_DRAFT, 4, scale=3.0)
  prompts, lengths = np.array([[3, 1, 4, 1], [5, 2, 0, 0]]), np.array([4, 2])
  rows = 40_000
  out = _sample(target, draft if gamma else None, np.repeat(prompts, rows, 0),
                np.repeat(lengths, rows), LoopOptions(3, gamma, eos_id=-1),
                jax.random.key(7))
  tokens = np.asarray(out.tokens)
  for i, (prompt, length) in enumerate(zip(prompts, lengths)):
    law = stubs.first_three_law(lambda x: _forward(target, x), prompt[:length],
                                target.vocab_size)
    pvalue = stubs.first_three_pvalue(tokens[i * rows:(i + 1) * rows], law)
    assert pvalue > FALSE_POSITIVE_RATE, f'prompt {i}'
  if gamma:  # drafts were rejected and swept: both the residual and the bonus paths ran
    hist = np.asarray(out.accept_histogram)
    assert hist[0] > 0 and hist[gamma] > 0, hist


def test_checkpoint_folders_load_whole_and_sharded(tmp_path):
  model = stubs.llama_model(GQA, 0)
  for shards in (1, 3):
    loaded = LlamaModel.load(stubs.save_llama(model, tmp_path / f'shards{shards}', shards))
    assert loaded.config == GQA
    for name, x in flatten(model.params).items():
      np.testing.assert_array_equal(flatten(loaded.params)[name], x, err_msg=name)
  as_bf16 = LlamaModel.load(str(tmp_path / 'shards1'), dtype='bfloat16')
  assert {x.dtype for x in jax.tree.leaves(as_bf16.params)} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize('overrides, match', [
    ({'rope_scaling': {'rope_type': 'llama3', 'factor': 8.0}}, 'rope_scaling'),
    ({'rope_parameters': {'rope_type': 'linear', 'factor': 2.0}}, 'rope_parameters'),
    ({'attention_bias': True}, 'attention_bias'),
    ({'mlp_bias': True}, 'mlp_bias'),
    ({'hidden_act': 'gelu'}, 'hidden_act'),
    ({'model_type': 'mistral'}, "model_type is 'mistral'"),
    ({'architectures': ['LlamaForSequenceClassification']}, 'only LlamaForCausalLM'),
    ({'hidden_size': None}, 'missing required key.*hidden_size'),
    ({'num_key_value_heads': 3}, 'must divide'),
])
def test_configs_of_other_models_are_refused(tmp_path, overrides, match):
  directory = stubs.save_llama(stubs.llama_model(GQA, 0), tmp_path, **overrides)
  with pytest.raises(ValueError, match=match) as error:
    LlamaConfig.from_hf(directory)
  assert 'config.json' in str(error.value)


@pytest.mark.parametrize('overrides, match', [
    ({'tie_word_embeddings': 'false'},
     r"field tie_word_embeddings must be true or false, got 'false' \(a JSON string: drop"),
    ({'attention_bias': 0}, r'field attention_bias must be true or false, got 0'),
    ({'eos_token_id': 500}, r'field eos_token_id must be a token id in 0..vocab_size - 1 = 127 '
                            r'or a list of them \(or null\), got 500'),
    ({'eos_token_id': [2, -1]}, r'field eos_token_id must be a token id .*got \[2, -1\]'),
    ({'bos_token_id': 128}, r'field bos_token_id must be a token id in 0..vocab_size - 1 = 127 '
                            r'\(or null\), got 128'),
    ({'num_hidden_layers': '2'},
     r"field num_hidden_layers must be a positive integer, got '2' \(a JSON string: drop"),
    ({'vocab_size': 128.0}, r'field vocab_size must be a positive integer, got 128.0'),
    ({'head_dim': 0}, r'field head_dim must be a positive integer, got 0'),
    ({'rms_norm_eps': '1e-5'}, r"field rms_norm_eps must be a positive number, got '1e-5'"),
    ({'rope_parameters': {'rope_type': 'default', 'rope_theta': 'big'}},
     r"field rope_parameters.rope_theta must be a positive number, got 'big' \(a JSON string\)"),
])
def test_config_fields_of_the_wrong_type_or_range_name_the_file_and_field(tmp_path, overrides,
                                                                           match):
  directory = stubs.save_llama(stubs.llama_model(GQA, 0), tmp_path, **overrides)
  with pytest.raises(ValueError, match=re.escape(os.path.join(directory, 'config.json')) + ': ' +
                     match):
    LlamaConfig.from_hf(directory)


def test_config_ids_and_booleans_are_checked_when_built_directly():
  with pytest.raises(ValueError,
                     match=r'eos_token_ids must be a tuple of ids in 0..vocab_size - 1 = 127, got'):
    LlamaConfig(**{**GQA.__dict__, 'eos_token_ids': (128,)})
  with pytest.raises(ValueError, match=r"tie_word_embeddings must be True or False, got 'no'"):
    LlamaConfig(**{**GQA.__dict__, 'tie_word_embeddings': 'no'})


def test_checkpoints_that_do_not_fit_name_every_bad_array(tmp_path):
  directory = stubs.save_llama(stubs.llama_model(GQA, 0), tmp_path)
  file = os.path.join(directory, HF_FILE)
  tensors = safetensors.numpy.load_file(file)
  tensors.pop('model.layers.1.mlp.up_proj.weight')
  tensors['model.layers.0.self_attn.q_proj.bias'] = np.zeros(64, np.float32)
  tensors['model.layers.0.self_attn.k_proj.weight'] = np.zeros((64, 64), np.float32)
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(ValueError, match=r'missing array model\.layers\.1\.mlp\.up_proj\.weight'
                     r'(.|\n)*unexpected array model\.layers\.0\.self_attn\.q_proj\.bias'):
    LlamaModel.load(directory)
  tensors['model.layers.1.mlp.up_proj.weight'] = np.zeros((96, 64), np.float32)
  del tensors['model.layers.0.self_attn.q_proj.bias']
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(ValueError, match=r'shape mismatch for model\.layers\.0\.self_attn\.k_proj'
                     r'\.weight: found \(64, 64\), the config needs \(32, 64\)'):
    LlamaModel.load(directory)
  tensors['model.layers.0.self_attn.k_proj.weight'] = np.zeros((32, 64), np.int8)
  safetensors.numpy.save_file(tensors, file)
  with pytest.raises(ValueError, match='k_proj.weight has dtype int8'):
    LlamaModel.load(directory)


def test_target_and_draft_must_share_the_vocabulary(tmp_path):
  target = stubs.llama_model(GQA, 0)
  other = stubs.llama_model(LlamaConfig(**{**DRAFT.__dict__, 'vocab_size': 100}), 1)
  with pytest.raises(ValueError, match='draft vocab_size 100 != target vocab_size 128'):
    speculative_generate(target, other, PROMPTS, 0, lengths=LENGTHS, gamma=2, max_decode_len=4)
  with pytest.raises(ValueError, match='draft vocab_size 100'):  # no override for the sizes
    speculative_generate(target, other, PROMPTS, 0, lengths=LENGTHS, gamma=2, max_decode_len=4,
                         allow_tokenizer_mismatch=True)
  with pytest.raises(ValueError, match='draft vocab_size 100'):
    _check_shared_vocabulary(target, other, allow_tokenizer_mismatch=True)

  folders = [stubs.save_llama(m, tmp_path / name)
             for m, name in ((target, 't'), (stubs.llama_model(DRAFT, 1), 'd'))]
  for folder, text in zip(folders, ('{"vocab": 1}', '{"vocab": 2}')):
    with open(os.path.join(folder, 'tokenizer.json'), 'w') as f:
      f.write(text)
  target, draft = (LlamaModel.load(folder) for folder in folders)
  assert target.tokenizer[0][0] == 'tokenizer.json' and target.tokenizer != draft.tokenizer
  with pytest.raises(ValueError, match='different tokenizer.json.*allow_tokenizer_mismatch'):
    speculative_generate(target, draft, PROMPTS, 0, lengths=LENGTHS, gamma=2, max_decode_len=4)
  with pytest.raises(ValueError, match='different tokenizer.json.*allow_tokenizer_mismatch'):
    _check_shared_vocabulary(target, draft)
  _check_shared_vocabulary(target, draft, allow_tokenizer_mismatch=True)
  _check_shared_vocabulary(target, draft.replace(tokenizer=()))  # unknown: nothing to compare
  _check_shared_vocabulary(target, draft.replace(tokenizer=target.tokenizer))


def test_bad_prompts_and_eos_settings_raise_clear_errors():
  model = stubs.llama_model(GQA, 0)
  run = functools.partial(generate, model, rng=0, max_decode_len=4)
  with pytest.raises(ValueError, match=r'lengths must lie in 1\.\.P=7'):
    run(PROMPTS, lengths=np.array([7, 0, 3]))
  with pytest.raises(ValueError, match=r'lengths must be \[B=3\] integers'):
    run(PROMPTS, lengths=np.array([7, 1]))
  with pytest.raises(ValueError, match=r'prompt_tokens\[2, 1\] = 128 is outside'):
    run(np.where(PROMPTS == 80, 128, PROMPTS), lengths=LENGTHS)
  run(np.where(PROMPTS == 0, 999, PROMPTS), lengths=LENGTHS)  # ids past a row's length are ignored
  with pytest.raises(ValueError, match=r'prompt_tokens must be integer token ids \[B, P\]'):
    run(np.zeros((3, 0), np.int32), lengths=None)
  several = model.replace(config=LlamaConfig(**{**GQA.__dict__, 'eos_token_ids': (2, 9)}))
  with pytest.raises(ValueError, match=r'several EOS ids \(2, 9\).*pass eos_id'):
    generate(several, PROMPTS, 0, lengths=LENGTHS, max_decode_len=4)


@pytest.mark.parametrize('config', [GQA, MHA], ids=['untied', 'tied'])
def test_pruned_head_draft_scores_its_ids_as_the_full_head_and_equals_greedy(config):
  target = stubs.llama_model(config, 0)
  draft = _noisy_copy(target)
  baseline = generate(target, PROMPTS, 0, lengths=LENGTHS, max_decode_len=12)
  ids = drafts.most_frequent_ids(np.asarray(baseline.tokens).ravel(), 128, 16)
  assert not np.isin(baseline.tokens, ids).all()  # the target also picks tokens the draft cannot
  pruned = PrunedHeadDraft.create(draft, ids)
  assert pruned.reads == protocol.PROMPT
  # Packed with its model's layers (LlamaModel.with_panels) where the CPU kernels run.
  assert (pruned.head_panels is not None) == (pruned.model.panels is not None) == kernels.in_use()

  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 128, (3, 6)), jnp.int32)
  full, index = _logits_after(draft, tokens, LENGTHS, 8, (4, 2))
  scored, scored_index = _logits_after(pruned, tokens, LENGTHS, 8, (4, 2))
  np.testing.assert_array_equal(scored_index, index)
  kept = np.isin(np.arange(128), ids)
  tolerances.assert_close(scored[..., kept], full[..., kept], ulps=64)
  assert np.all(np.asarray(scored)[..., ~kept] == PRUNED_LOGIT)

  out = speculative_generate(target, pruned, PROMPTS, 0, lengths=LENGTHS, gamma=3,
                             max_decode_len=12)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  assert np.asarray(out.accept_histogram)[1:].sum() > 0  # drafts kept, not only rejections


def test_pruned_head_draft_pairs_only_with_its_own_family():
  t5 = T5Model.random(t5_1_1('tiny', vocab_size=128), jax.random.key(0))
  t5_draft = PrunedHeadDraft.create(t5, np.arange(0, 128, 2))
  assert t5_draft.reads == protocol.ENCODER_INPUT
  with pytest.raises(ValueError, match='the target reads its inputs as .*pair models of one family'):
    speculative_generate(stubs.llama_model(GQA, 0), t5_draft, PROMPTS, 0, lengths=LENGTHS,
                         gamma=3, max_decode_len=4)
  with pytest.raises(TypeError, match='wraps a T5Model or a LlamaModel, not a UniformDraft'):
    PrunedHeadDraft.create(drafts.UniformDraft(128), np.arange(4))
