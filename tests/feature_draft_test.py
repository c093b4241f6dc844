"""A draft over its target's features (models.feature_draft): exact, fed the target's features, stored."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import sampling
from spec_decode.llama import LlamaConfig
from spec_decode.llama import draft as draft_lib
from spec_decode.llama.network import LlamaNetwork
from spec_decode.models import alpha as alpha_lib
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.models.feature_draft import FeatureDraft, FeatureDraftNetwork
from spec_decode.options import Knobs, LoopOptions
from spec_decode.training import feature_draft as training
from spec_decode.training import teacher
from tests import stubs

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4
TARGET = LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                     tie_word_embeddings=True, eos_token_ids=(2,))
TINY = LlamaConfig(vocab_size=6, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                   tie_word_embeddings=True)
PROMPTS = np.array([[5, 1, 7, 3, 4, 6, 1], [7, 0, 0, 0, 0, 0, 0], [3, 4, 5, 0, 0, 0, 0]])
LENGTHS = np.array([7, 1, 3])


def _own(config: LlamaConfig, seed: int, scale: float = 1.0) -> dict:
  """Random parameters of a one-layer draft over `config`'s target, times `scale`."""
  draft_config = draft_lib.draft_config(config, 1)
  params = FeatureDraftNetwork(draft_config).init(
      jax.random.key(seed), jnp.ones((1, 2), jnp.int32), jnp.ones((1, 2, config.hidden_size)))
  return {k: jax.tree.map(lambda x: x * scale, v) for k, v in params['params'].items()
          if k != 'embed_tokens'}


def _draft(target, seed: int, ids=None, scale: float = 1.0) -> FeatureDraft:
  ids = np.arange(target.vocab_size) if ids is None else ids
  return FeatureDraft.create(draft_lib.draft_config(target.config, 1),
                             _own(target.config, seed, scale), target, ids)


def _echo_draft(target) -> FeatureDraft:
  """f^_t = f_{t-1}: fc passes the feature half, the layer adds nothing, the norm is the target's.

  Its first call of an iteration at loop index i proposes the target's
  greedy token after position i - 1 (the token at i) exactly when it reads
  the target's feature there; its later calls repeat it.
  """
  own = jax.tree.map(jnp.zeros_like, _own(target.config, 0))
  width = target.config.hidden_size
  own['fc']['kernel'] = jnp.concatenate([jnp.zeros((width, width)), jnp.eye(width)])
  own['norm'] = target.params['norm']  # uniform: the target's features pass through unchanged
  own['feature_scale'] = jnp.ones((width,))
  own['layers_0']['input_layernorm'] = own['layers_0']['post_attention_layernorm'] = {
      'scale': jnp.ones((width,))}
  return FeatureDraft.create(draft_lib.draft_config(target.config, 1), own, target,
                             np.arange(target.vocab_size))


@pytest.mark.parametrize('gamma, threshold, verify_lengths', [
    (1, None, None), (3, None, None), (3, 0.3, None), (4, None, (2, 3))])
def test_greedy_output_is_the_targets(gamma, threshold, verify_lengths):
  target = stubs.llama_model(TARGET, 0)
  draft = _draft(target, 1, ids=np.arange(1, 8, 2), scale=5.0)
  base = front_ends.generate(target, PROMPTS, 0, lengths=LENGTHS, max_decode_len=24)
  spec = front_ends.speculative_generate(target, draft, PROMPTS, 0, lengths=LENGTHS,
                                         max_decode_len=24, gamma=gamma,
                                         confidence_threshold=threshold,
                                         verify_lengths=verify_lengths)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)


