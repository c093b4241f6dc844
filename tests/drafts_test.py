"""Tests for spec_decode.models.drafts: draft providers in the speculative loop."""

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.models import alpha as alpha_lib
from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode.models import drafts
from spec_decode import models
from spec_decode import sampling
from spec_decode.t5 import t5_1_1
from tests import stubs
from tests import tolerances
from tests.decoding_test import FALSE_POSITIVE_RATE, _outcome_counts, _sequence_distribution

EOS = 1


def _make_draft(kind: str, vocab: int, seed: int = 0):
  """A draft provider of each kind, tables with random (not estimated) q."""
  rng = np.random.default_rng(seed)
  if kind == 'unigram':
    return drafts.TableDraft(jnp.asarray(jax.nn.log_softmax(rng.standard_normal(vocab))))
  if kind == 'bigram':
    return drafts.TableDraft.dense(jax.nn.log_softmax(rng.standard_normal((vocab, vocab))))
  if kind == 'prompt_lookup':
    return drafts.PromptLookupDraft(vocab, max_ngram=3)
  if kind == 'pruned_head':  # a random T5 draft scoring every other token (q = 0 for the rest)
    model = models.T5Model.random(t5_1_1('nano', vocab_size=vocab), jax.random.key(seed))
    return models.PrunedHeadDraft.create(model, np.arange(0, vocab, 2))
  return drafts.UniformDraft(vocab)


KINDS = ('unigram', 'bigram', 'prompt_lookup', 'uniform')


