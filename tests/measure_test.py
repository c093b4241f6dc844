"""Tests for spec_decode.harness (alpha, step costs, walltime) with tiny random T5 models (fp32)."""

import dataclasses
import json
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode.models import alpha as alpha_lib
from spec_decode.models import drafts
from spec_decode.harness import loading
from spec_decode.harness import loop_costs
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.t5 import t5_1_1
from spec_decode import theory

VOCAB, ENCODER_LEN, MAX_DECODE_LEN = 64, 8, 16
GREEDY = sampling_lib.SamplingParams.create(0.0)
SAMPLED = sampling_lib.SamplingParams.create(1.0)


def _noisy_copy(model: models.T5Model, scale: float, seed: int) -> models.T5Model:
  """The same network with perturbed weights: a draft that often agrees."""
  leaves, treedef = jax.tree.flatten(model.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return model.replace(params=jax.tree.unflatten(treedef, noisy))


@pytest.fixture(scope='module')
def target():
  return models.T5Model.random(t5_1_1('tiny', vocab_size=VOCAB), jax.random.key(0))


@pytest.fixture(scope='module')
def draft(target):
  return _noisy_copy(target, 0.3, seed=1)


@pytest.fixture(scope='module')
def inputs():
  tokens = np.random.default_rng(0).integers(2, VOCAB, (32, ENCODER_LEN)).astype(np.int32)
  tokens[::3, 5:] = 0  # some padding
  return tokens


def _generate(target, inputs, sampling, n=8):
  return alpha_lib.generate_sequences(target, inputs[:n], sampling=sampling,
                                       max_decode_len=MAX_DECODE_LEN, rng=jax.random.key(0),
                                       batch_size=4)


@pytest.mark.parametrize('sampling', [GREEDY, SAMPLED])
def test_draft_equal_to_target_has_alpha_one(target, inputs, sampling):
  tokens, lengths = _generate(target, inputs, sampling)
  stats = alpha_lib.measure_alpha(target, target, inputs[:8], tokens, lengths, sampling=sampling,
                                   batch_size=4)
  assert stats.alpha == pytest.approx(1.0, abs=1e-5)
  assert stats.positions == lengths.sum() and len(stats.sequence_alpha) == 8


def test_greedy_beta_is_argmax_agreement(target, draft, inputs):
  tokens, lengths = _generate(target, inputs, GREEDY)
  beta = np.asarray(alpha_lib.betas(target, draft, models.Batch(jnp.asarray(inputs[:8])), jnp.asarray(tokens),
                                     GREEDY))
  decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  p_argmax, q_argmax = (
      np.argmax(alpha_lib.teacher_forced_logits(m, models.Batch(inputs[:8]), decoder_inputs), -1)
      for m in (target, draft))
  valid = np.arange(MAX_DECODE_LEN)[None, :] < lengths[:, None]
  # The teacher-forced pass is aligned with decoding: its argmax is the greedy output.
  np.testing.assert_array_equal(p_argmax[valid], tokens[valid])
  np.testing.assert_array_equal(beta[valid], (q_argmax == tokens)[valid].astype(np.float32))
  assert 0 < beta[valid].mean() < 1  # both outcomes occur


def test_alpha_matches_the_engines_acceptance_rate(target, draft, inputs):
  """gamma = 1: each iteration accepts its one draft with probability beta."""
  tokens, lengths = _generate(target, inputs, SAMPLED, n=32)
  stats = alpha_lib.measure_alpha(target, draft, inputs, tokens, lengths, sampling=SAMPLED,
                                   batch_size=16)
  out = models.speculative_generate(target, draft, inputs, jax.random.key(1), gamma=1,
                                    max_decode_len=MAX_DECODE_LEN, sampling=SAMPLED)
  rejected, accepted = np.asarray(out.accept_histogram)
  rate = accepted / (accepted + rejected)
  stderr = np.hypot(stats.stderr, np.sqrt(rate * (1 - rate) / (accepted + rejected)))
  assert abs(rate - stats.alpha) < 4 * stderr, (rate, stats.alpha, stderr)
  assert 0.2 < stats.alpha < 0.98  # a draft that is neither useless nor perfect


NUCLEUS = sampling_lib.SamplingParams.create(1.0, top_p=0.3)


def test_betas_with_the_drafts_own_knobs(target, draft, inputs):
  tokens, _ = _generate(target, inputs, NUCLEUS)
  decoder_inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))
  p, q = (sampling_lib.adjust(alpha_lib.teacher_forced_logits(m, models.Batch(inputs[:8]), decoder_inputs), s)
          for m, s in ((target, NUCLEUS), (draft, NUCLEUS.untruncated())))
  untruncated = alpha_lib.betas(target, draft, models.Batch(jnp.asarray(inputs[:8])), jnp.asarray(tokens),
                                 NUCLEUS, NUCLEUS.untruncated())
  np.testing.assert_allclose(untruncated, np.sum(np.minimum(p, q), -1), rtol=1e-5, atol=1e-6)
  same = alpha_lib.betas(target, draft, models.Batch(jnp.asarray(inputs[:8])), jnp.asarray(tokens), NUCLEUS)
  assert not np.allclose(untruncated, same)  # the knobs reach q


