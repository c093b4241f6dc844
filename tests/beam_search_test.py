"""Tests for spec_decode.beam_search and spec_decode.speculative_beam."""

import functools
import itertools

import jax
import numpy as np
import pytest

from spec_decode import beam_search
from spec_decode import speculative_beam
from tests import stubs
from tests import tolerances

EOS = 1
NEG_INF = np.float32(-1e7)


@functools.partial(jax.jit, static_argnames=('batch', 'beam_size', 'max_len', 'draft_width',
                                             'gamma'))
def _run(target_table, draft_table, alpha, *, batch, beam_size, max_len, draft_width=1, gamma=0):
  """Plain beam search (draft_table None) or the speculative one over PrefixModels."""
  target = stubs.PrefixModel(target_table)
  capacity = beam_search.loop_utils.cache_length(max_len, gamma)
  if draft_table is None:
    return beam_search.beam_search(target.step_fn, target.init_cache(batch, capacity),
                                   beam_size=beam_size, max_decode_len=max_len, alpha=alpha)
  draft = stubs.PrefixModel(draft_table)
  return speculative_beam.speculative_beam_search(
      target.step_fn, target.init_cache(batch, capacity), draft.step_fn,
      draft.init_cache(batch, capacity), beam_size=beam_size, draft_width=draft_width,
      gamma=gamma, max_decode_len=max_len, alpha=alpha)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
  logits = logits.astype(np.float32)
  shifted = logits - logits.max()
  return shifted - np.log(np.sum(np.exp(shifted), dtype=np.float32))


def _top(values, count):
  """Indices of the `count` largest values, ties to the lower index (lax.top_k)."""
  return sorted(range(len(values)), key=lambda i: (-values[i], i))[:count]


def _reference(model, *, batch, beam_size, max_len, alpha):
  """T5X's beam search written out candidate by candidate (numpy, float32).

  The stub's rows decode differently; the loop condition is T5X's, over the
  whole batch. Returns ([B, W, max_len] tokens, [B, W] scores) ascending, and
  the steps taken.
  """
  w = beam_size
  live = [[(np.float32(0.0), ())] + [(NEG_INF, ())] * (w - 1) for _ in range(batch)]
  finished = [[(NEG_INF, (), False)] * w for _ in range(batch)]  # (score, tokens, flag)
  penalty = lambda length: np.float32(((5.0 + length) / 6.0) ** np.float32(alpha))
  steps = 0
  while steps < max_len:
    best_live = [row[-1][0] / penalty(max_len + 1) for row in live]
    worst = [min(s for s, _, _ in row) for row in finished]
    if all(f and worst[b] > best_live[b] for b in range(batch) for _, _, f in finished[b]):
      break
    if steps > 0 and all(x < np.float32(-1e7) / penalty(max_len + 1) for x in best_live):
      break
    for b in range(batch):
      cands = []  # (log P, tokens), in flat order beam * V + token
      for lp, seq in live[b]:
        log_probs = _log_softmax(model.next_logits(seq, row=b)) + lp
        cands += [(log_probs[v], seq + (v,)) for v in range(model.vocab)]
      top = [cands[i] for i in _top([c[0] for c in cands], 2 * w)]
      masked = [lp + (NEG_INF if seq[-1] == EOS else np.float32(0)) for lp, seq in top]
      live[b] = [(masked[i], top[i][1]) for i in _top(masked, w)][::-1]
      new = [(lp / penalty(steps + 1) + (np.float32(0) if seq[-1] == EOS else NEG_INF), seq,
              seq[-1] == EOS) for lp, seq in top]
      pool = finished[b] + new
      finished[b] = [pool[i] for i in _top([s for s, _, _ in pool], w)][::-1]
    steps += 1
  tokens = np.zeros((batch, w, max_len), np.int32)
  scores = np.zeros((batch, w), np.float32)
  for b in range(batch):
    beams = finished[b] if any(f for _, _, f in finished[b]) else [
        (lp, s, True) for lp, s in live[b]]
    for i, (score, seq, _) in enumerate(beams):
      tokens[b, i, :len(seq)] = seq
      scores[b, i] = score
  return tokens, scores, steps