def _encoder_inputs(rows: int, vocab: int, length: int, seed: int) -> np.ndarray:
  """Random left-aligned inputs ending in EOS, of random lengths 1..length."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, vocab, (rows, length)).astype(np.int32)
  ends = rng.integers(0, length, rows)
  tokens[np.arange(rows), ends] = EOS
  tokens[np.arange(length)[None, :] > ends[:, None]] = 0
  return tokens


@functools.partial(jax.jit, static_argnames=('target', 'gamma', 'max_len'),
                   compiler_options=stubs.OPTIMIZED)
def _speculate(target, draft, encoder_inputs, rng, params=None, prompt=None, *, gamma, max_len):
  """The compiled loop with a stub target (static) and a draft provider."""
  capacity = decoding.cache_length(max_len, gamma)
  draft_step_fn, draft_cache = draft.start(models.Batch(encoder_inputs), capacity)
  return decoding.speculative_decode(
      target.step_fn, target.init_cache(encoder_inputs.shape[0], capacity), draft_step_fn,
      draft_cache, gamma=gamma, max_decode_len=max_len, rng=rng, sampling=params, prompt=prompt)


@flax.struct.dataclass
class CopyModel:
  """A target that copies its input: output token t + 1 is input token t.

  logits are 0 at the input token and -inf elsewhere (after the input: pad),
  so p is a one-hot at any temperature. It has the draft-provider interface.
  """

  vocab_size: int = flax.struct.field(pytree_node=False)

  def start(self, batch, capacity):
    source = jnp.pad(batch.tokens, ((0, 0), (0, capacity)))

    def step_fn(tokens, cache):
      positions = cache.index[:, None] + jnp.arange(tokens.shape[1])  # [B, K]
      copied = jnp.take_along_axis(source, positions, axis=1)
      logits = jnp.where(jnp.arange(self.vocab_size) == copied[..., None], 0.0, -jnp.inf)
      return logits, cache.replace(index=cache.index + tokens.shape[1])

    cache = cache_lib.Cache(index=jnp.zeros((batch.size,), jnp.int32),
                            layers=None, capacity=capacity)
    return step_fn, cache


def _proposals(draft, encoder_inputs, sequences):
  """The prompt-lookup proposal after BOS + each sequence (None: no match, q uniform)."""
  length = max(map(len, sequences)) + 1
  decoder_inputs = [[0, *seq] + [0] * (length - 1 - len(seq)) for seq in sequences]
  step_fn, cache = draft.start(models.Batch(jnp.asarray([encoder_inputs] * len(sequences), jnp.int32)), length)
  logits = np.asarray(step_fn(jnp.asarray(decoder_inputs, jnp.int32), cache)[0])
  proposals = []
  for row, seq in zip(logits, sequences):  # a chunk's later tokens do not change earlier logits
    q = row[len(seq)]
    if np.all(q == 0):
      proposals.append(None)
    else:
      assert np.sum(q == 0) == 1 and np.all(np.isneginf(q[q != 0]))
      proposals.append(int(np.argmax(q)))
  return proposals


def test_table_draft_estimates_smoothed_frequencies():
  stream = np.array([5, 6, 1, 5, 7, 1])  # two sequences: 5 6 EOS, 5 7 EOS
  k = 0.5
  unigram = drafts.TableDraft.estimate(stream, 8, order=1, add_k=k)
  bigram = drafts.TableDraft.estimate(stream, 8, order=2, add_k=k)
  q1 = np.exp(np.asarray(unigram.log_probs))
  q2 = np.exp(np.asarray(bigram.logits(jnp.arange(8)[None])[0]))  # row t: q(. | t)
  assert q1.shape == (8,) and q2.shape == (8, 8)
  np.testing.assert_allclose(q1.sum(), 1.0, rtol=1e-6)
  np.testing.assert_allclose(q2.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(q1[5], (2 + k) / (6 + 8 * k), rtol=1e-6)
  np.testing.assert_allclose(q2[0, 5], (2 + k) / (2 + 8 * k), rtol=1e-6)  # BOS -> 5, twice
  np.testing.assert_allclose(q2[5, 6], (1 + k) / (2 + 8 * k), rtol=1e-6)
  np.testing.assert_allclose(q2[3], 1 / 8, rtol=1e-6)  # an unseen context is uniform
  with pytest.raises(ValueError, match='order'):
    drafts.TableDraft.estimate(stream, 8, order=3)


def test_prompt_lookup_proposes_the_continuation_of_the_longest_recent_match():
  source = [9, 3, 7, 2, 3, 5, 1, 0, 0]
  cases = [
      ([], 9),  # BOS lines up with the input's start
      ([9], 3),
      ([4, 3], 5),  # 1-gram: the latest match wins
      ([9, 3], 7),  # a 2-gram beats the later 1-gram
      ([8, 2, 3], 5),
      ([5], 1),  # the input's EOS is proposed ...
      ([1], None),  # ... its padding never is
      ([11], None),  # no match: uniform
      ([11, 12, 11], 12),  # a match in the output so far
      ([3, 12, 3], 12),  # the output wins ties with the input
  ]
  draft = drafts.PromptLookupDraft(20, max_ngram=3)
  assert _proposals(draft, source, [seq for seq, _ in cases]) == [want for _, want in cases]
  assert _proposals(drafts.PromptLookupDraft(20, max_ngram=1), source, [[9, 3]]) == [5]
  # From 2-grams on: the 1-gram matches above count no more, the 2-gram still does.
  assert _proposals(drafts.PromptLookupDraft(20, max_ngram=3, min_ngram=2), source,
                    [[4, 3], [9, 3], [11, 12, 11]]) == [None, 7, None]
  with pytest.raises(ValueError, match='max_ngram'):
    drafts.PromptLookupDraft(20, max_ngram=0)
  with pytest.raises(ValueError, match='min_ngram'):
    drafts.PromptLookupDraft(20, max_ngram=2, min_ngram=3)


@pytest.mark.parametrize('kind', KINDS)
def test_k_token_call_equals_k_single_calls(kind):
  """Also over stale history: the cache is rewound per row before the calls."""
  vocab, batch, k = 12, 3, 4
  draft = _make_draft(kind, vocab)
  rng = np.random.default_rng(1)
  step_fn, cache = draft.start(models.Batch(jnp.asarray(_encoder_inputs(batch, vocab, 6, seed=2))), 16)
  history = jnp.asarray(rng.integers(2, vocab, (batch, 9)), jnp.int32).at[:, 0].set(0)
  _, cache = step_fn(history, cache)
  cache = cache_lib.rewind(cache, jnp.array([2, 5, 0]))
  tokens = jnp.asarray(rng.integers(1, vocab, (batch, k)), jnp.int32)
  chunk_logits, chunk_cache = jax.jit(step_fn)(tokens, cache)
  assert chunk_logits.shape == (batch, k, vocab) and chunk_logits.dtype == jnp.float32
  singles = []
  for i in range(k):
    logits, cache = jax.jit(step_fn)(tokens[:, i:i + 1], cache)
    singles.append(logits)
  np.testing.assert_array_equal(chunk_logits, jnp.concatenate(singles, axis=1))
  np.testing.assert_array_equal(chunk_cache.index, [6, 9, 4])
  jax.tree.map(np.testing.assert_array_equal, chunk_cache, cache)
  assert draft.vocab_size == vocab


@pytest.mark.parametrize('kind, knobs', [
    ('uniform', dict(temperature=1.0)),
    ('prompt_lookup', dict(temperature=1.0)),
    ('prompt_lookup', dict(temperature=0.9, top_k=4, top_p=0.9)),
    ('pruned_head', dict(temperature=0.9, top_k=4, top_p=0.9)),  # k > N: PRUNED_LOGIT ties
])
def test_sequence_distribution_is_the_targets(kind, knobs):
  """Joint law of the first three tokens == p's, by chi-square."""
  vocab, max_len, rows, gamma = 6, 3, 60_000, 3
  target = stubs.TableModel.random(0, vocab, banned=0.15)
  params = sampling.SamplingParams.create(**knobs)
  dist = _sequence_distribution(target, params, max_len)
  out = _speculate(target, _make_draft(kind, vocab),
                   jnp.asarray(_encoder_inputs(rows, vocab, 4, seed=3)), jax.random.key(11),
                   params, gamma=gamma, max_len=max_len)
  counts = _outcome_counts(out, dist)
  probs = np.append(np.array(list(dist.values())), 0.0)
  assert stubs.chi_square_pvalue(counts, probs) > FALSE_POSITIVE_RATE
  hist = np.asarray(out.accept_histogram)  # both the residual and the bonus path ran
  assert hist[0] > 0 and hist[gamma] > 0


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_prompt_lookup_accepts_a_verbatim_copy(temperature):
  vocab, rows, length, gamma = 64, 8, 24, 4
  rng = np.random.default_rng(4)
  inputs = np.concatenate([rng.integers(2, vocab, (rows, length - 1)),
                           np.full((rows, 1), EOS)], axis=1).astype(np.int32)
  capacity = decoding.cache_length(length, gamma)

  @jax.jit
  def run(inputs, params):
    target_step_fn, target_cache = CopyModel(vocab).start(models.Batch(inputs), capacity)
    draft_step_fn, draft_cache = drafts.PromptLookupDraft(vocab).start(models.Batch(inputs), capacity)
    return decoding.speculative_decode(target_step_fn, target_cache, draft_step_fn, draft_cache,
                                       gamma=gamma, max_decode_len=length, rng=jax.random.key(0),
                                       sampling=params)

  out = run(jnp.asarray(inputs), sampling.SamplingParams.create(temperature))
  np.testing.assert_array_equal(out.tokens, inputs)
  hist = np.asarray(out.accept_histogram)
  tested = np.sum(hist * np.minimum(np.arange(gamma + 1) + 1, gamma))
  alpha = np.sum(hist * np.arange(gamma + 1)) / tested
  assert alpha > 0.9, hist
  assert float(out.tokens_per_target_call) > 0.8 * (gamma + 1)


