"""Tests for spec_decode.speculative: exactness of the accept/reject rule."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from spec_decode import sampling
from spec_decode import speculative
from tests import stubs

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4
CHUNK = 100_000


def _distributions(seed, vocab, gamma, banned, params):
  """Random p [gamma + 1, V] and q [gamma, V] with partly disjoint support."""
  rng = np.random.default_rng(seed)
  p_logits = 1.5 * rng.standard_normal((gamma + 1, vocab))
  q_logits = 1.5 * rng.standard_normal((gamma, vocab))
  p_logits[rng.random(p_logits.shape) < banned] = -np.inf
  q_logits[rng.random(q_logits.shape) < banned] = -np.inf
  p_logits[:, 0] = q_logits[:, 1] = 0.0  # support is never empty
  p = sampling.adjust(jnp.asarray(p_logits), params)
  q = sampling.adjust(jnp.asarray(q_logits), params)
  return p, q


@functools.partial(jax.jit, static_argnames='rows', compiler_options=stubs.OPTIMIZED)
def _run(key, p, q, lenience, rows):
  """Drafts from q and verifies against p for `rows` independent rows."""
  draft_key, verify_key = jax.random.split(key)
  gamma, vocab = q.shape
  q_rows = jnp.broadcast_to(q, (rows, gamma, vocab))
  drafts = sampling.sample(jax.random.split(draft_key, rows), q_rows)  # [rows, gamma]
  n, y = speculative.accept_reject(jax.random.split(verify_key, rows), drafts, q_rows,
                                   jnp.broadcast_to(p, (rows, gamma + 1, vocab)), lenience)
  first = jnp.where(n >= 1, drafts[:, 0], y)
  second = jnp.where(n >= 2, drafts[:, min(1, gamma - 1)], y)  # meaningful where n >= 1
  return n, first, second


def _sample_many(seed, p, q, total, lenience=1.0):
  vocab = p.shape[-1]
  first_counts = np.zeros(vocab, np.int64)
  second_counts = np.zeros(vocab, np.int64)
  accepted_first = 0
  for i in range(total // CHUNK):
    n, first, second = (np.asarray(a) for a in _run(jax.random.key(seed * 1000 + i), p, q,
                                                    lenience, CHUNK))
    first_counts += np.bincount(first, minlength=vocab)
    second_counts += np.bincount(second[n >= 1], minlength=vocab)
    accepted_first += int(np.sum(n >= 1))
  return first_counts, second_counts, accepted_first


@pytest.mark.parametrize('vocab, gamma, banned, knobs', [
    (8, 1, 0.3, dict(temperature=1.0)),
    (8, 3, 0.3, dict(temperature=1.0)),
    (50, 3, 0.2, dict(temperature=0.8)),
    (50, 3, 0.1, dict(temperature=1.0, top_k=10)),
    (50, 1, 0.1, dict(temperature=1.3, top_p=0.8)),
    (20, 3, 0.0, dict(temperature=1.0, top_k=6, top_p=0.9)),
])
def test_emitted_tokens_follow_p(vocab, gamma, banned, knobs):
  """Token 1 ~ p_1 and token 2 ~ p_2, whatever q (truncated differently)."""
  p, q = _distributions(vocab + gamma, vocab, gamma, banned, sampling.SamplingParams.create(**knobs))
  total = 400_000
  first, second, accepted = _sample_many(vocab * gamma, p, q, total)
  assert stubs.chi_square_pvalue(first, p[0]) > FALSE_POSITIVE_RATE
  assert stubs.chi_square_pvalue(second, p[1]) > FALSE_POSITIVE_RATE
  # The first draft is accepted with probability beta = sum_x min(p(x), q(x)).
  beta = float(jnp.sum(jnp.minimum(p[0], q[0])))
  assert stats.binomtest(accepted, total, beta).pvalue > FALSE_POSITIVE_RATE


def test_lenience_accepts_more_and_is_documented_inexact():
  """With l < 1 a draft is accepted with probability sum_x min(q(x), p(x) / l)."""
  p, q = _distributions(3, 12, 2, 0.2, sampling.SamplingParams.create(temperature=1.0))
  total = 200_000
  for lenience in (1.0, 0.5, 0.2):
    first, _, accepted = _sample_many(7, p, q, total, lenience)
    expected = float(jnp.sum(jnp.minimum(q[0], p[0] / lenience)))
    assert stats.binomtest(accepted, total, expected).pvalue > FALSE_POSITIVE_RATE
    if lenience < 1:  # the output drifts towards q: no longer exact
      assert stubs.chi_square_pvalue(first, p[0]) < FALSE_POSITIVE_RATE


def test_greedy_accepts_matching_prefix_and_corrects_first_mismatch():
  vocab = 6
  target = np.array([3, 1, 4, 5])  # argmax of p_1..p_4
  p = jax.nn.one_hot(target, vocab)
  drafts = jnp.array([[3, 1, 0], [3, 1, 4], [2, 1, 4]])
  q = jax.nn.one_hot(drafts, vocab)
  n, y = speculative.accept_reject(jax.random.split(jax.random.key(0), 3), drafts, q,
                                   jnp.broadcast_to(p, (3, 4, vocab)))
  np.testing.assert_array_equal(n, [2, 3, 0])
  np.testing.assert_array_equal(y, [4, 5, 3])


@pytest.mark.parametrize('verification', ['token', 'block'])
@pytest.mark.parametrize('lenience', [1.0, 0.5])
@pytest.mark.parametrize('adaptive', [False, True])
def test_accept_greedy_is_accept_reject_on_one_hot_distributions(verification, lenience, adaptive):
  """The loop's temperature-0 path decides exactly what accept_reject decides."""
  rows, gamma, vocab = 400, 4, 3  # a small vocabulary: many matches, all patterns
  rng = np.random.default_rng(0)
  target = jnp.asarray(rng.integers(0, vocab, (rows, gamma + 1)), jnp.int32)
  drafts = jnp.asarray(rng.integers(0, vocab, (rows, gamma)), jnp.int32)
  lengths = jnp.asarray(rng.integers(1, gamma + 1, rows), jnp.int32) if adaptive else None
  n, y = speculative.accept_reject(jax.random.split(jax.random.key(1), rows), drafts,
                                   jax.nn.one_hot(drafts, vocab), jax.nn.one_hot(target, vocab),
                                   lenience, verification, lengths=lengths)
  n_greedy, y_greedy = speculative.accept_greedy(drafts, target, lengths)
  np.testing.assert_array_equal(n_greedy, n)
  np.testing.assert_array_equal(y_greedy, y)
  assert len(np.unique(np.asarray(n))) == gamma + 1  # every prefix length occurred


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_accept_from_logits_is_adjust_then_accept_reject(temperature):
  """The loop's step 3 decides as accept_reject on the adjusted p, greedy or not."""
  rows, gamma, vocab = 300, 3, 4
  rng = np.random.default_rng(1)
  params = sampling.SamplingParams.create(temperature)
  logits = jnp.asarray(rng.standard_normal((rows, gamma + 1, vocab)), jnp.float32)
  q = sampling.adjust(jnp.asarray(rng.standard_normal((rows, gamma, vocab)), jnp.float32), params)
  drafts = jnp.asarray(rng.integers(0, vocab, (rows, gamma)), jnp.int32)
  keys = jax.random.split(jax.random.key(2), rows)
  expected = speculative.accept_reject(keys, drafts, q, sampling.adjust(logits, params))
  for got, want in zip(speculative.accept(keys, drafts, q, logits, params), expected):
    np.testing.assert_array_equal(got, want)