@pytest.mark.parametrize('seed,vocab,beam_size,max_len,alpha,eos_bias', [
    (0, 6, 3, 7, 0.6, 0.0),   # EOS rare: rows run to max_len, live beams returned
    (1, 5, 4, 8, 0.6, 1.5),   # many EOS: early termination
    (2, 7, 2, 6, 0.0, 1.0),   # no brevity penalty
    (3, 4, 5, 9, 1.5, 2.5),   # more beams than half the vocabulary: NEG_INF fillers
    (4, 6, 1, 7, 0.6, 0.5),   # one beam
])
def test_beam_search_equals_candidate_by_candidate_reference(seed, vocab, beam_size, max_len,
                                                             alpha, eos_bias):
  model = stubs.PrefixModel.random(seed, vocab, eos_bias=eos_bias)
  out = _run(model.table, None, alpha, batch=2, beam_size=beam_size, max_len=max_len)
  tokens, scores, steps = _reference(model, batch=2, beam_size=beam_size, max_len=max_len,
                                     alpha=alpha)
  np.testing.assert_array_equal(out.tokens, tokens)
  tolerances.assert_close(out.scores, scores, ulps=32)
  assert int(out.target_calls) == int(out.steps) == steps
  assert not np.array_equal(tokens[0], tokens[1])  # the rows decode differently


def test_wide_beam_finds_the_best_sequences_exhaustively():
  """A beam wider than all sequences keeps every prefix: the exact top scores."""
  vocab, max_len, alpha = 3, 3, 0.6
  model = stubs.PrefixModel.random(7, vocab, eos_bias=0.5)
  found = []
  for length in range(1, max_len + 1):
    for seq in itertools.product([t for t in range(vocab) if t != EOS], repeat=length - 1):
      seq += (EOS,)
      lp = sum(_log_softmax(model.next_logits(seq[:i]))[seq[i]] for i in range(length))
      found.append((lp / ((5.0 + length) / 6.0) ** alpha, seq))
  found.sort(reverse=True)
  out = _run(model.table, None, alpha, batch=1, beam_size=27, max_len=max_len)
  flags = np.asarray(out.scores[0]) > -1e6
  assert flags.sum() == len(found)  # 1 + 2 + 4 sequences end in EOS within 3 tokens
  for (score, seq), tokens, got in zip(found, out.tokens[0][flags][::-1],
                                       out.scores[0][flags][::-1]):
    assert tuple(tokens[:len(seq)]) == seq and not tokens[len(seq):].any()
    np.testing.assert_allclose(got, score, rtol=1e-5)


def _draft_table(kind: str, target: stubs.PrefixModel, seed: int) -> np.ndarray:
  table = np.asarray(target.table)
  if kind == 'right':
    return table
  if kind == 'noisy':
    return table + 0.7 * np.random.default_rng(seed).standard_normal(table.shape)
  if kind == 'random':
    return 2.0 * np.random.default_rng(seed + 1).standard_normal(table.shape)
  wrong = np.zeros_like(table)  # 'wrong': its top tokens are the last ones, in order,
  wrong[:, -4:] = [10.0, 20.0, 30.0, 40.0]  # which the target never ranks in its top 2W
  return wrong


@pytest.mark.parametrize('kind,seed,batch,beam_size,draft_width,gamma,alpha,eos_bias', [
    ('right', 0, 2, 4, 4, 3, 0.6, 0.0),
    ('right', 1, 1, 3, 2, 2, 0.6, 1.5),
    ('noisy', 2, 3, 4, 2, 3, 0.6, 0.5),
    ('noisy', 3, 2, 2, 3, 4, 1.2, 2.0),
    ('random', 4, 2, 4, 1, 2, 0.0, 1.0),
    ('wrong', 5, 2, 4, 2, 3, 0.6, 0.5),
])
def test_speculative_beam_search_equals_beam_search(kind, seed, batch, beam_size, draft_width,
                                                    gamma, alpha, eos_bias):
  vocab, max_len = 24, 12
  target = stubs.PrefixModel.random(seed, vocab, eos_bias=eos_bias)
  if kind == 'wrong':  # The target's last 4 tokens trail every other: never candidates.
    table = np.array(target.table)
    table[:, -4:] -= 100.0
    target = stubs.PrefixModel(table)
  plain = _run(target.table, None, alpha, batch=batch, beam_size=beam_size, max_len=max_len)
  spec = _run(target.table, _draft_table(kind, target, seed), alpha, batch=batch,
              beam_size=beam_size, max_len=max_len, draft_width=draft_width, gamma=gamma)
  np.testing.assert_array_equal(spec.tokens, plain.tokens)
  tolerances.assert_close(spec.scores, plain.scores, ulps=32)
  assert int(spec.steps) == int(plain.steps)
  calls, steps = int(spec.target_calls), int(spec.steps)
  if kind == 'wrong':
    assert calls == steps  # one step per target call: nothing drafted is ever kept
  elif kind == 'right':
    assert calls < steps
  assert int(spec.draft_calls) >= gamma * calls


