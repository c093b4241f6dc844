"""LoopOptions: the loops' static options checked once, and front ends that cannot drift apart."""

import dataclasses
import inspect

import jax
import pytest

from spec_decode import decoding
from spec_decode import models
from spec_decode.cli import infer
from spec_decode.t5 import t5_1_1

# What each front end takes besides its models, step functions and inputs.
NOT_KNOBS = {'target', 'draft', 'model', 'encoder_input_tokens', 'target_step_fn',
             'target_cache', 'draft_step_fn', 'draft_cache', 'step_fn', 'cache'}


def _knobs(function) -> set[str]:
  return set(inspect.signature(function).parameters) - NOT_KNOBS


def test_options_are_normalised_and_hashable():
  options = decoding.LoopOptions(16, 3, 'block', [2], eos_id=1)
  assert options.verify_lengths == (2, 4)
  assert options == decoding.LoopOptions(16, 3, 'block', (4, 2))
  assert hash(options) == hash(decoding.LoopOptions(16, 3, 'block', (4, 2)))
  with pytest.raises(dataclasses.FrozenInstanceError):
    options.gamma = 4  # pytype: disable=not-writable


@pytest.mark.parametrize('kwargs, message', [
    (dict(max_decode_len=0), 'max_decode_len must be an integer >= 1'),
    (dict(max_decode_len=8, gamma=-1), 'gamma must be an integer >= 0'),
    (dict(max_decode_len=8, gamma=2, verification='tree'), 'verification must be one of'),
    (dict(max_decode_len=8, verification='block'), 'the baseline \\(gamma 0\\) verifies nothing'),
    (dict(max_decode_len=8, gamma=2, verify_lengths=[5]), 'verify_lengths must be integers in'),
    (dict(max_decode_len=8, check_finite='yes'), 'check_finite must be True or False'),
    (dict(max_decode_len=2**31 - 2, gamma=4), 'max_decode_len \\+ gamma \\+ 2 must be at most'),
])
def test_bad_options_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    decoding.LoopOptions(**kwargs)


def test_equal_options_compile_once():
  model = models.T5Model.random(t5_1_1('nano', vocab_size=64), jax.random.key(0))
  inputs = jax.numpy.ones((2, 8), jax.numpy.int32)
  models.speculative_generate(model, model, inputs, 0, gamma=2, max_decode_len=6,
                              verify_lengths=[3, 2])
  compiled = models.front_ends._decode._cache_size()
  models.speculative_generate(model, model, inputs, 1, gamma=2, max_decode_len=6,
                              verify_lengths=(2,))
  assert models.front_ends._decode._cache_size() == compiled


def test_the_front_ends_take_the_same_knobs():
  speculative = _knobs(models.speculative_generate)
  assert _knobs(decoding.speculative_decode) <= speculative
  assert speculative - _knobs(decoding.speculative_decode) == {
      'inputs', 'lengths', 'allow_tokenizer_mismatch'}
  baseline = _knobs(models.generate)
  assert _knobs(decoding.autoregressive_decode) <= baseline
  assert baseline - _knobs(decoding.autoregressive_decode) == {'inputs', 'lengths'}
  assert {f.name for f in dataclasses.fields(decoding.LoopOptions)} <= speculative
  # The command line: every knob but the per-call ones, the samplings as their parts.
  cli = _knobs(infer.infer)
  assert speculative - {'inputs', 'lengths', 'rng', 'prompt', 'eos_id', 'sampling',
                        'draft_sampling', 'allow_tokenizer_mismatch'} <= cli
  assert {'temperature', 'top_k', 'top_p', 'draft_temperature', 'draft_top_k',
          'draft_top_p'} <= cli