def test_alpha_of_an_untruncated_draft_matches_the_engines_acceptance_rate(target, draft, inputs):
  """As above, with p truncated to its nucleus and q not (false-positive rate ~6e-5).

  A narrow nucleus (top_p 0.3) makes the truncated q's alpha far from the untruncated
  one's (0.37 against 0.24 here), and four runs of the engine make the test see it: it
  failed with q's knobs dropped by hand in `measure_alpha` or in `speculative_generate`.
  """
  tokens, lengths = _generate(target, inputs, NUCLEUS, n=32)
  stats = alpha_lib.measure_alpha(target, draft, inputs, tokens, lengths, sampling=NUCLEUS,
                                   batch_size=16, draft_sampling=NUCLEUS.untruncated())
  histograms = [models.speculative_generate(
      target, draft, inputs, jax.random.key(seed), gamma=1, max_decode_len=MAX_DECODE_LEN,
      sampling=NUCLEUS, draft_sampling=NUCLEUS.untruncated()).accept_histogram
                for seed in range(1, 5)]
  rejected, accepted = np.sum(histograms, axis=0)
  rate = accepted / (accepted + rejected)
  stderr = np.hypot(stats.stderr, np.sqrt(rate * (1 - rate) / (accepted + rejected)))
  assert abs(rate - stats.alpha) < 4 * stderr, (rate, stats.alpha, stderr)


def test_alpha_stats_from_betas():
  betas = np.array([[1.0, 0.0, 0.7], [1.0, 1.0, 1.0], [0.5, 0.3, 0.2]])
  stats = alpha_lib.AlphaStats.from_betas(betas, np.array([2, 3, 1]))
  assert stats.alpha == pytest.approx(4.5 / 6)
  np.testing.assert_allclose(stats.sequence_alpha, [0.5, 1.0, 0.5])
  assert stats.positions == 6 and stats.stderr > 0
  row = stats.row()
  assert row['q50'] == 0.5 and row['sequences'] == 3


def test_target_token_stream_is_cached(tmp_path):
  stream = loading.target_token_stream('demo_ende', limit=20, cache_dir=tmp_path)
  assert stream.dtype == np.int32 and stream[-1] == loading.EOS_ID
  assert np.sum(stream == loading.EOS_ID) == 20 and np.all(stream != 0)
  assert len(list(tmp_path.iterdir())) == 1
  np.testing.assert_array_equal(
      loading.target_token_stream('demo_ende', limit=20, cache_dir=tmp_path), stream)


def test_encode_texts_and_detokenize():
  texts = ['translate English to German: A dog runs.', 'Hello']
  tokens = loading.encode_texts(texts, max_input_len=64)
  assert tokens.shape[0] == 2 and tokens.shape[1] % 16 == 0
  for text, row in zip(texts, tokens):
    ids = row[row > 0].tolist()
    assert ids[-1] == loading.EOS_ID
    assert loading.detokenize(ids + [7, 8]) == text  # cut at EOS
  assert loading.encode_texts(texts, max_input_len=4)[0, 3] == loading.EOS_ID  # truncated