def test_draft_with_zero_draft_probability_is_judged_by_p():
  """A proposal outside q's support is accepted iff the target allows it."""
  p = jnp.array([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])
  q = jnp.array([[1.0, 0.0, 0.0]])
  for token, expected_n in ((1, 1), (0, 0)):
    q_tok = jnp.broadcast_to(q, (1000, 1, 3))
    drafts = jnp.full((1000, 1), token)
    n, y = speculative.accept_reject(jax.random.split(jax.random.key(token), 1000), drafts, q_tok,
                                     jnp.broadcast_to(p, (1000, 2, 3)))
    assert np.all(np.asarray(n) == expected_n)
    assert np.all(np.isfinite(np.asarray(y)))


def test_zero_residual_falls_back_to_p():
  """p == q: a (numerically possible) rejection samples p, never NaN/garbage."""
  p = jnp.array([[0.25, 0.75, 0.0], [0.1, 0.2, 0.7]])
  q = p[:1]
  rows = 4000
  keys = jax.random.split(jax.random.key(1), rows)
  # Force rejections by proposing a token with p = q = 0 (ratio 0 -> reject).
  drafts = jnp.full((rows, 1), 2)
  n, y = speculative.accept_reject(keys, drafts, jnp.broadcast_to(q, (rows, 1, 3)),
                                   jnp.broadcast_to(p, (rows, 2, 3)))
  assert np.all(np.asarray(n) == 0)
  counts = np.bincount(np.asarray(y), minlength=3)
  assert counts[2] == 0
  assert stubs.chi_square_pvalue(counts, p[0]) > FALSE_POSITIVE_RATE


def test_bad_arguments_raise_clear_errors():
  key = jax.random.split(jax.random.key(0), 2)
  q = jnp.full((2, 3, 5), 0.2)
  p = jnp.full((2, 4, 5), 0.2)
  drafts = jnp.zeros((2, 3), jnp.int32)
  with pytest.raises(ValueError, match=r'p \[B, gamma \+ 1, V\] \(the bonus row last\)'):
    speculative.accept_reject(key, drafts, q, p[:, :3])
  with pytest.raises(ValueError, match=r'draft ids must lie in \[0, 5\), got 0..7'):
    speculative.accept_reject(key, drafts.at[1, 2].set(7), q, p)
  with pytest.raises(ValueError, match='drafts must be integer token ids'):
    speculative.accept_reject(key, drafts.astype(jnp.float32), q, p)
  for lenience in (np.float32(2.0), jnp.asarray(5.0), 0.0, float('nan'), jnp.ones(2)):
    with pytest.raises(ValueError, match=r'lenience must be a number in \(0, 1\]'):
      speculative.accept_reject(key, drafts, q, p, lenience)
