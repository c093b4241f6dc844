"""Bad input through the Python API: a clear error naming the argument, never silent garbage."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import checks
from spec_decode import beam_search
from spec_decode import decoding
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode import speculative_beam
from spec_decode.t5 import t5_1_1
from tests import stubs

VOCAB = 64
# Errors raised before anything is compiled need no parameters.
UNLOADED = models.T5Model(t5_1_1('nano', vocab_size=VOCAB), None)


def _inputs(batch: int = 2, length: int = 6) -> np.ndarray:
  return np.random.default_rng(0).integers(2, VOCAB, (batch, length)).astype(np.int32)


def _beam(alpha, beam_size=2, max_decode_len=6, batch=1):
  model = stubs.PrefixModel.random(0, 5)
  return beam_search.beam_search(
      model.step_fn, model.init_cache(batch, beam_search.loop_utils.cache_length(max_decode_len)),
      beam_size=beam_size, max_decode_len=max_decode_len, alpha=alpha)


def _speculative_beam(alpha=0.6, beam_size=2, draft_width=1):
  model = stubs.PrefixModel.random(0, 5)
  cache = model.init_cache(1, beam_search.loop_utils.cache_length(6, 2))
  return speculative_beam.speculative_beam_search(
      model.step_fn, cache, model.step_fn, cache, beam_size=beam_size, draft_width=draft_width,
      gamma=2, max_decode_len=6, alpha=alpha)


@pytest.mark.parametrize('alpha', [float('nan'), float('inf'), -float('inf'), -0.5, 10.5, 1e6,
                                   np.float32('nan')])
def test_alpha_outside_zero_to_ten_is_rejected_everywhere(alpha):
  match = r'alpha must be a finite number in \[0, 10\]'
  with pytest.raises(ValueError, match=match):
    _beam(alpha)
  with pytest.raises(ValueError, match=match):
    _speculative_beam(alpha)
  with pytest.raises(ValueError, match=match):
    models.beam_generate(UNLOADED, _inputs(), beam_size=2, max_decode_len=6, alpha=alpha)


@pytest.mark.parametrize('alpha', ['0.6', True, np.array([0.6, 0.6]), 1j])
def test_alpha_that_is_not_a_real_number_is_a_type_error(alpha):
  with pytest.raises(TypeError, match='alpha must be a real number'):
    checks.check_alpha(alpha)
  with pytest.raises(TypeError, match='alpha must be a real number'):
    models.beam_generate(UNLOADED, _inputs(), beam_size=2, max_decode_len=6, alpha=alpha)


def test_alpha_whose_penalty_overflows_at_max_decode_len_is_rejected():
  with pytest.raises(ValueError, match='alpha=10.0 with max_decode_len=100000 makes the brevity'):
    models.beam_generate(UNLOADED, _inputs(), beam_size=2, max_decode_len=100_000, alpha=10.0)
  checks.check_alpha(10.0, 1000)  # (1006 / 6) ** 10 ~ 2e22: fine


@pytest.mark.parametrize('alpha', [0, 0.0, 0.6, np.float32(2.0), 10])
def test_alpha_in_range_decodes(alpha):
  out = _beam(alpha)
  assert int(out.steps) >= 1 and np.all(np.isfinite(np.asarray(out.scores)))
  assert np.all(np.asarray(out.scores) < 0)


def test_beam_sizes_outside_int32_or_below_one_are_rejected():
  for beam_size in (0, -1, 2**31, 2.0, True):
    with pytest.raises(ValueError, match=r'beam_size must be an integer >= 1 and <= 2147483647'):
      models.beam_generate(UNLOADED, _inputs(), beam_size=beam_size, max_decode_len=6)
  with pytest.raises(ValueError, match=r'beam_size=268435456 \* batch=16 = 4294967296 rows '
                     r'exceed int32'):
    models.beam_generate(UNLOADED, _inputs(batch=16), beam_size=2**28, max_decode_len=6)
  with pytest.raises(ValueError, match=r'beam_size=33554432 \* vocab_size=64 = 2147483648 '
                     r'candidates per row exceed int32'):
    models.beam_generate(UNLOADED, _inputs(batch=1), beam_size=2**25, max_decode_len=6)
  with pytest.raises(ValueError, match=r'beam_size=2 \* draft_width=64 \* batch=33554432 = '
                     r'4294967296 rows exceed int32'):
    checks.check_beam_settings(2, batch=2**25, vocab_size=VOCAB, draft_width=64)
  with pytest.raises(ValueError, match='beam_size'):
    _beam(0.6, beam_size=2**31)
  with pytest.raises(ValueError, match='candidates per row exceed int32'):
    _beam(0.6, beam_size=2**30)  # 5 tokens


@pytest.mark.parametrize('draft_width', [0, -2, 65, 2.0])
def test_draft_width_outside_one_to_vocab_is_rejected(draft_width):
  with pytest.raises(ValueError, match=r'draft_width must be an integer >= 1 and <= 64, got'):
    models.beam_generate(UNLOADED, _inputs(), beam_size=2, max_decode_len=6, draft=UNLOADED,
                         draft_width=draft_width)
  if draft_width != 65:
    with pytest.raises(ValueError, match='draft_width must be an integer >= 1'):
      _speculative_beam(draft_width=draft_width)
  with pytest.raises(ValueError, match=r'draft_width must be an integer >= 1 and <= 5, got 6'):
    _speculative_beam(draft_width=6)


def test_top_k_beyond_int32_is_rejected_not_wrapped():
  with pytest.raises(ValueError, match=r'top_k must be an integer >= 0 and <= 2147483647 '
                     r'\(int32; 0 disables\), got 1099511627776'):
    sampling_lib.SamplingParams.create(temperature=1.0, top_k=2**40)
  with pytest.raises(ValueError, match='top_k must be an integer'):
    sampling_lib.SamplingParams.create(temperature=1.0, top_k=[5, 2**31])
  assert int(sampling_lib.SamplingParams.create(top_k=2**31 - 1).top_k) == 2**31 - 1


@pytest.mark.parametrize('seed', [2**64, 2**63, -2**63 - 1])
def test_int_seed_beyond_64_bits_is_rejected(seed):
  with pytest.raises(ValueError, match=rf'rng seed {seed} is outside the 64-bit range'):
    models.generate(UNLOADED, _inputs(), seed, max_decode_len=4)
  with pytest.raises(ValueError, match='rng seed'):
    models.speculative_generate(UNLOADED, UNLOADED, _inputs(), seed, gamma=2, max_decode_len=4)
  model = stubs.TableModel.random(0, 6)
  with pytest.raises(ValueError, match='rng seed'):
    decoding.autoregressive_decode(model.step_fn, model.init_cache(2, 8), max_decode_len=4,
                                   rng=seed)


def test_int_seed_decodes_as_its_key_and_other_rng_types_are_type_errors():
  model = stubs.TableModel.random(0, 6)
  run = lambda rng: decoding.autoregressive_decode(
      model.step_fn, model.init_cache(2, 8), max_decode_len=6, rng=rng,
      sampling=sampling_lib.SamplingParams.create(temperature=1.0))
  np.testing.assert_array_equal(run(2**63 - 1).tokens, run(jax.random.key(2**63 - 1)).tokens)
  for rng in (1.5, 'seed', True, np.zeros(2, np.float32)):
    with pytest.raises(TypeError, match='rng must be a PRNG key'):
      run(rng)


def test_lengths_beyond_int32_are_rejected():
  for name, value in (('max_decode_len', 2**31), ('gamma', 2**40)):
    kwargs = {'gamma': 2, 'max_decode_len': 4, name: value}
    with pytest.raises(ValueError, match=rf'{name} must be an integer >= 1 and <= 2147483647 '
                       rf'\(int32\), got {value}'):
      models.speculative_generate(UNLOADED, UNLOADED, _inputs(), jax.random.key(0), **kwargs)
  with pytest.raises(ValueError, match=r'max_decode_len=2147483647 \+ gamma=3 \+ 1 = 2147483651 '
                     r'positions exceed int32'):
    decoding.cache_length(2**31 - 1, 3)


@pytest.mark.parametrize('entry', [decoding.autoregressive_decode, decoding.speculative_decode,
                                   models.generate, models.speculative_generate,
                                   models.beam_generate, beam_search.beam_search,
                                   speculative_beam.speculative_beam_search])
def test_check_finite_is_on_by_default(entry):
  assert inspect.signature(entry).parameters['check_finite'].default is True


@pytest.mark.parametrize('gamma', [None, 2])
def test_nonfinite_logits_are_flagged_without_asking(gamma):
  model = stubs.TableModel.random(3, 6)
  table = np.array(model.table)
  table[:, :, 3] = np.nan  # every step's logits hold a NaN
  poisoned = stubs.TableModel(table)
  kwargs = dict(max_decode_len=6, rng=jax.random.key(0))
  if gamma is None:
    out = decoding.autoregressive_decode(poisoned.step_fn, poisoned.init_cache(2, 7), **kwargs)
  else:
    out = decoding.speculative_decode(poisoned.step_fn, poisoned.init_cache(2, 9), model.step_fn,
                                      model.init_cache(2, 9), gamma=gamma, **kwargs)
  assert np.asarray(out.nonfinite).all()


@pytest.mark.parametrize('speculate', [False, True])
def test_beam_search_flags_nonfinite_logits_by_default(speculate):
  model = stubs.PrefixModel.random(0, 5)
  table = np.array(model.table)
  table[:, 3] = np.nan
  poisoned = stubs.PrefixModel(table)

  def run(target, **kwargs):
    cache = lambda m: m.init_cache(2, beam_search.loop_utils.cache_length(6, 2))
    if not speculate:
      return beam_search.beam_search(target.step_fn, cache(target), beam_size=2,
                                     max_decode_len=6, **kwargs)
    return speculative_beam.speculative_beam_search(
        target.step_fn, cache(target), model.step_fn, cache(model), beam_size=2, draft_width=2,
        gamma=2, max_decode_len=6, **kwargs)

  assert np.asarray(run(poisoned).nonfinite).all()
  clean, unchecked = run(model), run(model, check_finite=False)
  assert not np.asarray(clean.nonfinite).any() and unchecked.nonfinite is None
  np.testing.assert_array_equal(clean.tokens, unchecked.tokens)
  np.testing.assert_array_equal(clean.scores, unchecked.scores)


@pytest.mark.parametrize('verification', ['token', 'block'])
def test_nan_in_q_rejects_the_drafts_instead_of_accepting_them(verification):
  batch, gamma, vocab = 64, 3, 5
  p = jax.nn.softmax(jax.random.normal(jax.random.key(1), (batch, gamma + 1, vocab)))
  drafts = jax.random.randint(jax.random.key(2), (batch, gamma), 0, vocab)
  keys = jax.random.split(jax.random.key(3), batch)
  q = jnp.full((batch, gamma, vocab), jnp.nan)
  n, token = speculative.accept_reject(keys, drafts, q, p, verification=verification)
  np.testing.assert_array_equal(n, 0)
  assert np.all((np.asarray(token) >= 0) & (np.asarray(token) < vocab))
  # NaN from the second draft on: at most the first is kept (token
  # verification keeps it as usual; block verification's stop weight at 1
  # reads q_2 and never stops there).
  q = jnp.full((batch, gamma, vocab), 1.0 / vocab).at[:, 1:].set(jnp.nan)
  n, _ = speculative.accept_reject(keys, drafts, q, p, verification=verification)
  assert np.asarray(n).max() == (1 if verification == 'token' else 0)


def test_all_padding_input_row_is_rejected_naming_the_row():
  inputs = _inputs(batch=3)
  inputs[1] = 0
  match = r'encoder_input_tokens row 1 is all padding \(every id 0\)'
  with pytest.raises(ValueError, match=match):
    models.generate(UNLOADED, inputs, jax.random.key(0), max_decode_len=4)
  with pytest.raises(ValueError, match=match):
    models.speculative_generate(UNLOADED, UNLOADED, inputs, jax.random.key(0), gamma=2,
                                max_decode_len=4)
  with pytest.raises(ValueError, match=match):
    models.beam_generate(UNLOADED, inputs, beam_size=2, max_decode_len=4)


def test_lists_are_taken_as_arrays_and_ragged_or_other_types_are_named():
  model = stubs.TableModel.random(0, 6)
  run = lambda prompt: decoding.autoregressive_decode(
      model.step_fn, model.init_cache(2, 7), max_decode_len=6, rng=jax.random.key(0),
      prompt=prompt)
  np.testing.assert_array_equal(run([[3, 4], [5, 0]]).tokens,
                                run(np.array([[3, 4], [5, 0]], np.int32)).tokens)
  with pytest.raises(ValueError, match='prompt must be rectangular, every row of one length'):
    run([[3, 4], [5]])
  with pytest.raises(ValueError, match='prompt must hold integer token ids, got float'):
    run([[3.5, 4.0], [5.0, 1.0]])
  for inputs in ([[3, 4, 5], [6]], 'a b c', 7):
    error = ValueError if isinstance(inputs, list) else TypeError
    with pytest.raises(error, match='encoder_input_tokens must be'):
      models.generate(UNLOADED, inputs, jax.random.key(0), max_decode_len=4)
  with pytest.raises(ValueError, match=r'encoder_input_tokens must be integer token ids \[B, S\]'):
    models.beam_generate(UNLOADED, [[1.5, 2.0]], beam_size=2, max_decode_len=4)
  encoded, prompt = checks.check_inputs([[3, 4, 0]], ([5, 6],), VOCAB)
  assert encoded.shape == (1, 3) and prompt.shape == (1, 2)


def test_per_row_sampling_of_another_batch_size_is_named():
  model = stubs.TableModel.random(0, 6)
  per_row = sampling_lib.SamplingParams.create(temperature=[1.0, 0.5, 0.0])
  kwargs = dict(max_decode_len=4, rng=jax.random.key(0))
  with pytest.raises(ValueError, match=r'sampling.temperature has shape \(3,\), but the inputs '
                     r'have 2 rows'):
    decoding.autoregressive_decode(model.step_fn, model.init_cache(2, 5), sampling=per_row,
                                   **kwargs)
  with pytest.raises(ValueError, match=r'draft_sampling.temperature has shape \(3,\)'):
    decoding.speculative_decode(model.step_fn, model.init_cache(2, 7), model.step_fn,
                                model.init_cache(2, 7), gamma=2, draft_sampling=per_row, **kwargs)
  with pytest.raises(ValueError, match=r'per-row knobs must have one length \(the batch size\), '
                     r"got \{'temperature': 3, 'top_k': 2\}"):
    sampling_lib.SamplingParams.create(temperature=[1.0, 0.5, 0.0], top_k=[1, 2])
  with pytest.raises(ValueError, match=r'top_p must be a scalar or \[B\]'):
    sampling_lib.SamplingParams.create(top_p=[[0.5]])


@pytest.mark.parametrize('knob', ['temperature', 'top_k', 'top_p'])
def test_string_or_bool_knobs_are_type_errors_naming_the_knob(knob):
  for value in ('0.7', ['0.7'], True, None):
    with pytest.raises(TypeError, match=f'{knob} must be a number or a sequence of numbers'):
      sampling_lib.SamplingParams.create(**{knob: value})


@pytest.mark.parametrize('verify_lengths', [3, '3', 3.0])
def test_verify_lengths_that_is_not_a_sequence_is_named(verify_lengths):
  with pytest.raises(ValueError, match=r'verify_lengths must be None or a sequence of integers in '
                     r'2..gamma \+ 1 = 4'):
    models.speculative_generate(UNLOADED, UNLOADED, _inputs(), jax.random.key(0), gamma=3,
                                max_decode_len=4, verify_lengths=verify_lengths)
  model = stubs.TableModel.random(0, 6)
  with pytest.raises(ValueError, match='verify_lengths must be None or a sequence'):
    decoding.speculative_decode(model.step_fn, model.init_cache(2, 8), model.step_fn,
                                model.init_cache(2, 8), gamma=3, max_decode_len=4,
                                rng=jax.random.key(0), verify_lengths=verify_lengths)


def test_minus_inf_masks_pass_the_default_check_but_a_fully_masked_position_does_not():
  logits = jnp.array([[[0.0, -jnp.inf, 1.0]], [[-jnp.inf] * 3], [[0.0, jnp.inf, 1.0]],
                      [[0.0, jnp.nan, 1.0]]])  # [B=4, K=1, V=3]
  np.testing.assert_array_equal(decoding.loop_utils.nonfinite_rows(logits),
                                [False, True, True, True])
  model = stubs.TableModel.random(0, 6, banned=0.3)  # -inf logits, some support everywhere
  out = decoding.autoregressive_decode(model.step_fn, model.init_cache(4, 7), max_decode_len=6,
                                       rng=jax.random.key(0),
                                       sampling=sampling_lib.SamplingParams.create(1.0))
  assert not np.asarray(out.nonfinite).any()