def test_trim_padding_keeps_the_input_and_its_bucket():
  row = np.array([5, 6, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0], np.int32)
  np.testing.assert_array_equal(loading.trim_padding(row, 8), row[:8])
  np.testing.assert_array_equal(loading.trim_padding(row, 3), row[:6])  # buckets 3, 6, 12
  np.testing.assert_array_equal(loading.trim_padding(row, 1), row[:4])  # exactly full
  np.testing.assert_array_equal(loading.trim_padding(row, 16), row)  # never longer than S
  np.testing.assert_array_equal(loading.trim_padding(np.zeros(8, np.int32), 4), np.zeros(4))
  inner = np.array([5, 0, 7, 1, 0, 0, 0, 0], np.int32)  # an interior 0 is not padding
  np.testing.assert_array_equal(loading.trim_padding(inner, 2), inner[:4])
  lengths = {len(loading.trim_padding(np.arange(256) < n, 16)) for n in range(1, 257)}
  assert lengths == {16, 32, 64, 128, 256}  # five compiled shapes for inputs of up to 256
  with pytest.raises(ValueError, match='smallest'):
    loading.trim_padding(row, 0)
  with pytest.raises(ValueError, match='one input'):
    loading.trim_padding(row[None], 4)


def test_fixed_cost_is_fit_per_input_length():
  iterations = np.array([4, 8, 12, 5, 10, 20])
  lengths = np.array([16, 16, 16, 32, 32, 32])
  fixed = np.where(lengths == 16, 0.002, 0.006)
  decoded = walltime.Decoded(seconds=fixed + 0.001 * iterations, tokens=[[1]] * 6,
                             iterations=iterations, draft_calls=np.zeros(6),
                             accept_histogram=np.ones(1), input_lengths=lengths)
  assert decoded.fixed_s() == pytest.approx(0.004)
  # One line through all of them would put part of the longer inputs' cost in the slope.
  one_line = dataclasses.replace(decoded, input_lengths=None).fixed_s()
  assert one_line == pytest.approx(np.polyfit(iterations, decoded.seconds, 1)[1])
  assert abs(one_line - 0.004) > 5e-4
  assert dataclasses.replace(decoded, iterations=np.full(6, 7)).fixed_s() == 0.0  # no slope


def test_parse_config(tmp_path):
  assert loading.parse_config('nano').vocab_size == 8192
  assert loading.parse_config('nano', dtype='bfloat16').dtype == 'bfloat16'
  path = tmp_path / 'model.json'
  fields = dict(vocab_size=128, emb_dim=8, num_heads=2, num_encoder_layers=1,
                num_decoder_layers=1, head_dim=4, mlp_dim=16)
  path.write_text(json.dumps(fields))
  assert loading.parse_config(str(path)).emb_dim == 8


def test_step_times_are_positive_and_shaped(target, inputs):
  nano = models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(2))
  times = step_costs.measure_step_times(target, nano, inputs[:1], k_max=3,
                                        max_decode_len=MAX_DECODE_LEN, num_steps=4, repeats=2)
  assert times.verify_s.shape == (3,) and np.all(np.isfinite(times.verify_s))
  assert np.all(times.verify_s > 0) and times.draft_s > 0
  assert times.draft_first_s >= 0 and np.isfinite(times.c) and np.isfinite(times.c_first)
  assert times.r[0] == 1.0 and len(times.row()['r']) == 3
  assert np.all(np.diff(times.verify_s) >= 0) and times.verify_measured_s.shape == (3,)
  rounds = step_costs.StepCostRounds(target, nano, inputs[:1], k_max=2,
                                     max_decode_len=MAX_DECODE_LEN, num_steps=4)
  with pytest.raises(ValueError, match='no round timed yet'):
    rounds.times()
  rounds.round()
  assert rounds.times().verify_measured_s.shape == (2,) and rounds.times().iteration_s == {}
  rounds.add_iterations([1])  # gamma 1: one draft step, then the verify call over 2
  rounds.round()
  times = rounds.times()
  assert list(times.iteration_s) == [1] and times.iteration_s[1] > 0
  assert times.iteration_cost(1) == times.iteration_s[1] / times.target_s
  assert times.iteration_cost(2) is None and times.row()['iteration_cost'] == {
      '1': times.iteration_cost(1)}
  with pytest.raises(ValueError, match='gamma must be in 1..1'):
    rounds.add_iterations([2])  # its verify call (K = 3) exceeds k_max
  length = inputs.shape[1]
  rounds.add_starts([inputs[:1], inputs[1:2, :5], inputs[2:3, :5]])  # two lengths
  rounds.round()
  times = rounds.times()
  assert sorted(times.target_start_s) == sorted(times.both_start_s) == sorted({5, length})
  assert all(t > 0 for t in [*times.target_start_s.values(), *times.both_start_s.values()])
  assert times.row()['target_start_ms'] == {str(n): 1e3 * t
                                            for n, t in times.target_start_s.items()}
  assert list(times.iteration_s) == [1]  # the starts are not iterations
  rounds.clear()
  with pytest.raises(ValueError, match='no round timed yet'):
    rounds.times()
  table = drafts.TableDraft.estimate(np.arange(1, VOCAB), VOCAB, order=2)
  seconds = step_costs.step_time(table, inputs[:1], k=2, capacity=8, position=3, num_steps=4,
                                 repeats=2)
  assert np.isfinite(seconds) and seconds > 0


