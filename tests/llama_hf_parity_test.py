"""Parity of spec_decode.llama with Hugging Face's LlamaForCausalLM (fp32).

Random tiny models are saved by transformers' own `save_pretrained` (one of
them sharded) and loaded by `LlamaModel.load`; logits, greedy generation and
speculative greedy generation are compared with transformers'.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.llama import LlamaConfig
from spec_decode.models import LlamaModel, generate, speculative_generate
from spec_decode.models import protocol

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

# Relative to the logits' magnitude: max|ours - theirs| <= TOLERANCE * max(1, max|theirs|).
TOLERANCE = 1e-4
MAX_DECODE_LEN = 12
EOS = 2
PROMPTS = np.array([[5, 17, 99, 3, 42, 8, 61], [7, 0, 0, 0, 0, 0, 0], [9, 80, 4, 0, 0, 0, 0]])
LENGTHS = np.array([7, 1, 3])
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             initializer_range=0.1, eos_token_id=EOS, bos_token_id=1)
MODELS = {
    # Grouped-query attention, untied output layer, non-default rope_theta and epsilon.
    'gqa': dict(SIZES, num_hidden_layers=3, num_key_value_heads=2, rms_norm_eps=1e-5,
                rope_parameters={'rope_type': 'default', 'rope_theta': 500000.0}),
    # Multi-head attention, tied embeddings, head_dim != hidden_size / heads.
    'mha_tied': dict(SIZES, num_hidden_layers=2, num_key_value_heads=4, head_dim=24,
                     tie_word_embeddings=True),
    'draft': dict(SIZES, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1),
}


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
  """{name: (folder, transformers model)}; the GQA model is saved in shards."""
  torch.manual_seed(0)
  saved = {}
  for name, settings in MODELS.items():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).eval()
    with torch.no_grad():  # norms away from 1, so that a norm read wrongly shows
      for parameter_name, parameter in model.named_parameters():
        if 'norm' in parameter_name:
          parameter.copy_(1 + 0.2 * torch.randn_like(parameter))
    folder = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(folder, max_shard_size='40KB' if name == 'gqa' else '50GB')
    saved[name] = folder, model
  assert os.path.isfile(os.path.join(saved['gqa'][0], 'model.safetensors.index.json'))
  return saved


def _assert_close_to(ours, theirs, err_msg=''):
  bound = TOLERANCE * max(1.0, float(np.max(np.abs(theirs))))
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=bound, err_msg=err_msg)


@pytest.mark.parametrize('name', ['gqa', 'mha_tied'])
def test_logits_match_transformers(checkpoints, name):
  folder, theirs = checkpoints[name]
  ours = LlamaModel.load(folder)
  assert ours.config.tie_word_embeddings == (name == 'mha_tied')
  sequences = np.random.default_rng(0).integers(0, 128, (2, 24))
  with torch.no_grad():
    expected = theirs(torch.tensor(sequences)).logits.numpy()
  full, cached = _logits(ours, sequences.astype(np.int32))
  _assert_close_to(full, expected, 'full sequence')
  _assert_close_to(cached, expected[:, 9:], 'cached')


@jax.jit
def _logits(model: LlamaModel, sequences: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Logits of the whole sequences, and cached ones from position 9 on.

  Cached: a prefill of 10 prompt tokens, then loop positions 0..14 in chunks
  of 1, 5 and 9 (loop position i is sequence position 9 + i).
  """
  full = model.network.apply({'params': model.params}, sequences)
  step_fn, cache = model.start(protocol.Batch(sequences[:, :10], reads=model.reads), 16)
  chunks = []
  for start, size in ((9, 1), (10, 5), (15, 9)):
    logits, cache = step_fn(sequences[:, start:start + size], cache)
    chunks.append(logits)
  return full, jnp.concatenate(chunks, axis=1)


def _their_greedy(model, prompt: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    out = model.generate(torch.tensor(prompt[None]), attention_mask=torch.ones(1, len(prompt)),
                         do_sample=False, max_new_tokens=MAX_DECODE_LEN, eos_token_id=EOS,
                         pad_token_id=0)
  return out[0, len(prompt):].numpy()


def _assert_rows_match_transformers(out, theirs):
  for b, length in enumerate(LENGTHS):
    expected = _their_greedy(theirs, PROMPTS[b, :length])
    tokens = np.asarray(out.tokens[b])
    assert int(out.lengths[b]) == len(expected), (b, tokens, expected)
    np.testing.assert_array_equal(tokens[:len(expected)], expected, err_msg=f'row {b}')
    assert not tokens[len(expected):].any()


@pytest.mark.parametrize('name', ['gqa', 'mha_tied'])
def test_greedy_ragged_batch_equals_transformers_generate_per_row(checkpoints, name):
  folder, theirs = checkpoints[name]
  out = generate(LlamaModel.load(folder), PROMPTS, jax.random.key(0), lengths=LENGTHS,
                 max_decode_len=MAX_DECODE_LEN)
  _assert_rows_match_transformers(out, theirs)


def test_speculative_greedy_with_another_draft_equals_the_baseline(checkpoints):
  target, draft = (LlamaModel.load(checkpoints[name][0]) for name in ('gqa', 'draft'))
  assert draft.config.num_hidden_layers == 1 and draft.config.vocab_size == 128
  out = speculative_generate(target, draft, PROMPTS, jax.random.key(0), lengths=LENGTHS,
                             gamma=3, max_decode_len=MAX_DECODE_LEN)
  _assert_rows_match_transformers(out, checkpoints['gqa'][1])
  baseline = generate(target, PROMPTS, jax.random.key(0), lengths=LENGTHS,
                      max_decode_len=MAX_DECODE_LEN)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)


def test_configs_transformers_writes_for_other_models_are_refused(checkpoints, tmp_path):
  scaled = transformers.LlamaConfig(**dict(MODELS['draft'], rope_parameters={
      'rope_type': 'llama3', 'rope_theta': 500000.0, 'factor': 8.0, 'low_freq_factor': 1.0,
      'high_freq_factor': 4.0, 'original_max_position_embeddings': 64}))
  scaled.save_pretrained(tmp_path / 'scaled')
  with pytest.raises(ValueError, match='rope_parameters=.*llama3.*no rope scaling'):
    LlamaConfig.from_hf(str(tmp_path / 'scaled'))
  transformers.MistralConfig(hidden_size=64, num_attention_heads=4).save_pretrained(
      tmp_path / 'mistral')
  with pytest.raises(ValueError, match="model_type is 'mistral', not a Llama model"):
    LlamaConfig.from_hf(str(tmp_path / 'mistral'))
  # The draft's folder with the GQA model's config: every array is of the wrong model.
  folder = checkpoints['draft'][0]
  with open(os.path.join(checkpoints['gqa'][0], 'config.json')) as f:
    gqa_config = json.load(f)
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump(gqa_config, f)
  os.symlink(os.path.join(folder, 'model.safetensors'), tmp_path / 'model.safetensors')
  with pytest.raises(ValueError, match=r'missing array model\.layers\.2\.mlp\.up_proj\.weight'):
    LlamaModel.load(str(tmp_path))
