"""Tests for spec_decode.harness.loop_costs with a tiny random T5 model (fp32)."""

import jax
import numpy as np
import pytest

from spec_decode.harness import loop_costs
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.t5 import t5_1_1
from spec_decode import theory

VOCAB = 64
GREEDY = sampling_lib.SamplingParams.create(0.0)


@pytest.fixture(scope='module')
def target():
  return models.T5Model.random(t5_1_1('tiny', vocab_size=VOCAB), jax.random.key(0))


def test_loop_costs_count_iterations_and_tokens(target):
  inputs = np.random.default_rng(0).integers(2, VOCAB, (2, 8)).astype(np.int32)
  loop = loop_costs.measure_loop_costs(
      {'speculative': loop_costs.speculative(target, target, 2, GREEDY)}, inputs,
      jax.random.key(0), lengths=(3, 9), repeats=2)
  # No EOS: every row runs to L = 9. A draft equal to the target has every draft
  # accepted: gamma + 1 = 3 tokens an iteration, 3 iterations.
  assert loop['speculative'].tokens_per_iteration == pytest.approx(3.0)
  assert np.isfinite([loop['speculative'].fixed_s, loop['speculative'].iteration_s]).all()


def test_iteration_speedup_is_eq1_over_iteration_costs():
  base = loop_costs.LoopCost(fixed_s=0.01, iteration_s=0.002, tokens_per_iteration=1.0)
  spec = loop_costs.LoopCost(fixed_s=0.012, iteration_s=0.004, tokens_per_iteration=2.5)
  expected = theory.expected_tokens(0.8, 3) * 0.002 / 0.004
  assert loop_costs.iteration_speedup(0.8, 3, base, spec) == pytest.approx(expected)


def test_loop_costs_need_two_lengths():
  with pytest.raises(ValueError, match='lengths'):
    loop_costs.measure_loop_costs({}, np.zeros((1, 4), np.int32), jax.random.key(0), lengths=(5, 5))


def test_start_times_alone_and_in_one_program(target):
  inputs = np.ones((2, 8), np.int32)
  seconds = loop_costs.start_times(target, target, inputs, capacity=8, repeats=2)
  assert all(seconds[name] > 0 for name in ('target', 'draft', 'both'))
  assert seconds['draft_in_program'] == seconds['both'] - seconds['target']