def test_time_decoding_and_summary(target, draft, inputs):
  decoders = {
      'baseline': walltime.baseline_decoder(target, max_decode_len=MAX_DECODE_LEN,
                                            sampling=GREEDY),
      'speculative': walltime.speculative_decoder(target, draft, gamma=2,
                                                  max_decode_len=MAX_DECODE_LEN, sampling=GREEDY),
  }
  decoded = walltime.time_decoding(decoders, inputs[:3], jax.random.key(0), repeats=2)
  baseline, speculative = decoded['baseline'], decoded['speculative']
  assert baseline.seconds.shape == (3,) and np.all(baseline.seconds > 0)
  assert speculative.tokens == baseline.tokens  # greedy: identical outputs
  assert speculative.accept_histogram.shape == (3,)
  assert baseline.tokens_per_call == 1.0 and speculative.tokens_per_call >= 1.0
  # Inputs cut to their own buckets (row 0 to 5 of 8 tokens) decode as the full rows, and
  # each decoder meets every shape (compiles) before the timed calls.
  calls = []
  logged = {name: (lambda x, key, name=name: calls.append((name, x.shape)) or decode(x, key))
            for name, decode in decoders.items()}
  cut = walltime.time_decoding(logged, inputs[:3], jax.random.key(0), repeats=1,
                               smallest_bucket=5)
  assert cut['baseline'].tokens == cut['speculative'].tokens == baseline.tokens
  assert cut['baseline'].input_lengths.tolist() == [5, 8, 8]
  assert calls[:4] == [(name, shape) for name in decoders for shape in ((1, 5), (1, 8))]
  assert len(calls) == 4 + 2 * 3

  times = step_costs.StepTimes(draft_s=5e-5, draft_first_s=1e-4,
                               verify_measured_s=np.array([1e-3, 1.1e-3, 1.2e-3]))
  row = walltime.summarize(baseline, speculative, gamma=2, alpha=0.6, times=times)
  assert row['identical'] == 1.0
  assert row['measured_speedup'] == pytest.approx(baseline.total_s / speculative.total_s)  # greedy
  assert row['predicted_speedup'] == pytest.approx(
      theory.expected_tokens(0.6, 2) / (0.1 + 0.05 + 1.2))
  lengths = [len(t) for t in speculative.tokens]
  assert row['output_lengths'] == lengths
  assert row['predicted_finite_speedup'] == pytest.approx(
      sum(lengths) / sum(theory.expected_calls(0.6, 2, lengths)) / (0.1 + 0.05 + 1.2))
  assert row['finite_tokens_per_call'] < row['expected_tokens_per_call']
  assert row['other_ms'] == pytest.approx(
      row['iteration_ms'] - row['draft_ms'] - row['verify_ms'] - row['fixed_ms'])
  assert all(np.isfinite(v) for v in row.values() if isinstance(v, float))
  assert 'positional_tokens_per_call' not in row and 'iteration_cost' not in row
  whole = dataclasses.replace(times, iteration_s={2: 1.5e-3})  # i(2) = 1.5 target steps
  row = walltime.summarize(baseline, speculative, gamma=2, alpha=0.6, times=whole)
  assert row['iteration_cost'] == pytest.approx(1.5)
  assert row['predicted_iteration_speedup'] == pytest.approx(theory.expected_tokens(0.6, 2) / 1.5)

  # Whole decodes: each input's start at its length (the cut run's 5, 8, 8), then its loop.
  assert 'predicted_decode_speedup' not in row
  starts = dataclasses.replace(times, target_start_s={5: 2e-3, 8: 3e-3},
                               both_start_s={5: 2.5e-3, 8: 4e-3})
  row = walltime.summarize(cut['baseline'], cut['speculative'], gamma=2, alpha=0.6, times=starts)
  lengths = [len(t) for t in cut['speculative'].tokens]
  assert row['predicted_decode_speedup'] == pytest.approx(
      (2 + 3 + 3 + sum(lengths))
      / (2.5 + 4 + 4 + (0.1 + 0.05 + 1.2) * sum(theory.expected_calls(0.6, 2, lengths))))
  assert 'predicted_decode_iteration_speedup' not in row
  row = walltime.summarize(cut['baseline'], cut['speculative'], gamma=2, alpha=0.6,
                           times=dataclasses.replace(starts, iteration_s={2: 1.5e-3}))
  assert row['predicted_decode_iteration_speedup'] == pytest.approx(
      (2 + 3 + 3 + sum(lengths))
      / (2.5 + 4 + 4 + 1.5 * sum(theory.expected_calls(0.6, 2, lengths))))
  missing = dataclasses.replace(starts, target_start_s={8: 3e-3}, both_start_s={8: 4e-3})
  assert 'predicted_decode_speedup' not in walltime.summarize(
      cut['baseline'], cut['speculative'], gamma=2, alpha=0.6, times=missing)
  with pytest.raises(ValueError, match='one array per input: 2 for 3 inputs'):
    walltime.summarize(cut['baseline'], cut['speculative'], gamma=2, alpha=0.6, times=starts,
                       betas=[np.ones(3), np.ones(2)])

  # At temperature 0 the betas (0 or 1) along the target's outputs give the loop's
  # tokens per call exactly.
  tokens, lengths = alpha_lib.generate_sequences(target, inputs[:3], sampling=GREEDY,
                                                  max_decode_len=MAX_DECODE_LEN,
                                                  rng=jax.random.key(0))
  stats = alpha_lib.measure_alpha(target, draft, inputs[:3], tokens, lengths, sampling=GREEDY)
  assert [b.tolist() for b in stats.betas] == [
      [float(t == u) for t, u in zip(out, draft_out)] for out, draft_out in zip(
          baseline.tokens, _greedy_predictions(target, draft, inputs[:3], tokens))]
  row = walltime.summarize(baseline, speculative, gamma=2, alpha=stats.alpha, times=times,
                           betas=stats.betas)
  assert row['positional_tokens_per_call'] == pytest.approx(speculative.tokens_per_call)
  assert row['predicted_positional_speedup'] == pytest.approx(
      theory.positional_walltime_improvement(stats.betas, 2, times.c, times.r, times.c_first))
  row = walltime.summarize(baseline, speculative, gamma=2, alpha=stats.alpha, times=whole,
                           betas=stats.betas)
  assert row['predicted_positional_iteration_speedup'] == pytest.approx(
      theory.positional_walltime_improvement(stats.betas, 2, times.c, iteration_cost=1.5))


