"""A draft that copies repeated n-grams and asks its model elsewhere (models.copying): exact."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import sampling
from spec_decode.models import alpha as alpha_lib
from spec_decode.models import drafts
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.models.copying import CopyingDraft
from spec_decode.models.pruned_head import PrunedHeadDraft
from spec_decode.options import LoopOptions
from tests import stubs
from tests.feature_draft_test import LENGTHS, PROMPTS, TARGET, TINY, _draft, _sample

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4


def _model_drafts(target):
  """A draft of each kind a CopyingDraft wraps: a second model, a pruned head, a feature draft."""
  second = stubs.llama_model(TARGET, 5)
  return {'model': second, 'pruned_head': PrunedHeadDraft.create(second, np.arange(0, 8, 2)),
          'features': _draft(target, 1, ids=np.arange(1, 8, 2), scale=5.0)}


@pytest.mark.parametrize('kind', ['model', 'pruned_head', 'features'])
@pytest.mark.parametrize('gamma, threshold, verify_lengths', [
    (3, None, None), (3, 0.3, None), (4, None, (2, 3))])
def test_greedy_output_is_the_targets(kind, gamma, threshold, verify_lengths):
  target = stubs.llama_model(TARGET, 0)
  draft = CopyingDraft.create(_model_drafts(target)[kind], min_ngram=2)
  base = front_ends.generate(target, PROMPTS, 0, lengths=LENGTHS, max_decode_len=24)
  spec = front_ends.speculative_generate(target, draft, PROMPTS, 0, lengths=LENGTHS,
                                         max_decode_len=24, gamma=gamma,
                                         confidence_threshold=threshold,
                                         verify_lengths=verify_lengths)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)


def _q_along(draft, target, tokens: np.ndarray) -> np.ndarray:
  """[L, V] the draft's logits after each of `tokens` (one row, prompt [tokens[0]])."""
  batch = protocol.Batch(jnp.asarray(tokens[None, :1]), jnp.array([1]), reads=target.reads)
  _, (step_fn, cache), _ = draft.start_pair(target, batch, len(tokens) + 1)
  return np.asarray(step_fn(jnp.asarray(tokens[None]), cache)[0][0])


def test_q_is_the_copy_where_an_ngram_repeats_and_the_models_elsewhere():
  target = stubs.llama_model(TARGET, 0)
  model = stubs.llama_model(TARGET, 5)
  tokens = np.array([3, 4, 5, 6, 3, 4, 7, 3, 4])
  copying = _q_along(CopyingDraft.create(model, min_ngram=2), target, tokens)
  batch = protocol.Batch(jnp.asarray(tokens[None, :1]), jnp.array([1]), reads=target.reads)
  step_fn, cache = model.start(batch, len(tokens) + 1)
  own = np.asarray(step_fn(jnp.asarray(tokens[None]), cache)[0][0])
  # After ...3 4 (positions 5 and 8) the bigram 3 4 occurred before: copy what followed it
  # last (5 after position 1, then 7 after position 5); one token alone (min_ngram 2) is no
  # match.
  copies = {5: 5, 8: 7}
  for t in range(len(tokens)):
    if t in copies:
      assert np.argmax(copying[t]) == copies[t] and np.isneginf(copying[t]).sum() == 7, t
    else:
      np.testing.assert_array_equal(copying[t], own[t])


def test_copies_are_accepted_where_the_target_repeats_itself():
  """A draft that is never right alone (uniform: token 0 at T = 0) is right by copying."""
  target = stubs.llama_model(TARGET, 3)
  prompts, lengths = PROMPTS[[0, 2]], LENGTHS[[0, 2]]
  alone = front_ends.speculative_generate(target, drafts.UniformDraft(8), prompts, 0,
                                          lengths=lengths, max_decode_len=40, gamma=3, eos_id=-1)
  copying = front_ends.speculative_generate(
      target, CopyingDraft.create(drafts.UniformDraft(8), min_ngram=2), prompts, 0,
      lengths=lengths, max_decode_len=40, gamma=3, eos_id=-1)
  np.testing.assert_array_equal(copying.tokens, alone.tokens)
  assert np.asarray(alone.accept_histogram)[1:].sum() == 0
  assert np.asarray(copying.accept_histogram)[1:].sum() > 0


@pytest.mark.parametrize('kind', ['model', 'features'])
def test_sampled_sequences_follow_the_target(kind):
  """Joint law of the first three tokens after two prompts == p's, by chi-square.

  The first prompt ends in a bigram it holds already (a copy first), the
  second does not (the model first). Two tests (one per prompt), each at
  FALSE_POSITIVE_RATE. Drafting the model's most likely token in place of
  a draw from its q fails them (checked by hand).
  """
  target = stubs.llama_model(TINY, 3, scale=3.0)
  model = (_draft(target, 4, scale=3.0) if kind == 'features'
           else stubs.llama_model(TINY, 4, scale=3.0))
  draft = CopyingDraft.create(model, min_ngram=2)
  prompts, lengths = np.array([[3, 1, 4, 3, 1], [5, 2, 5, 0, 0]]), np.array([5, 3])
  rows, gamma = 40_000, 2
  out = _sample(target, draft, np.repeat(prompts, rows, 0), np.repeat(lengths, rows),
                LoopOptions(3, gamma, eos_id=-1), jax.random.key(7))
  for pvalue in stubs.llama_first_three_pvalues(target, np.asarray(out.tokens), prompts, lengths):
    assert pvalue > FALSE_POSITIVE_RATE
  hist = np.asarray(out.accept_histogram)
  assert hist[0] > 0 and hist[gamma] > 0, hist  # both the residual and the bonus paths ran


def test_alpha_counts_the_copies():
  """alpha (Table 3's measure) of the copying draft is the copies' p where it copies."""
  target = stubs.llama_model(TARGET, 3)
  model = _model_drafts(target)['features']
  prompts, lengths = PROMPTS[[0, 2]], LENGTHS[[0, 2]]
  out = front_ends.generate(target, prompts, 0, lengths=lengths, max_decode_len=16, eos_id=-1)
  tokens, n = np.asarray(out.tokens), np.full(2, 16)
  greedy = sampling.SamplingParams.create(temperature=0.0)
  measure = functools.partial(alpha_lib.measure_alpha, target, inputs=prompts, tokens=tokens,
                              output_lengths=n, sampling=greedy, lengths=lengths)
  alone, copying = measure(model), measure(CopyingDraft.create(model, min_ngram=2))
  assert copying.alpha > alone.alpha  # the target repeats itself; this draft does not


def test_bad_settings_are_refused():
  model = stubs.llama_model(TARGET, 5)
  with pytest.raises(ValueError, match='min_ngram'):
    CopyingDraft.create(model, min_ngram=4, max_ngram=3)
  with pytest.raises(ValueError, match='min_ngram'):
    CopyingDraft.create(model, min_ngram=0)
  with pytest.raises(ValueError, match='copies already'):
    CopyingDraft.create(CopyingDraft.create(model))
