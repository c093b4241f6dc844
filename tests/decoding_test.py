"""Tests for spec_decode.decoding: the baseline and speculative loops."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import decoding
from spec_decode import sampling
from tests import stubs

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4
EOS = 1


def _decode(target, draft, *, batch, max_len, gamma, rng, params=None, prompt=None, eos_id=EOS,
            lenience=1.0, verification='token', confidence_threshold=None, verify_lengths=None,
            draft_params=None):
  """Runs one loop over stub models; draft=None runs the baseline.

  The tables are traced arguments of one jitted function, so every call with
  the same shapes and static settings reuses one compiled loop.
  """
  return _run(target.table, None if draft is None else draft.table, rng, params, draft_params,
              prompt, lenience, confidence_threshold, batch=batch, max_len=max_len, gamma=gamma,
              eos_id=eos_id, verification=verification, verify_lengths=verify_lengths)


@functools.partial(jax.jit, static_argnames=('batch', 'max_len', 'gamma', 'eos_id',
                                             'verification', 'verify_lengths'),
                   compiler_options=stubs.OPTIMIZED)
def _run(target_table, draft_table, rng, params, draft_params, prompt, lenience,
         confidence_threshold, *, batch, max_len, gamma, eos_id, verification, verify_lengths):
  target = stubs.TableModel(target_table)
  capacity = decoding.cache_length(max_len, gamma)
  if draft_table is None:
    return decoding.autoregressive_decode(
        target.step_fn, target.init_cache(batch, capacity), max_decode_len=max_len, rng=rng,
        sampling=params, prompt=prompt, eos_id=eos_id)
  draft = stubs.TableModel(draft_table)
  return decoding.speculative_decode(
      target.step_fn, target.init_cache(batch, capacity), draft.step_fn,
      draft.init_cache(batch, capacity), gamma=gamma, max_decode_len=max_len, rng=rng,
      sampling=params, draft_sampling=draft_params, prompt=prompt, eos_id=eos_id,
      lenience=lenience, verification=verification, confidence_threshold=confidence_threshold,
      verify_lengths=verify_lengths)


_adjust = jax.jit(sampling.adjust)  # eager, its top-k/top-p bisection took seconds per call


def _sequence_distribution(model, params, max_len, eos_id=EOS):
  """{sequence: probability} of the target's own samples (exact enumeration)."""
  dist = {}

  def expand(prefix, prob):
    logits = jnp.asarray(model.next_logits(prefix))[None]
    probs = np.asarray(_adjust(logits, params))[0]
    for token in np.flatnonzero(probs):
      seq = prefix + (int(token),)
      if token == eos_id or len(seq) == max_len:
        dist[seq] = dist.get(seq, 0.0) + prob * probs[token]
      else:
        expand(seq, prob * probs[token])

  expand((), 1.0)
  return dist


def _outcome_counts(out, dist):
  """Histogram of decoded rows over the outcomes of `dist`."""
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  position = {seq: i for i, seq in enumerate(dist)}
  counts = np.zeros(len(dist) + 1, np.int64)  # last bin: impossible sequences
  for row, length in zip(tokens, lengths):
    counts[position.get(tuple(row[:length]), len(dist))] += 1
  return counts


@pytest.mark.parametrize('seed, gamma, verification', [
    *itertools.product(range(3), [1, 2, 5], ['token']), (0, 4, 'block'), (1, 2, 'block')])
def test_greedy_speculative_equals_greedy_baseline(seed, gamma, verification):
  vocab, batch, max_len = 11, 4, 17
  target = stubs.TableModel.random(seed, vocab)
  # A draft that agrees with the target most of the time, not always.
  draft = stubs.TableModel(np.asarray(target.table)
                           + 0.8 * np.random.default_rng(seed + 50).standard_normal(
                               target.table.shape))
  prompt = jnp.array([[5, 7, 0], [0, 0, 0], [3, 0, 0], [4, 4, 4]])
  base = _decode(target, None, batch=batch, max_len=max_len, gamma=0, rng=jax.random.key(0),
                 prompt=prompt)
  spec = _decode(target, draft, batch=batch, max_len=max_len, gamma=gamma,
                 rng=jax.random.key(1), prompt=prompt, verification=verification)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  np.testing.assert_array_equal(spec.lengths, base.lengths)
  np.testing.assert_array_equal(np.asarray(spec.tokens)[:, :3], np.where(
      np.arange(3) < np.array([[2], [0], [1], [3]]), prompt, np.asarray(spec.tokens)[:, :3]))
  assert int(jnp.sum(spec.accept_histogram)) == int(jnp.sum(spec.target_calls))
  assert int(jnp.sum(spec.target_calls)) <= int(jnp.sum(base.target_calls))