@pytest.mark.parametrize('kind', ['prompt_lookup', 'uniform'])
def test_batch_rows_equal_their_batch_1_runs(kind):
  vocab, batch, max_len, gamma = 7, 5, 12, 3
  target = stubs.TableModel.random(4, vocab, banned=0.1)
  draft = _make_draft(kind, vocab)
  params = sampling.SamplingParams.create(temperature=1.0)
  keys = jax.random.split(jax.random.key(3), batch)
  inputs = jnp.asarray(_encoder_inputs(batch, vocab, 6, seed=5))
  prompt = jnp.array([[2, 0], [0, 0], [3, 4], [5, 0], [0, 0]])
  full = _speculate(target, draft, inputs, keys, params, prompt, gamma=gamma, max_len=max_len)
  for b in range(batch):
    one = _speculate(target, draft, inputs[b:b + 1], keys[b:b + 1], params, prompt[b:b + 1],
                     gamma=gamma, max_len=max_len)
    np.testing.assert_array_equal(one.tokens[0], full.tokens[b])
    np.testing.assert_array_equal(one.target_calls[0], full.target_calls[b])
    np.testing.assert_array_equal(one.draft_calls[0], full.draft_calls[b])


@pytest.fixture(scope='module')
def tiny_target():
  return models.T5Model.random(t5_1_1('tiny', vocab_size=64), jax.random.key(0))