def test_the_draft_reads_the_targets_features_after_every_verify_call():
  """The echo draft's accepted counts are those its proposals (the target's tokens) give.

  A draft that read its own stale estimates (no feed) would propose older
  tokens; checked by hand with the feed removed from the loop.
  """
  target = stubs.llama_model(TARGET, 3)
  gamma, max_len = 3, 40
  prompts, lengths = PROMPTS[[0, 2]], LENGTHS[[0, 2]]
  spec = front_ends.speculative_generate(target, _echo_draft(target), prompts, 0,
                                         lengths=lengths, max_decode_len=max_len, gamma=gamma,
                                         eos_id=-1)
  longer = front_ends.generate(target, prompts, 0, lengths=lengths, eos_id=-1,
                               max_decode_len=max_len + gamma + 1)
  logits = target.network.apply({'params': target.params}, jnp.asarray(prompts))
  expected = np.zeros(gamma + 1, np.int64)
  for row, n in enumerate(lengths):
    tokens = np.concatenate([[prompts[row, n - 1]], np.asarray(longer.tokens[row])])
    index = 0
    while index < max_len:
      proposal = int(jnp.argmax(logits[row, n - 2])) if index == 0 else tokens[index]
      accepted = 0
      while accepted < gamma and tokens[index + accepted + 1] == proposal:
        accepted += 1
      expected[accepted] += 1
      index += accepted + 1
  assert expected[1:].sum() > 0, expected  # the target repeats itself: some drafts accepted
  np.testing.assert_array_equal(spec.accept_histogram, expected)


@functools.partial(jax.jit, static_argnums=(4,), compiler_options=stubs.OPTIMIZED)
def _sample(target, draft, prompts, lengths, options, rng):
  batch = protocol.Batch(prompts, lengths, reads=target.reads)
  return front_ends.decode(target, draft, batch, rng, options,
                           Knobs.create(sampling.SamplingParams.create(temperature=1.0)))


def test_sampled_sequences_follow_the_target():
  """Joint law of the first three tokens after two ragged prompts == p's, by chi-square.

  Two tests (one per prompt), each at FALSE_POSITIVE_RATE.
  """
  target = stubs.llama_model(TINY, 3, scale=3.0)
  draft = _draft(target, 4, scale=3.0)
  prompts, lengths = np.array([[3, 1, 4, 1], [5, 2, 0, 0]]), np.array([4, 2])
  rows, gamma = 40_000, 2
  out = _sample(target, draft, np.repeat(prompts, rows, 0), np.repeat(lengths, rows),
                LoopOptions(3, gamma, eos_id=-1), jax.random.key(7))
  for pvalue in stubs.llama_first_three_pvalues(target, np.asarray(out.tokens), prompts, lengths):
    assert pvalue > FALSE_POSITIVE_RATE
  hist = np.asarray(out.accept_histogram)
  assert hist[0] > 0 and hist[gamma] > 0, hist  # both the residual and the bonus paths ran


def test_the_folder_stores_its_own_weights_in_bfloat16_and_loads_as_a_feature_draft(tmp_path):
  target = stubs.llama_model(TARGET, 0)
  stubs.save_llama(target, tmp_path / 'target')
  hf_config = json.loads((tmp_path / 'target' / 'config.json').read_text())
  own = _own(TARGET, 5)
  draft_lib.save(tmp_path / 'draft', draft_lib.draft_config(TARGET, 1), own, np.arange(1, 8, 2),
                 hf_config)
  stored = json.loads((tmp_path / 'draft' / 'config.json').read_text())
  assert stored['spec_decode_draft']['reads'] == 'features'
  loaded = draft_lib.load(tmp_path / 'draft', target)
  assert isinstance(loaded, FeatureDraft)
  np.testing.assert_array_equal(loaded.ids, np.arange(1, 8, 2))
  rounded = jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16), np.float32), own)
  assert set(own) == {'fc', 'feature_scale', 'layers_0', 'norm'}
  jax.tree.map(np.testing.assert_array_equal, {k: loaded.params[k] for k in own}, rounded)


def test_a_feature_draft_is_refused_where_it_cannot_read_its_target():
  target = stubs.llama_model(TARGET, 0)
  draft = _draft(target, 1)
  with pytest.raises(ValueError, match='speculative_generate only'):
    front_ends.beam_generate(target, PROMPTS, lengths=LENGTHS, beam_size=2, max_decode_len=4,
                             draft=draft)
  untied = stubs.llama_model(LlamaConfig(**{**TARGET.__dict__, 'tie_word_embeddings': False}), 0)
  with pytest.raises(ValueError, match='tied output layer'):
    _draft(untied, 1)
  with pytest.raises(ValueError, match='hidden_size'):
    FeatureDraft.create(LlamaConfig(**{**TARGET.__dict__, 'hidden_size': 16}), {}, target,
                        np.arange(8))