def test_draft_sampling_defaults_to_the_targets_and_is_used_for_q():
  vocab, rows = 8, 64
  target = stubs.TableModel.random(0, vocab, banned=0.15)
  draft = stubs.TableModel.random(1, vocab, banned=0.25)
  params = sampling.SamplingParams.create(temperature=1.0, top_k=2)
  run = functools.partial(_decode, target, draft, batch=rows, max_len=6, gamma=3,
                          rng=jax.random.key(5), params=params)
  same, default, plain = run(draft_params=params), run(), run(draft_params=params.untruncated())
  np.testing.assert_array_equal(same.tokens, default.tokens)
  # q with top-k 2 proposes only the draft's two best tokens; untruncated, others too.
  assert not np.array_equal(plain.accept_histogram, default.accept_histogram)
  untruncated = params.untruncated()
  assert int(untruncated.top_k) == 0 and float(untruncated.top_p) == 1.0
  assert float(untruncated.temperature) == 1.0


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_adaptive_draft_length_with_threshold_0_is_fixed_gamma(temperature):
  """No token has probability below 0: the adaptive loop drafts gamma, exactly as the fixed one."""
  vocab, gamma = 9, 3
  target = stubs.TableModel.random(4, vocab)
  draft = stubs.TableModel.random(5, vocab)
  run = functools.partial(_decode, target, draft, batch=3, max_len=12, gamma=gamma,
                          rng=jax.random.key(3),
                          params=sampling.SamplingParams.create(temperature=temperature))
  fixed, adaptive = run(), run(confidence_threshold=0.0)
  for name in ('tokens', 'lengths', 'target_calls', 'draft_calls', 'accept_histogram',
               'draft_histogram'):
    np.testing.assert_array_equal(getattr(adaptive, name), getattr(fixed, name), err_msg=name)
  assert np.asarray(fixed.draft_histogram)[:gamma].sum() == 0


@pytest.mark.parametrize('verification', ['token', 'block'])
def test_verify_over_the_smallest_static_length_equals_the_full_call(verification):
  """Adaptive drafts verified over K in (2, 3, gamma + 1): the same outputs and counts."""
  vocab, gamma = 9, 5
  target = stubs.TableModel.random(10, vocab)
  draft = stubs.TableModel.random(11, vocab)
  run = functools.partial(_decode, target, draft, batch=3, max_len=15, gamma=gamma,
                          rng=jax.random.key(4), confidence_threshold=0.3,
                          verification=verification,
                          params=sampling.SamplingParams.create(temperature=1.0))
  full, bucketed = run(), run(verify_lengths=(2, 3))
  for name in ('tokens', 'lengths', 'target_calls', 'draft_calls', 'accept_histogram',
               'draft_histogram'):
    np.testing.assert_array_equal(getattr(bucketed, name), getattr(full, name), err_msg=name)
  assert np.asarray(full.draft_histogram)[1:3].sum() > 0  # short blocks took a short call


def test_adaptive_draft_length_stops_rows_and_stays_greedy_exact():
  """Threshold 1: every row stops after one draft; 0.5: lengths vary; greedy output unchanged."""
  vocab, gamma, max_len = 11, 4, 17
  target = stubs.TableModel.random(6, vocab)
  draft = stubs.TableModel(np.asarray(target.table) + 0.8 * np.random.default_rng(7)
                           .standard_normal(target.table.shape))
  base = _decode(target, None, batch=4, max_len=max_len, gamma=0, rng=jax.random.key(0))
  for threshold in (1.0, 0.5):
    out = _decode(target, draft, batch=4, max_len=max_len, gamma=gamma, rng=jax.random.key(1),
                  confidence_threshold=threshold)
    np.testing.assert_array_equal(out.tokens, base.tokens)
    drafted = np.asarray(out.draft_histogram)
    iterations = int(np.sum(out.target_calls))
    assert drafted.sum() == iterations
    if threshold == 1.0:
      assert drafted[1] == iterations
      np.testing.assert_array_equal(out.accept_histogram[2:], 0)
    else:
      assert drafted[1] > 0 and drafted[2:].sum() > 0, drafted


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_adaptive_draft_equal_to_target_accepts_every_proposal(temperature):
  """Rows stop drafting at different lengths; a draft cache left behind would reject some."""
  vocab, gamma, max_len = 9, 4, 20
  target = stubs.TableModel.random(3, vocab)
  out = _decode(target, target, batch=3, max_len=max_len, gamma=gamma, rng=jax.random.key(2),
                params=sampling.SamplingParams.create(temperature=temperature), eos_id=-1,
                confidence_threshold=0.5)
  np.testing.assert_array_equal(out.accept_histogram, out.draft_histogram)
  assert np.asarray(out.draft_histogram)[1:gamma].sum() > 0  # some blocks were short
  np.testing.assert_array_equal(out.lengths, [max_len] * 3)