def test_decode_speedup_between_the_starts_and_the_loops():
  tokens, calls = [10, 30], [4.0, 12.0]
  # No fixed cost: the loops' speedup, tokens over calls x cost.
  assert walltime.decode_speedup(tokens, calls, 1.6, [0, 0], [0, 0]) == pytest.approx(
      40 / (16 * 1.6))
  assert walltime.decode_speedup(tokens, calls, 1.6, [5, 7], [6, 9]) == pytest.approx(
      (12 + 40) / (15 + 16 * 1.6))
  # Outputs short against the starts: the starts' ratio.
  assert walltime.decode_speedup([1], [1.0], 1.6, [1e6], [2e6]) == pytest.approx(0.5, rel=1e-5)


def _greedy_predictions(target, draft, inputs, tokens):
  """The draft's argmax at each position of the target's outputs (teacher-forced)."""
  decoder_inputs = jnp.pad(jnp.asarray(tokens)[:, :-1], ((0, 0), (1, 0)))
  logits = alpha_lib.teacher_forced_logits(draft, models.Batch(jnp.asarray(inputs)), decoder_inputs)
  return np.asarray(jnp.argmax(logits, axis=-1)).tolist()


def test_nondecreasing_fit_pools_dips_and_keeps_monotone_input():
  np.testing.assert_allclose(timing.nondecreasing_fit([1.0, 1.4, 1.2, 1.5, 1.3, 1.1, 2.0]),
                             [1.0, 1.3, 1.3, 1.3, 1.3, 1.3, 2.0])
  np.testing.assert_allclose(timing.nondecreasing_fit([1.0, 1.1, 1.1, 1.7]),
                             [1.0, 1.1, 1.1, 1.7])
  np.testing.assert_allclose(timing.nondecreasing_fit([1.2, 1.0]), [1.1, 1.1])