def test_teacher_features_are_the_targets_and_training_raises_agreement(tmp_path):
  """Features kept while decoding equal a full pass over the rows and teacher forcing's; a
  short run learns, with teacher-forced rows that only train; rows without features are refused."""
  target = stubs.llama_model(TARGET, 0)
  folder = stubs.save_llama(target, tmp_path / 'target')
  target = target.with_panels()
  prompt, length = PROMPTS.repeat(6, 0), LENGTHS.repeat(6)
  chunk = teacher.generate_chunk(target, prompt, length, np.arange(18) % 2, jax.random.key(0),
                                 steps=12, top_k=4, eos_id=-1, features=True)
  seq = teacher.sequences(chunk.prompt, chunk.prompt_length, chunk.tokens)
  full = target.network.apply({'params': target.params}, seq, method=LlamaNetwork.features)[0]
  for row, n in enumerate(length):
    known = n + 12 - 1
    np.testing.assert_allclose(chunk.features[row, :known].astype(np.float32), full[row, :known],
                               rtol=2e-3, atol=2e-3 * float(np.abs(full).max()))
    assert not chunk.features[row, known:].any()
  scored = teacher.score_chunk(target, chunk.prompt, chunk.prompt_length, chunk.tokens,
                               chunk.length, top_k=4, features=True)
  np.testing.assert_allclose(scored.features.astype(np.float32),
                             chunk.features.astype(np.float32), rtol=2e-3,
                             atol=2e-3 * float(np.abs(full).max()))
  for name, part in (('data', chunk), ('text', scored), ('plain', scored._replace(features=None))):
    (tmp_path / name).mkdir()
    teacher.save_chunk(tmp_path / name / 'chunk_00000.npz', part)
  with pytest.raises(ValueError, match='plain holds no features'):
    training.train(folder, tmp_path / 'data', tmp_path / 'refused', num_layers=1, head_size=8,
                   steps=1, batch_rows=4, learning_rate=3e-3, val_rows=6, eval_every=1, seed=0,
                   extra_data=[str(tmp_path / 'plain')])
  record = training.train(folder, tmp_path / 'data', tmp_path / 'draft', num_layers=1,
                          head_size=8, steps=60, batch_rows=4, learning_rate=3e-3, val_rows=6,
                          eval_every=60, seed=0, extra_data=[str(tmp_path / 'text')])
  log = [json.loads(line) for line in open(tmp_path / 'draft' / 'log.jsonl')]
  assert record['alpha_t0'] > log[0]['alpha_t0'], log
  assert isinstance(draft_lib.load(tmp_path / 'draft', target), FeatureDraft)


def test_decoding_reads_what_training_reads():
  """The pair's teacher-forced logits (alpha's q) == the full-sequence network's over the target's features.

  Training runs the draft over whole rows with the target's features shifted
  by one (training.feature_draft); decoding prefills the prompt and steps
  behind it: both give the same q at every loop position.
  """
  target = stubs.llama_model(TARGET, 0)
  draft = _draft(target, 1, ids=np.arange(1, 8, 2), scale=5.0)
  loop_tokens = np.array([[0, 4, 6, 1, 1, 3]])
  for prompt, n in zip(PROMPTS, LENGTHS):
    batch = protocol.Batch(jnp.asarray(prompt[None, :n]), jnp.asarray([n]), reads=target.reads)
    _, q_logits = alpha_lib.pair_logits(target, draft, batch, jnp.asarray(loop_tokens))
    row = np.concatenate([prompt[:n], loop_tokens[0, 1:]])[None]
    features = target.network.apply({'params': target.params}, row,
                                    method=LlamaNetwork.features)[0]
    estimates = draft.network.apply({'params': draft.params}, row,
                                    jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :-1])
    expected = draft.logits(estimates)[0, n - 1:]
    scale = float(jnp.abs(expected[expected > -1e29]).max())
    np.testing.assert_allclose(q_logits[0], expected, rtol=1e-4, atol=1e-4 * scale)