@pytest.mark.parametrize('temperature', [0.0, 1.0])
@pytest.mark.parametrize('gamma', [1, 4])
def test_draft_equal_to_target_accepts_everything(gamma, temperature):
  vocab, max_len = 9, 4 * (gamma + 1)
  target = stubs.TableModel.random(3, vocab)
  out = _decode(target, target, batch=3, max_len=max_len, gamma=gamma, rng=jax.random.key(2),
                params=sampling.SamplingParams.create(temperature=temperature), eos_id=-1)
  hist = np.asarray(out.accept_histogram)
  assert hist[:gamma].sum() == 0 and hist[gamma] == 3 * 4
  np.testing.assert_array_equal(out.lengths, [max_len] * 3)
  assert float(out.tokens_per_target_call) == gamma + 1
  # gamma draft calls per iteration: a sweep's x_gamma is fed with the next iteration's first.
  np.testing.assert_array_equal(out.draft_calls, [4 * gamma] * 3)


@pytest.mark.parametrize('gamma', [None, 3])
def test_batch_rows_equal_their_batch_1_runs(gamma):
  vocab, batch, max_len = 7, 5, 12
  target = stubs.TableModel.random(4, vocab, banned=0.1)
  draft = stubs.TableModel.random(5, vocab)
  params = sampling.SamplingParams.create(temperature=1.0)
  keys = jax.random.split(jax.random.key(3), batch)
  prompt = jnp.array([[2, 0], [0, 0], [3, 4], [5, 0], [0, 0]])
  kwargs = dict(max_len=max_len, gamma=gamma or 0, params=params)
  full = _decode(target, gamma and draft, batch=batch, rng=keys, prompt=prompt, **kwargs)
  for b in range(batch):
    one = _decode(target, gamma and draft, batch=1, rng=keys[b:b + 1], prompt=prompt[b:b + 1],
                  **kwargs)
    np.testing.assert_array_equal(one.tokens[0], full.tokens[b])
    np.testing.assert_array_equal(one.target_calls[0], full.target_calls[b])
    np.testing.assert_array_equal(one.draft_calls[0], full.draft_calls[b])


@pytest.mark.parametrize('gamma', [None, 2, 6])
def test_eos_and_max_len_end_rows(gamma):
  vocab, batch, max_len = 5, 64, 7
  target = stubs.TableModel.random(6, vocab)
  draft = stubs.TableModel.random(7, vocab)
  out = _decode(target, gamma and draft, batch=batch, max_len=max_len, gamma=gamma or 0,
                rng=jax.random.key(5), params=sampling.SamplingParams.create(temperature=1.0))
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  assert tokens.shape == (batch, max_len)
  assert np.all((lengths >= 1) & (lengths <= max_len))
  ended_by_eos = 0
  for row, length in zip(tokens, lengths):
    assert np.all(row[length:] == 0)
    assert EOS not in row[:length - 1]
    ended_by_eos += row[length - 1] == EOS
    assert row[length - 1] == EOS or length == max_len
  assert 0 < ended_by_eos < batch  # both endings occur
  np.testing.assert_array_equal(out.generated, lengths)


def test_changing_sampling_values_does_not_recompile():
  vocab, max_len, gamma = 6, 8, 3
  target = stubs.TableModel.random(8, vocab)
  draft = stubs.TableModel.random(9, vocab)
  capacity = decoding.cache_length(max_len, gamma)

  @jax.jit
  def run(rng, params, lenience):
    return decoding.speculative_decode(
        target.step_fn, target.init_cache(2, capacity), draft.step_fn, draft.init_cache(2, capacity),
        gamma=gamma, max_decode_len=max_len, rng=rng, sampling=params, lenience=lenience)

  run(jax.random.key(0), sampling.SamplingParams.create(), 1.0)
  traces = (target.traces, draft.traces)
  for t, k, p, l in itertools.product([0.0, 0.5, 1.0], [0, 3], [1.0, 0.8], [1.0, 0.5]):
    run(jax.random.key(1), sampling.SamplingParams.create(temperature=t, top_k=k, top_p=p), l)
  assert (target.traces, draft.traces) == traces
  assert run._cache_size() == 1


