"""The joint law of the loops' outputs is the target's: chi-square over enumerated sequences.

Apart from tests/decoding_test.py (whose helpers it uses) so that the two halves of the
engine's tests run on two workers side by side (`pytest -m engine`).
"""

import jax
import numpy as np
import pytest

from spec_decode import sampling
from tests import stubs
from tests.decoding_test import (FALSE_POSITIVE_RATE, _decode, _outcome_counts,
                                 _sequence_distribution)


@pytest.mark.parametrize('gamma, knobs, verification, threshold, untruncated_draft', [
    (None, dict(temperature=1.0), 'token', None, False),
    (1, dict(temperature=1.0), 'token', None, False),
    (3, dict(temperature=1.0), 'token', None, False),
    (3, dict(temperature=0.9, top_k=4, top_p=0.9), 'token', None, False),
    (3, dict(temperature=0.9, top_k=4, top_p=0.9), 'token', None, True),  # q keeps every token
    (3, dict(temperature=1.0), 'block', None, False),
    (2, dict(temperature=0.9, top_k=4, top_p=0.9), 'block', None, False),
    (2, dict(temperature=0.9, top_k=4, top_p=0.9), 'block', None, True),
    (3, dict(temperature=1.0), 'block', 0.4, False),  # token: block_verification_test
])
def test_sequence_distribution_is_the_targets(gamma, knobs, verification, threshold,
                                              untruncated_draft):
  """Joint law of the first three tokens of the full loop == p's, by chi-square."""
  vocab, max_len, rows = 6, 3, 120_000
  target = stubs.TableModel.random(0, vocab, banned=0.15)
  draft = stubs.TableModel.random(1, vocab, banned=0.25)
  params = sampling.SamplingParams.create(**knobs)
  dist = _sequence_distribution(target, params, max_len)
  out = _decode(target, draft if gamma else None, batch=rows, max_len=max_len, gamma=gamma or 0,
                rng=jax.random.key(11), params=params, verification=verification,
                confidence_threshold=threshold,
                draft_params=params.untruncated() if untruncated_draft else None)
  counts = _outcome_counts(out, dist)
  probs = np.append(np.array(list(dist.values())), 0.0)
  assert stubs.chi_square_pvalue(counts, probs) > FALSE_POSITIVE_RATE
  if gamma:  # some drafts were rejected, so the residual path was exercised
    hist = np.asarray(out.accept_histogram)
    assert hist[0] > 0 and hist[gamma] > 0
    drafted = np.asarray(out.draft_histogram)
    assert drafted[0] == 0 and drafted.sum() == hist.sum()
    if threshold:  # adaptive: every length 1..gamma was drafted
      assert np.all(drafted[1:] > 0), drafted