def test_drafts_plug_into_speculative_generate(tiny_target):
  """Greedy speculation with any provider equals the greedy baseline."""
  inputs = _encoder_inputs(3, 64, 10, seed=6)
  baseline = models.generate(tiny_target, inputs, jax.random.key(0), max_decode_len=16)
  stream = np.asarray(baseline.tokens).ravel()
  table = drafts.TableDraft.estimate(stream[stream > 0], 64, order=2)
  for draft in (table, drafts.PromptLookupDraft(64), drafts.UniformDraft(64)):
    out = models.speculative_generate(tiny_target, draft, inputs, jax.random.key(1), gamma=3,
                                      max_decode_len=16)
    np.testing.assert_array_equal(out.tokens, baseline.tokens)
    if draft is table:  # estimated from these very outputs: some drafts are accepted
      assert np.asarray(out.accept_histogram)[1:].sum() > 0
  with pytest.raises(ValueError, match='vocab_size 63 != target vocab_size 64'):
    models.speculative_generate(tiny_target, drafts.UniformDraft(63), inputs, jax.random.key(1),
                                gamma=3, max_decode_len=16)


def test_most_frequent_ids():
  stream = np.array([5, 5, 5, 7, 7, 9, 63, 2])
  np.testing.assert_array_equal(drafts.most_frequent_ids(stream, 64, 5), [0, 1, 2, 5, 7])
  np.testing.assert_array_equal(drafts.most_frequent_ids(stream, 64, 3, always=(1,)), [1, 5, 7])
  for size in (1, 65):
    with pytest.raises(ValueError, match='size must lie in 2..64'):
      drafts.most_frequent_ids(stream, 64, size)
  with pytest.raises(ValueError, match=r'outside \[0, 8\)'):
    drafts.most_frequent_ids(stream, 8, 4)
  with pytest.raises(ValueError, match='always holds ids outside'):
    drafts.most_frequent_ids(stream, 64, 4, always=(-1,))


def test_pruned_head_scores_its_ids_as_the_full_head_and_equals_greedy(tiny_target):
  ids = np.array([9, 1, 0, 30, 31, 2])
  draft = models.PrunedHeadDraft.create(tiny_target, ids)
  inputs = jnp.asarray(_encoder_inputs(2, 64, 6, seed=8))
  decoder_inputs = jnp.asarray([[0, 3, 9, 30], [0, 2, 2, 1]], jnp.int32)
  full = np.asarray(alpha_lib.teacher_forced_logits(tiny_target, models.Batch(inputs), decoder_inputs))
  pruned = np.asarray(alpha_lib.teacher_forced_logits(draft, models.Batch(inputs), decoder_inputs))
  kept = np.isin(np.arange(64), ids)
  tolerances.assert_close(pruned[..., kept], full[..., kept], ulps=64)
  assert np.all(pruned[..., ~kept] == models.PRUNED_LOGIT)
  baseline = models.generate(tiny_target, inputs, jax.random.key(0), max_decode_len=12)
  out = models.speculative_generate(tiny_target, draft, inputs, jax.random.key(1), gamma=3,
                                    max_decode_len=12)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  for bad in ([], [[1, 2]], [1, 1], [0, 64], [-1, 3], [0.0, 1.0]):
    with pytest.raises(ValueError, match='distinct token ids in'):
      models.PrunedHeadDraft.create(tiny_target, bad)


def test_teacher_forced_logits_of_a_provider_are_its_steps():
  draft = drafts.PromptLookupDraft(12)
  inputs = jnp.asarray(_encoder_inputs(2, 12, 5, seed=7))
  decoder_inputs = jnp.asarray([[0, 3, 4, 3, 5], [0, 2, 2, 2, 1]], jnp.int32)
  step_fn, cache = draft.start(models.Batch(inputs), 8)
  step_fn = jax.jit(step_fn)
  steps = []
  for i in range(5):
    logits, cache = step_fn(decoder_inputs[:, i:i + 1], cache)
    steps.append(logits)
  np.testing.assert_array_equal(alpha_lib.teacher_forced_logits(draft, models.Batch(inputs), decoder_inputs),
                                jnp.concatenate(steps, axis=1))
