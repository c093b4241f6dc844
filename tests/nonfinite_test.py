"""The non-finite logits check: NaN, +inf and fully masked positions, CPU kernels on and off.

XLA:CPU's vectorized max drops a NaN among finite values (one NaN in a row
of 8192 zeros has maximum 0), so the check must not rest on the maximum
alone. Every case runs with SPEC_DECODE_CPU_KERNELS=0 and 1 (read when a
function is traced: each case traces anew).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode import kernels
from spec_decode import loop_utils
from spec_decode import sampling as sampling_lib

SWITCHES = ('0', '1')
VOCAB = 8192  # large enough for XLA:CPU's vectorized max to drop a NaN
POISONS = ('nan', 'inf', 'masked')


def _logits(vocab: int) -> tuple[np.ndarray, list[bool]]:
  """[8, 2, V] logits and whether each row must be flagged."""
  x = np.tile(np.linspace(-3.0, 3.0, vocab, dtype=np.float32), (8, 2, 1))
  x[1, :, ::2] = -np.inf  # masks, with finite logits left at every position: passes
  x[2, 1, 0] = np.nan
  x[3, 0, vocab // 2] = np.nan
  x[4, 1, vocab - 1] = np.nan
  x[5, 0, vocab // 3] = np.inf
  x[6, 1] = -np.inf  # a position with nothing left
  x[7, 0, 1] = -np.inf
  x[7, 0, 2] = np.inf
  return x, [False, False, True, True, True, True, True, True]


@pytest.mark.parametrize('switch', SWITCHES)
@pytest.mark.parametrize('vocab', [3, VOCAB, 32128])
def test_nonfinite_rows_flags_nan_inf_and_fully_masked_positions(monkeypatch, switch, vocab):
  monkeypatch.setenv(kernels.SWITCH, switch)
  logits, expected = _logits(vocab)
  check = jax.jit(lambda x: loop_utils.nonfinite_rows(x))  # a new function: traced anew
  np.testing.assert_array_equal(check(logits), expected)
  np.testing.assert_array_equal(check(logits[:, :1]), [e and i != 2 and i != 4 and i != 6
                                                       for i, e in enumerate(expected)])
  lone = np.zeros((3, 1, vocab), np.float32)  # one NaN among zeros, where the maximum is 0
  lone[0, 0, vocab // 2] = np.nan
  lone[1, 0, 0] = np.nan
  np.testing.assert_array_equal(check(lone), [True, True, False])
  np.testing.assert_array_equal(check(jnp.asarray(lone, jnp.bfloat16)), [True, True, False])


def test_nonfinite_rows_passes_finite_logits_whose_sum_overflows():
  huge = np.full((1, 1, 64), 3e38, np.float32)  # the sum is +inf, every logit finite
  assert not loop_utils.nonfinite_rows(huge)[0]
  assert not loop_utils.nonfinite_rows(-huge)[0]


class _Model:
  """Logits over VOCAB ids that depend on the last token, poisoned from position 2 on."""

  def __init__(self, poison: str | None, seed: int):
    self.poison = poison
    self.table = jax.random.normal(jax.random.key(seed), (16, VOCAB))

  def init_cache(self, batch: int, capacity: int) -> cache_lib.Cache:
    return cache_lib.Cache(index=jnp.zeros((batch,), jnp.int32),
                           layers=jnp.zeros((batch, capacity), jnp.int32), capacity=capacity)

  def step_fn(self, tokens: jax.Array, cache: cache_lib.Cache):
    logits = self.table[tokens % 16]  # [B, K, V]
    positions = cache.index[:, None] + jnp.arange(tokens.shape[1])
    if self.poison is not None:
      bad = (positions >= 2)[..., None]
      poisoned = {'nan': logits.at[..., 7].set(jnp.nan), 'inf': logits.at[..., 7].set(jnp.inf),
                  'masked': jnp.full_like(logits, -jnp.inf)}[self.poison]
      logits = jnp.where(bad, poisoned, logits)
    return logits, cache.replace(index=cache.index + tokens.shape[1])


# Every poison in the target and in the draft, and one clean run (poison None) per switch.
CASES = [(poison, poisoned) for poison in POISONS for poisoned in ('target', 'draft')] + [
    (None, None)]


@pytest.mark.parametrize('switch', SWITCHES)
@pytest.mark.parametrize('poison, poisoned', CASES)
@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_loops_stop_and_flag_rows_with_nonfinite_logits(monkeypatch, switch, poison, poisoned,
                                                        temperature):
  monkeypatch.setenv(kernels.SWITCH, switch)
  max_decode_len, gamma = 12, 3
  target = _Model(poison if poisoned == 'target' else None, 0)
  draft = _Model(poison if poisoned == 'draft' else None, 1)
  sampling = sampling_lib.SamplingParams.create(temperature)
  capacity = loop_utils.cache_length(max_decode_len, gamma)

  @jax.jit
  def run(rng):
    baseline = decoding.autoregressive_decode(
        target.step_fn, target.init_cache(2, capacity), max_decode_len=max_decode_len, rng=rng,
        sampling=sampling, eos_id=-1)
    speculative = decoding.speculative_decode(
        target.step_fn, target.init_cache(2, capacity), draft.step_fn,
        draft.init_cache(2, capacity), gamma=gamma, max_decode_len=max_decode_len, rng=rng,
        sampling=sampling, eos_id=-1)
    return baseline, speculative

  baseline, speculative = run(jax.random.key(0))
  np.testing.assert_array_equal(baseline.nonfinite, poisoned == 'target')
  np.testing.assert_array_equal(speculative.nonfinite, poisoned is not None)
  if poisoned == 'target':
    assert np.all(np.asarray(baseline.generated) < max_decode_len)
  if poisoned is not None:
    assert np.all(np.asarray(speculative.generated) < max_decode_len)