def test_beam_search_rejects_bad_arguments():
  model = stubs.PrefixModel.random(0, 5)
  with pytest.raises(ValueError, match='beam_size'):
    beam_search.beam_search(model.step_fn, model.init_cache(1, 9), beam_size=0, max_decode_len=8)
  with pytest.raises(ValueError, match='cache holds 8 positions'):
    beam_search.beam_search(model.step_fn, model.init_cache(1, 8), beam_size=2, max_decode_len=8)
  with pytest.raises(ValueError, match='needs 12'):
    speculative_beam.speculative_beam_search(
        model.step_fn, model.init_cache(1, 9), model.step_fn, model.init_cache(1, 12),
        beam_size=2, draft_width=2, gamma=3, max_decode_len=8)
  with pytest.raises(ValueError, match='draft_width'):
    speculative_beam.speculative_beam_search(
        model.step_fn, model.init_cache(1, 12), model.step_fn, model.init_cache(1, 12),
        beam_size=2, draft_width=0, gamma=3, max_decode_len=8)
  with pytest.raises(ValueError, match='draft cache batch 2 != target cache batch 1'):
    speculative_beam.speculative_beam_search(
        model.step_fn, model.init_cache(1, 12), model.step_fn, model.init_cache(2, 12),
        beam_size=2, draft_width=2, gamma=3, max_decode_len=8)


def test_a_draft_equal_to_the_target_covers_gamma_plus_one_steps_per_call():
  """One beam, no EOS: beam search is greedy and a perfect draft's paths are
  the target's, so each call covers gamma + 1 steps, which needs the draft's
  cache caught up after a full sweep and reordered with the beams."""
  target = stubs.PrefixModel.random(8, 24, eos_bias=-50.0)
  out = _run(target.table, target.table, 0.6, batch=2, beam_size=1, max_len=12, draft_width=1,
             gamma=3)
  assert int(out.steps) == 12 and int(out.target_calls) == 3 and int(out.draft_calls) == 12


def test_t5_speculative_beam_search_equals_beam_search():
  """Random tiny T5 models through models.beam_generate, batch 3, padded inputs."""
  from spec_decode import models  # pylint: disable=import-outside-toplevel
  from spec_decode.t5 import t5_1_1  # pylint: disable=import-outside-toplevel
  vocab = 64
  target = models.T5Model.random(t5_1_1('tiny', vocab_size=vocab), jax.random.key(0))
  draft = models.T5Model.random(t5_1_1('nano', vocab_size=vocab), jax.random.key(1))
  inputs = np.random.default_rng(0).integers(2, vocab, (3, 10)).astype(np.int32)
  inputs[1, 6:] = 0
  plain = models.beam_generate(target, inputs, beam_size=3, max_decode_len=12)
  for d in (draft, target):
    spec = models.beam_generate(target, inputs, beam_size=3, max_decode_len=12, draft=d,
                                draft_width=3, gamma=1)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    tolerances.assert_close(spec.scores, plain.scores, ulps=32)
  assert int(spec.target_calls) < int(plain.steps)  # the target as its own draft
  np.testing.assert_array_equal(plain.best, plain.tokens[:, -1])
  with pytest.raises(ValueError, match='draft vocab_size 32 != target vocab_size 64'):
    models.beam_generate(target, inputs, beam_size=3, max_decode_len=12, draft=models.T5Model(
        t5_1_1('nano', vocab_size=32), None))