def _decoded(iterations, seconds, draft_calls=None):
  n = len(iterations)
  draft_calls = np.zeros(n, int) if draft_calls is None else draft_calls
  return walltime.Decoded(seconds=np.asarray(seconds, float), tokens=[[5]] * n,
                          iterations=np.asarray(iterations), draft_calls=draft_calls,
                          accept_histogram=np.zeros(1, int))


def test_fixed_cost_is_the_intercept_and_the_loop_speedup_excludes_it():
  iterations = np.array([4, 10, 7, 20])
  baseline = _decoded(3 * iterations, 0.010 + 0.002 * 3 * iterations)  # 10 ms + 2 ms/token
  speculative = _decoded(iterations, 0.015 + 0.003 * iterations,  # 15 ms + 3 ms/iteration
                         draft_calls=iterations)  # gamma 1
  assert baseline.fixed_s() == pytest.approx(0.010)
  assert speculative.fixed_s() == pytest.approx(0.015)
  times = step_costs.StepTimes(draft_s=1e-4, draft_first_s=2e-4,
                               verify_measured_s=np.array([2e-3, 2.4e-3]))
  row = walltime.summarize(baseline, speculative, gamma=1, alpha=0.7, times=times)
  assert row['loop_speedup'] == pytest.approx(2.0)  # 6 ms of baseline per 3 ms iteration
  assert row['measured_speedup'] < row['loop_speedup']  # fixed costs dilute the speedup
  assert row['fixed_ms'] == pytest.approx(1e3 * 0.015 * 4 / np.sum(iterations))
  assert row['other_ms'] == pytest.approx(3.0 - 0.2 - 2.4)
  # The baseline's 2 ms iterations against the 1 ms step timed earlier: the machine ran 2x
  # slower, and at that speed the parts take 2 x 2.6 ms of the 3 ms iteration.
  times = dataclasses.replace(times, verify_measured_s=np.array([1e-3, 1.2e-3]))
  row = walltime.summarize(baseline, speculative, gamma=1, alpha=0.7, times=times)
  assert row['baseline_iteration_ms'] == pytest.approx(2.0)
  assert row['slowdown'] == pytest.approx(2.0)
  assert row['scaled_other_ms'] == pytest.approx(3.0 - 2.0 * (0.2 + 1.2))
  assert _decoded([5, 5], [0.1, 0.2]).fixed_s() == 0.0  # no line through one abscissa


def test_measured_speedup_is_per_generated_token():
  # Sampled, the speculative outputs here are shorter: 8 tokens against 10 per input at the
  # same cost per token. A ratio of total times would call that 1.25X.
  def decoded(tokens, seconds):
    return walltime.Decoded(seconds=np.asarray(seconds), tokens=[[5] * t for t in tokens],
                            iterations=np.asarray(tokens), draft_calls=np.asarray(tokens),
                            accept_histogram=np.zeros(2, int))
  baseline = decoded([10, 10, 20], [0.10, 0.10, 0.20])  # 10 ms per token, no fixed cost
  speculative = decoded([8, 8, 16], [0.08, 0.08, 0.16])
  times = step_costs.StepTimes(draft_s=1e-4, draft_first_s=2e-4,
                               verify_measured_s=np.array([2e-3, 2.4e-3]))
  row = walltime.summarize(baseline, speculative, gamma=1, alpha=0.7, times=times)
  assert row['measured_speedup'] == pytest.approx(1.0)
  assert row['loop_speedup'] == pytest.approx(1.0)
  assert np.isnan(row['loop_alpha'])  # an all-zero accept histogram tested nothing
  with pytest.raises(ValueError, match='no tokens to time'):
    walltime.summarize(baseline, decoded([0, 0, 0], [0.01, 0.01, 0.01]), gamma=1, alpha=0.7,
                       times=times)