def test_bad_arguments_raise_clear_errors():
  target = stubs.TableModel.random(0, 6)
  draft = stubs.TableModel.random(1, 6)
  other_vocab = stubs.TableModel.random(2, 7)
  caches = lambda m, n=20: m.init_cache(2, n)
  key = jax.random.key(0)
  spec = functools.partial(decoding.speculative_decode, target.step_fn, caches(target), rng=key)
  with pytest.raises(ValueError, match='gamma must be an integer >= 1'):
    spec(draft.step_fn, caches(draft), gamma=0, max_decode_len=8)
  with pytest.raises(ValueError, match='gamma must be an integer >= 1'):
    spec(draft.step_fn, caches(draft), gamma=2.0, max_decode_len=8)
  with pytest.raises(ValueError, match='max_decode_len must be an integer >= 1'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=0)
  with pytest.raises(ValueError, match='draft vocabulary size 7 != target vocabulary size 6'):
    spec(other_vocab.step_fn, caches(other_vocab), gamma=2, max_decode_len=8)
  with pytest.raises(ValueError, match='draft cache holds 5 positions'):
    spec(draft.step_fn, caches(draft, 5), gamma=2, max_decode_len=8)
  with pytest.raises(ValueError, match='prompt of length 8 does not fit max_decode_len=8'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8,
         prompt=jnp.ones((2, 8), jnp.int32))
  with pytest.raises(ValueError, match=r'lenience must be a number in \(0, 1\], got 0.0'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, lenience=0.0)
  with pytest.raises(ValueError, match="verification must be one of .*, got 'tree'"):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, verification='tree')
  with pytest.raises(ValueError, match=r'confidence_threshold must be None or a number in '
                                       r'\[0, 1\], got 1.5'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, confidence_threshold=1.5)
  with pytest.raises(ValueError, match=r'verify_lengths must be integers in 2..gamma \+ 1 = 3'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, verify_lengths=(1, 3))
  with pytest.raises(ValueError, match='rng must be one key or 2 keys'):
    decoding.autoregressive_decode(target.step_fn, caches(target), max_decode_len=8,
                                   rng=jax.random.split(key, 3))
  with pytest.raises(ValueError, match='target cache holds 8 positions'):
    decoding.autoregressive_decode(target.step_fn, caches(target, 8), max_decode_len=8, rng=key)
  with pytest.raises(ValueError, match='lenience must be a number in'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, lenience=np.float32(2.0))
  with pytest.raises(ValueError, match='lenience must be a number in'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, lenience=jnp.asarray(5.0))
  with pytest.raises(ValueError, match='prompt must hold integer token ids'):
    spec(draft.step_fn, caches(draft), gamma=2, max_decode_len=8, prompt=jnp.ones((2, 2)))


@pytest.mark.parametrize('gamma', [None, 2])
def test_check_finite_stops_and_flags_rows_with_nonfinite_logits(gamma):
  vocab, batch, max_len = 6, 16, 8
  finite = stubs.TableModel.random(3, vocab)
  poisoned = np.array(finite.table)
  poisoned[:, 4] = np.nan  # feeding token 4 gives NaN logits
  draft = stubs.TableModel.random(4, vocab) if gamma else None

  @functools.partial(jax.jit, static_argnums=1)
  def run(table, check_finite):  # one compile per check_finite, the table traced
    target = stubs.TableModel(table)
    capacity = decoding.cache_length(max_len, gamma or 0)
    caches = lambda m: m.init_cache(batch, capacity)
    kwargs = dict(max_decode_len=max_len, rng=jax.random.key(5), eos_id=EOS,
                  sampling=sampling.SamplingParams.create(temperature=1.0),
                  check_finite=check_finite)
    if draft is None:
      return decoding.autoregressive_decode(target.step_fn, caches(target), **kwargs)
    return decoding.speculative_decode(target.step_fn, caches(target), draft.step_fn,
                                       caches(draft), gamma=gamma, **kwargs)

  clean = run(finite.table, False)
  assert clean.nonfinite is None
  checked_clean = run(finite.table, True)
  assert not checked_clean.nonfinite.any()
  np.testing.assert_array_equal(checked_clean.tokens, clean.tokens)

  out = run(poisoned, True)
  flagged = np.asarray(out.nonfinite)
  unchecked = run(poisoned, False)
  # Every emitted token but a row's last is fed to the target (the speculative
  # loop also feeds it drafts it then rejects, so it may flag more rows).
  fed_4 = np.array([4 in row[:length - 1] for row, length in zip(
      np.asarray(unchecked.tokens), np.asarray(unchecked.lengths))])
  assert fed_4.any() and np.all(flagged[fed_4])
  if draft is None:
    np.testing.assert_array_equal(flagged, fed_4)
  np.testing.assert_array_equal(np.asarray(out.tokens)[~flagged],
                                np.asarray(unchecked.tokens)[~flagged])
