"""Tests for block verification (speculative.accept_reject(verification='block')).

The exactness test draws whole blocks from context-dependent draft and target
tables, so a rule that were only exact for context-free p and q would fail it.
Checked by hand once (2026-12-02), both cases of
`test_joint_law_of_a_block_is_the_targets[...-block]` fail a broken rule: with
h_i = w_i instead of r_i / (r_i + 1 - w_i), p-value 0.0 in both; with the
residual max(0, p - q) instead of max(0, w_n p - q), p-values 3e-145 and 6e-87
(the correct rule: 0.30 and 0.036). The adaptive cases (`...-True-token` and
`...-True-block`) fail when `lengths` leaves q unmasked beyond a row's length
(p-values 3e-17 and 2e-310) or leaves the acceptance ratio unmasked (3e-7 and
6e-63).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import sampling
from spec_decode import speculative
from tests import stubs

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4
CHUNK = 100_000
_accept_reject = jax.jit(speculative.accept_reject, static_argnames='verification')


def _tables(seed, vocab, gamma, banned):
  """Context-dependent distributions: p[L] [V^L, V] for L = 0..gamma, q[L] for L < gamma.

  Row j of table L is the distribution after the prefix whose base-V digits
  are j (first token most significant).
  """
  rng = np.random.default_rng(seed)

  def table(length):
    logits = 2.5 * rng.standard_normal((vocab ** length, vocab))
    logits[rng.random(logits.shape) < banned] = -np.inf
    logits[:, rng.integers(vocab)] = 0.0  # support is never empty
    return np.asarray(jax.nn.softmax(logits, axis=-1), np.float32)

  return [table(n) for n in range(gamma + 1)], [table(n) for n in range(gamma)]


@functools.partial(jax.jit, static_argnames=('rows', 'verification', 'adaptive'),
                   compiler_options=stubs.OPTIMIZED)
def _blocks(key, p, q, rows, verification, adaptive=False):
  """Drafts a block from q, verifies it against p, completes gamma + 1 tokens from p.

  adaptive: a row stops drafting after a token its draft gave probability
  below 0.2 (the rule of spec_decode.draft_phase, on these q), so block lengths
  depend on the drafted path.

  Returns:
    [rows] int32: the gamma + 1 emitted tokens as one base-V number.
    [rows] int32: accepted drafts n.
    [rows] int32: drafts proposed (gamma unless adaptive).
  """
  gamma, vocab = len(q), q[0].shape[-1]
  keys = jax.random.split(key, 2 * gamma + 2)
  prefix, drafts, q_rows, p_rows = jnp.zeros((rows,), jnp.int32), [], [], []
  lengths = jnp.full((rows,), gamma, jnp.int32)
  for i in range(gamma):
    q_rows.append(q[i][prefix])
    p_rows.append(p[i][prefix])
    drafts.append(sampling.sample(jax.random.split(keys[i], rows), q_rows[-1]))
    prefix = prefix * vocab + drafts[-1]
    confidence = jnp.take_along_axis(q_rows[-1], drafts[-1][:, None], axis=1)[:, 0]
    lengths = jnp.where((lengths == gamma) & (confidence < 0.2), i + 1, lengths)
  p_rows.append(p[gamma][prefix])
  drafts = jnp.stack(drafts, axis=1)
  n, y = speculative.accept_reject(jax.random.split(keys[gamma], rows), drafts,
                                   jnp.stack(q_rows, axis=1), jnp.stack(p_rows, axis=1),
                                   verification=verification,
                                   lengths=lengths if adaptive else None)
  # x_1..x_n, y, then the target's own samples up to gamma + 1 tokens.
  outcome = jnp.zeros((rows,), jnp.int32)
  for i in range(gamma + 1):
    own = sampling.sample(jax.random.split(keys[gamma + 1 + i], rows), p[i][outcome])
    token = drafts[:, i] if i < gamma else own
    token = jnp.where(i < n, token, jnp.where(i == n, y, own))
    outcome = outcome * vocab + token
  return outcome, n, lengths if adaptive else jnp.full((rows,), gamma)


def _target_law(p, vocab, gamma):
  """[V^(gamma + 1)] probability of each sequence of gamma + 1 target samples."""
  law = np.ones(1)
  for length in range(gamma + 1):
    law = (law[:, None] * p[length]).reshape(-1)
  assert law.shape == (vocab ** (gamma + 1),)
  return law


@pytest.mark.parametrize('verification', speculative.VERIFICATIONS)
@pytest.mark.parametrize('vocab, gamma, banned, adaptive', [
    (3, 3, 0.25, False), (4, 2, 0.3, False), (3, 3, 0.25, True)])
def test_joint_law_of_a_block_is_the_targets(verification, vocab, gamma, banned, adaptive):
  """The gamma + 1 tokens a verify pass starts are distributed as p's (chi-square).

  adaptive: each row proposes only the drafts before its stop rule fired.
  """
  p, q = _tables(10 * vocab + gamma + 100 * adaptive, vocab, gamma, banned)
  counts = np.zeros(vocab ** (gamma + 1), np.int64)
  accepted = np.zeros(gamma + 1, np.int64)
  proposed = np.zeros(gamma + 1, np.int64)
  short_sweeps = 0  # all of a block shorter than gamma kept: the bonus is p_{L + 1}
  for i in range(4):
    outcome, n, lengths = (np.asarray(a) for a in _blocks(jax.random.key(i), p, q, CHUNK,
                                                           verification, adaptive))
    counts += np.bincount(outcome, minlength=counts.size)
    accepted += np.bincount(n, minlength=gamma + 1)
    proposed += np.bincount(lengths, minlength=gamma + 1)
    short_sweeps += int(np.sum((n == lengths) & (lengths < gamma)))
  assert stubs.chi_square_pvalue(counts, _target_law(p, vocab, gamma)) > FALSE_POSITIVE_RATE
  if adaptive:  # every block length occurred, and rejections and acceptances
    assert np.all(proposed[1:] > 0) and accepted[0] > 0 and accepted[2:].sum() > 0, (
        proposed, accepted)
    assert short_sweeps > 0
  else:
    assert np.all(accepted > 0)  # every n, so every residual, was exercised


def _exact_expected_accepted(p, q, vocab, gamma):
  """E[n] of token and of block verification, summed exactly over all drafts."""
  blocks = np.array(list(itertools.product(range(vocab), repeat=gamma)))  # [V^gamma, gamma]
  prefixes = np.zeros(len(blocks), np.int64)
  q_rows, p_rows, q_block = [], [], np.ones(len(blocks))
  for i in range(gamma):
    q_rows.append(q[i][prefixes])
    p_rows.append(p[i][prefixes])
    q_block *= q_rows[-1][np.arange(len(blocks)), blocks[:, i]]
    prefixes = prefixes * vocab + blocks[:, i]
  p_rows.append(p[gamma][prefixes])
  q_rows, p_rows = jnp.asarray(np.stack(q_rows, 1)), jnp.asarray(np.stack(p_rows, 1))
  ratio = speculative.acceptance_ratio(jnp.asarray(blocks), q_rows, p_rows)
  token = np.sum(np.cumprod(np.minimum(np.asarray(ratio), 1.0), axis=1), axis=1)
  _, h = speculative.block_weights(ratio, q_rows, p_rows)
  h = np.asarray(h, np.float64)
  # P(n = i) = h_i * prod_{j > i} (1 - h_j): n is the last i with eta_i < h_i.
  later = np.cumprod((1 - h)[:, ::-1], axis=1)[:, ::-1]
  later = np.concatenate([later[:, 1:], np.ones((len(blocks), 1))], axis=1)
  block = np.sum(np.arange(1, gamma + 1) * h * later, axis=1)
  return float(q_block @ token), float(q_block @ block)


@pytest.mark.parametrize('seed', range(4))
def test_block_accepts_at_least_as_many_drafts_in_expectation(seed):
  """Sun et al.: E[n] of block >= E[n] of token, exactly over all blocks."""
  vocab, gamma = 5, 4
  p, q = _tables(seed, vocab, gamma, 0.2)
  token, block = _exact_expected_accepted(p, q, vocab, gamma)
  assert block >= token - 1e-5, (token, block)
  assert block > token + 1e-3  # and strictly more on random tables


def test_hand_computed_block_where_token_verification_often_stops():
  """x_1 is half as likely under p, x_2 three times as likely: the block keeps both.

  q_1 = (.5, .5), p_1 = (.25, .75), x_1 = 0: w_1 = .5 (token: accept w.p. .5).
  q_2 = (.8, .2), p_2 = (.4, .6), x_2 = 1: w_2 = min(1, .5 * 3) = 1 = h_2.
  r_1 = max(0, .2 - .8) + max(0, .3 - .2) = .1, h_1 = .1 / (.1 + .5) = 1/6.
  """
  q = jnp.array([[[0.5, 0.5], [0.8, 0.2]]])
  p = jnp.array([[[0.25, 0.75], [0.4, 0.6], [0.3, 0.7]]])
  drafts = jnp.array([[0, 1]])
  ratio = speculative.acceptance_ratio(drafts, q, p)
  w, h = speculative.block_weights(ratio, q, p)
  np.testing.assert_allclose(w, [[1.0, 0.5, 1.0]], rtol=1e-6)
  np.testing.assert_allclose(h, [[1 / 6, 1.0]], rtol=1e-6)
  rows = 2000
  args = (jax.random.split(jax.random.key(0), rows), jnp.broadcast_to(drafts, (rows, 2)),
          jnp.broadcast_to(q, (rows, 2, 2)), jnp.broadcast_to(p, (rows, 3, 2)))
  block_n, _ = _accept_reject(*args, verification='block')
  token_n, _ = _accept_reject(*args, verification='token')
  assert np.all(np.asarray(block_n) == 2)
  assert 0.4 < np.mean(np.asarray(token_n) == 2) < 0.6


def test_greedy_block_equals_token_verification():
  """One-hot p and q: both rules keep the matching prefix and correct the first mismatch."""
  vocab = 6
  p = jnp.broadcast_to(jax.nn.one_hot(jnp.array([3, 1, 4, 5]), vocab), (4, 4, vocab))
  drafts = jnp.array([[3, 1, 0], [3, 1, 4], [2, 1, 4], [3, 0, 4]])
  q = jax.nn.one_hot(drafts, vocab)
  for verification in speculative.VERIFICATIONS:
    n, y = _accept_reject(jax.random.split(jax.random.key(0), 4), drafts, q, p,
                          verification=verification)
    np.testing.assert_array_equal(n, [2, 3, 0, 1], err_msg=verification)
    np.testing.assert_array_equal(y, [4, 5, 3, 1], err_msg=verification)


def test_unknown_verification_is_a_clear_error():
  key = jax.random.split(jax.random.key(0), 2)
  with pytest.raises(ValueError, match=r"verification must be one of \('token', 'block'\), "
                                       r"got 'tree'"):
    speculative.accept_reject(key, jnp.zeros((2, 3), jnp.int32), jnp.full((2, 3, 5), 0.2),
                              jnp.full((2, 4, 5), 0.2), verification='tree')