def _fake_t5x(monkeypatch):
  """A stand-in `t5x.decoding` with T5X's greedy `temperature_sample` contract.

  t5x is not installable here; this checks our adapter's side of the contract
  (DecodingState.cur_token [B, 1] and .cache in, (logits [B, V], cache) out,
  decodes [B, num_decodes, L] 0-padded after EOS), not T5X itself.
  """
  def temperature_sample(inputs, cache, tokens_to_logits, eos_id, decode_rng, num_decodes,
                         temperature, topk, topp):
    del decode_rng, num_decodes, temperature, topk, topp
    batch, length = inputs.shape

    def body(i, carry):
      decodes, token, cache, ended = carry
      logits, cache = tokens_to_logits(types.SimpleNamespace(cur_token=token, cache=cache))
      token = jnp.where(ended, 0, jnp.argmax(logits, axis=-1)).astype(jnp.int32)
      return (decodes.at[:, i].set(token), token[:, None], cache, ended | (token == eos_id))

    init = (inputs, jnp.zeros((batch, 1), jnp.int32), cache, jnp.zeros((batch,), bool))
    decodes = jax.lax.fori_loop(0, length, body, init)[0]
    return decodes[:, None], jnp.zeros((batch, 1))

  package = types.ModuleType('t5x')
  package.decoding = types.SimpleNamespace(temperature_sample=temperature_sample)
  monkeypatch.setitem(sys.modules, 't5x', package)
  monkeypatch.setitem(sys.modules, 't5x.decoding', package.decoding)


def test_t5x_baseline_adapter_decodes_as_our_baseline(target, inputs, monkeypatch):
  _fake_t5x(monkeypatch)
  greedy = sampling_lib.SamplingParams.create()
  decoders = {
      'ours': walltime.baseline_decoder(target, max_decode_len=MAX_DECODE_LEN, sampling=greedy),
      't5x': walltime.t5x_baseline_decoder(target, max_decode_len=MAX_DECODE_LEN, sampling=greedy)}
  decoded = walltime.time_decoding(decoders, inputs[:2], jax.random.key(0), repeats=1)
  assert decoded['t5x'].tokens == decoded['ours'].tokens
  with pytest.raises(ValueError, match='top_k'):
    walltime.t5x_baseline_decoder(target, max_decode_len=MAX_DECODE_LEN,
                                  sampling=sampling_lib.SamplingParams.create(1.0, top_k=5))


def test_t5x_baseline_adapter_takes_the_weights_as_program_arguments(target, inputs, monkeypatch):
  # Closed over, the weights would be constants of T5X's program and not of
  # ours: XLA:CPU runs those differently, and the comparison would not be like for like.
  _fake_t5x(monkeypatch)
  decode = walltime.t5x_baseline_decoder(target, max_decode_len=MAX_DECODE_LEN,
                                         sampling=sampling_lib.SamplingParams.create())
  jaxpr = jax.make_jaxpr(decode)(jnp.asarray(inputs[:1]), jax.random.key(0)[None])
  (call,) = [e for e in jaxpr.eqns if e.primitive.name in ('jit', 'pjit')]
  assert len(call.invars) == len(jax.tree_util.tree_leaves(target)) + 2  # weights, inputs, keys


@pytest.mark.parametrize('gamma, temperature, knobs', [
    (0, 1.0, {}), (4, 0.0, {}), (0, 1.0, dict(top_p=0.9)),
    (2, 1.0, dict(top_k=5, logit_scale=8.0)), (2, 1.0, dict(top_p=0.9))])
def test_loop_work_time_runs_both_loops(gamma, temperature, knobs):
  seconds = loop_costs.loop_work_time(gamma=gamma, temperature=temperature, vocab_size=512,
                                      max_decode_len=16, repeats=2, **knobs)
  assert 0 < seconds < 1.0


def test_alpha_from_histogram():
  # gamma = 3: n accepted drafts tested min(n + 1, 3) of them.
  assert walltime.alpha_from_histogram([2, 1, 0, 3]) == pytest.approx(10 / 13)
  assert walltime.alpha_from_histogram([0, 5]) == 1.0
  assert np.isnan(walltime.alpha_from_histogram([0, 0, 0]))
