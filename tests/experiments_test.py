"""Tests for the harness experiments and the studies' sweeps with tiny random T5 models.

No timing assertions.
"""

import csv

import jax
import numpy as np
import pytest

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode.models import drafts
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import step_costs
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import theory
from spec_decode.t5 import t5_1_1
from tests import script_runner
from tests import tolerances

batch_sweep = script_runner.load('studies/batch_walltime.py')
beam_sweep = script_runner.load('studies/beam.py')
draft_length_sweep = script_runner.load('studies/draft_length.py')
lenience_sweep = script_runner.load('studies/lenience.py')
verification_sweep = script_runner.load('studies/verification.py')

VOCAB = 8192  # the bundled tokenizer's: the experiments read the bundled data
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


@pytest.fixture(scope='module')
def target():
  return models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(0))


def test_draft_provider_by_name(monkeypatch):
  monkeypatch.setattr(loading, 'target_token_stream',
                      lambda task, split, cache_dir=None: np.array([5, 6, 1, 5, 7, 1]))
  bigram = experiments.draft_provider('bigram', 8)
  assert isinstance(bigram, drafts.TableDraft) and bigram.order == 2
  assert bigram.logits(jax.numpy.arange(8)[None]).shape == (1, 8, 8)
  assert experiments.draft_provider('unigram', 8).log_probs.shape == (8,)
  assert isinstance(experiments.draft_provider('prompt_lookup', 8), drafts.PromptLookupDraft)
  assert experiments.draft_provider('uniform', 8).vocab_size == 8
  with pytest.raises(ValueError, match='unknown draft kind'):
    experiments.draft_provider('trigram', 8)


def test_lenience_experiment_writes_table_5(target, tmp_path):
  draft = models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(1))
  settings = lenience_sweep.LenienceSettings(n=2, lenience=(1.0, 0.3), gamma=2, max_input_len=32,
                                          max_decode_len=6, repeats=1)
  rows = lenience_sweep.lenience_experiment(target, draft, 'nano', settings)
  assert [r['lenience'] for r in rows] == [1.0, 0.3]
  assert [r['exact'] for r in rows] == [True, False]
  for row in rows:
    assert 0 <= row['alpha'] <= 1 and 1 <= row['tokens_per_call'] <= 3
    assert row['speedup'] > 0 and 'bleu_speculative' in row and len(row['accept_histogram']) == 3
  md, csv_path = lenience_sweep.write_report(tmp_path, rows, notes='`the command`')
  text = md.read_text()
  assert '`the command`' in text and 'no (not p)' in text and lenience_sweep.LENIENCE_CAVEAT in text
  assert text.count('\n| ') == 2 + len(rows)  # header, rule, one line per l
  with open(csv_path) as f:
    assert [float(r['lenience']) for r in csv.DictReader(f)] == [1.0, 0.3]
  with pytest.raises(ValueError, match='lenience values'):
    lenience_sweep.lenience_experiment(target, draft, 'nano',
                                    lenience_sweep.LenienceSettings(lenience=(1.0, 0.0)))


def test_ratio_stderr_by_hand():
  ratio, stderr = experiments.ratio_stderr(np.array([4, 6, 2]), np.array([2, 2, 2]))
  assert ratio == pytest.approx(2.0)
  # residuals t - 2c = 0, 2, -2: sqrt(8 / (3 * 2)) / mean(c) = sqrt(4 / 3) / 2.
  assert stderr == pytest.approx(np.sqrt(4 / 3) / 2)
  assert np.isnan(experiments.ratio_stderr(np.array([3]), np.array([1]))[1])


def test_verification_experiment_compares_token_and_block(target, tmp_path):
  draft = models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(1))
  settings = verification_sweep.VerificationSettings(
      n=3, seeds=2, timed_n=2, temperatures=(0.0,), gammas=(2,), max_input_len=32,
      max_decode_len=6, batch_size=2, repeats=1)
  rows = verification_sweep.verification_experiment(target, draft, 'nano', settings)
  assert [(r['temperature'], r['gamma']) for r in rows] == [(0.0, 2)]
  greedy = rows[0]  # one-hot p and q: both rules keep the same prefix
  assert greedy['identical'] == 1.0 and greedy['gain'] == 0.0
  for row in rows:
    for v in ('token', 'block'):
      assert 1 <= row[f'{v}_tokens_per_call'] <= 3 and row[f'{v}_stderr'] >= 0
      assert row[f'{v}_speedup'] > 0 and row[f'{v}_ms'] > 0
  md, csv_path, png = verification_sweep.write_report(tmp_path, rows, notes='`the command`')
  assert '`the command`' in md.read_text() and md.read_text().count('\n| ') == 2 + len(rows)
  assert png.read_bytes().startswith(PNG_MAGIC)
  with open(csv_path) as f:
    assert [int(r['gamma']) for r in csv.DictReader(f)] == [2]


def test_draft_length_experiment_compares_fixed_and_adaptive(target, tmp_path):
  draft = models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(1))
  settings = draft_length_sweep.DraftLengthSettings(
      n=2, temperatures=(0.0,), gammas=(2,), gamma_max=3, thresholds=(0.5,),
      verify_lengths=(2,), max_input_len=32, max_decode_len=6, repeats=1)
  rows = draft_length_sweep.draft_length_experiment(target, draft, 'nano', settings)
  assert [(r['kind'], r['gamma'], r['threshold'], r['verify_lengths']) for r in rows] == [
      ('fixed', 2, None, None), ('adaptive', 3, 0.0, None), ('adaptive', 3, 0.5, None),
      ('adaptive', 3, 0.5, (2, 4))]
  assert rows[1]['drafted_per_call'] == 3.0  # the control: threshold 0 never stops drafting
  for row in rows:
    assert row['identical'] == 1.0  # greedy: every decoder gives the baseline's outputs
    assert 1 <= row['tokens_per_call'] <= row['gamma'] + 1 and row['speedup'] > 0
    assert 1 <= row['drafted_per_call'] <= row['gamma']
    assert len(row['draft_histogram']) == row['gamma'] + 1
  assert rows[0]['drafted_per_call'] == 2.0
  (best,) = draft_length_sweep.summary(rows)
  assert best['best_adaptive'].startswith('adaptive <= 3, threshold 0.5')
  label = draft_length_sweep._label(rows[3])  # pylint: disable=protected-access
  assert label == 'adaptive <= 3, threshold 0.5, K in {2, 4}'
  md, _, png = draft_length_sweep.write_report(tmp_path, rows, notes='`the command`')
  assert 'best adaptive' in md.read_text() and png.read_bytes().startswith(PNG_MAGIC)


def test_batch_walltime_experiment_with_prompt_lookup(target, tmp_path):
  settings = batch_sweep.BatchSettings(n=4, batch_sizes=(1, 4), temperatures=(0.0,), gamma=2,
                                       max_input_len=32, max_decode_len=6, repeats=1)
  rows = batch_sweep.batch_walltime_experiment(target, drafts.PromptLookupDraft(VOCAB),
                                               'prompt_lookup', settings)
  assert [r['batch_size'] for r in rows] == [1, 4]
  for row in rows:
    assert row['identical']  # greedy speculation equals the baseline in batches too
    assert row['baseline_tokens_per_s'] > 0 and row['speculative_tokens_per_s'] > 0
    assert 0 < row['speculative_utilisation'] <= 1 and row['tokens_per_call'] >= 1
  assert rows[0]['speculative_utilisation'] == 1.0  # batch 1 never waits for another row
  md, csv_path, png = batch_sweep.write_report(tmp_path, rows, notes='`the command`')
  assert png.read_bytes()[:8] == PNG_MAGIC
  assert '`the command`' in md.read_text() and '| 4 |' in md.read_text()
  with open(csv_path) as f:
    assert len(list(csv.DictReader(f))) == 2
  with pytest.raises(ValueError, match='must divide n=4'):
    batch_sweep.batch_walltime_experiment(
        target, drafts.UniformDraft(VOCAB), 'uniform',
        batch_sweep.BatchSettings(n=4, batch_sizes=(1, 3)))


def test_break_even():
  rows = [dict(temperature=t, batch_size=b, speedup=s)
          for t, b, s in [(0.0, 1, 1.8), (0.0, 2, 1.2), (0.0, 4, 0.9), (0.0, 8, 0.7),
                          (1.0, 1, 1.5), (1.0, 2, 1.1), (0.5, 1, 0.9)]]
  text = batch_sweep.break_even(rows)
  assert 'T = 0: speculation pays at batch 1, 2 and is slower at batch 4, 8' in text
  assert 'T = 1: speculation pays at every batch size tried (1, 2)' in text
  assert 'T = 0.5: speculation is slower than the baseline at every batch size tried (1)' in text


def test_walltime_experiment_times_a_draft_provider(target):
  settings = experiments.WalltimeSettings(n=2, temperatures=(0.0,), gamma_max=1, gammas=(),
                                          max_input_len=32, max_decode_len=6, batch_size=2,
                                          repeats=1, num_steps=2)
  alpha_rows, walltime_rows, timing = experiments.walltime_experiment(
      target, drafts.PromptLookupDraft(VOCAB), 'prompt_lookup', settings)
  assert alpha_rows[0]['draft'] == 'prompt_lookup' and 0 <= alpha_rows[0]['alpha'] <= 1
  assert walltime_rows[0]['gamma'] == 1 and walltime_rows[0]['identical'] == 1.0
  # Timings are noise at these sizes (a loaded CI machine has measured c > 1): check only form.
  assert timing['c'] >= 0 and len(timing['r']) == 2 and timing['r'][0] == 1.0


def test_walltime_experiment_picks_gamma_along_the_outputs(target, monkeypatch):
  # Outputs of easy pairs then a hard token: at gamma 2 every call sweeps the pair and the
  # target's bonus token covers the hard one; eq. (5) at their mean (2/3) would draft 4.
  times = step_costs.StepTimes(draft_s=5e-5, draft_first_s=1e-4,
                               verify_measured_s=np.array([1.0, 1.05, 1.1, 1.15, 1.2]) * 1e-3)
  stats = alpha_lib.AlphaStats.from_betas(np.tile([1.0, 1, 0], (2, 10)), np.array([30, 30]))
  monkeypatch.setattr(step_costs, 'StepCostRounds', _fixed_rounds(times, times, []))
  monkeypatch.setattr(alpha_lib, 'measure_alpha', lambda *args, **kwargs: stats)
  assert int(theory.best_gamma(stats.alpha, times.c, 4, times.r, times.c_first)[0]) == 4
  settings = experiments.WalltimeSettings(n=2, temperatures=(0.0,), gamma_max=4, gammas=(),
                                          max_input_len=32, max_decode_len=6, batch_size=2,
                                          repeats=1, num_steps=2)
  _, rows, _ = experiments.walltime_experiment(
      target, drafts.PromptLookupDraft(VOCAB), 'prompt_lookup', settings)
  assert [(row['gamma'], row['chosen']) for row in rows] == [(2, True)]
  curve = rows[0]['positional_curve']  # gamma 1 .. 4, for the speedup-vs-gamma plot
  assert curve == pytest.approx([theory.positional_walltime_improvement(
      stats.betas, g, times.c, times.r, times.c_first) for g in range(1, 5)])
  assert np.argmax(curve) == 1


def _fixed_rounds(before, between, log):
  """A stand-in for step_costs.StepCostRounds: `before` from timed(), then `between`."""

  class Rounds:

    def __init__(self, *args, **kwargs):
      log.append(('built', kwargs['k_max']))

    def timed(self, repeats, progress=False):
      log.append(('timed', repeats))
      return before

    def add_iterations(self, gammas):
      log.append(('iterations', tuple(gammas)))

    def add_starts(self, inputs):
      log.append(('starts', tuple(x.shape for x in inputs)))

    def clear(self):
      log.append('clear')

    def round(self):
      log.append('round')

    def times(self):
      return between

  return Rounds


def test_walltime_experiment_predicts_with_parts_timed_between_the_loops(target, monkeypatch):
  before = step_costs.StepTimes(draft_s=1e-4, draft_first_s=2e-4,
                                verify_measured_s=np.array([1.0, 1.1, 1.2]) * 1e-3)
  between = step_costs.StepTimes(draft_s=3e-4, draft_first_s=5e-4,
                                 verify_measured_s=np.array([1.0, 1.6, 1.9]) * 1e-3,
                                 iteration_s={1: 2.4e-3, 2: 3.1e-3})
  log, inputs_timed = [], []
  monkeypatch.setattr(step_costs, 'StepCostRounds', _fixed_rounds(before, between, log))
  time_decoding = walltime.time_decoding

  def recording(*args, between, **kwargs):
    return time_decoding(*args, **kwargs,
                         between=lambda i: (inputs_timed.append(i), log.append(i), between(i)))

  monkeypatch.setattr(walltime, 'time_decoding', recording)
  settings = experiments.WalltimeSettings(n=3, temperatures=(0.0,), gamma_max=2, gammas=(),
                                          max_input_len=32, max_decode_len=6, batch_size=3,
                                          repeats=1, num_steps=2, parts_rounds=2)
  _, rows, timing = experiments.walltime_experiment(
      target, drafts.PromptLookupDraft(VOCAB), 'prompt_lookup', settings)
  # Every 3 // 2 = 1 input, and after the last: a round after each of the three inputs.
  gamma = rows[0]['gamma']  # whole iterations of the gamma decoded, timed between the loops
  cut = tuple((1, len(loading.trim_padding(row))) for row in experiments.task_inputs(
      settings.task, settings.split, 3, 32)[0])  # each input in its bucket, as decoded
  assert log == [('built', 3), ('timed', 5), ('iterations', (gamma,)), ('starts', cut), 'clear',
                 0, 'round', 1, 'round', 2, 'round']
  assert inputs_timed == [0, 1, 2]
  assert timing['c'] == pytest.approx(between.c)
  assert timing['gamma_chosen_with']['c'] == pytest.approx(before.c)
  row = rows[0]
  assert row['predicted_speedup'] == pytest.approx(theory.walltime_improvement(
      row['alpha'], row['gamma'], between.c, between.r, between.c_first))
  assert row['predicted_iteration_speedup'] == pytest.approx(theory.walltime_improvement(
      row['alpha'], gamma, between.c, iteration_cost=between.iteration_s[gamma] / 1e-3))


def test_walltime_experiment_runs_each_truncation_at_temperature_1(target):
  settings = experiments.WalltimeSettings(n=2, temperatures=(0.0,), gamma_max=1, gammas=(),
                                          max_input_len=32, max_decode_len=6, batch_size=2,
                                          repeats=1, num_steps=2, truncations=((40, 1.0), (0, 0.9)))
  alpha_rows, walltime_rows, _ = experiments.walltime_experiment(
      target, drafts.PromptLookupDraft(VOCAB), 'prompt_lookup', settings)
  knobs = [(r['temperature'], r['top_k'], r['top_p']) for r in walltime_rows]
  assert knobs == [(0.0, 0, 1.0), (1.0, 40, 1.0), (1.0, 0, 0.9)]
  assert [report.knobs_label(r) for r in alpha_rows] == [
      'T=0', 'T=1 top_k=40 (q untruncated)', 'T=1 top_p=0.9 (q untruncated)']


@pytest.mark.parametrize('untruncated', [True, False])
def test_walltime_experiment_gives_the_draft_its_knobs(target, monkeypatch, untruncated):
  given = {'alpha': [], 'decoder': []}
  measure_alpha, speculative_decoder = alpha_lib.measure_alpha, walltime.speculative_decoder

  def alpha(*args, draft_sampling, **kwargs):
    given['alpha'].append(draft_sampling)
    return measure_alpha(*args, draft_sampling=draft_sampling, **kwargs)

  def decoder(*args, draft_sampling, **kwargs):
    given['decoder'].append(draft_sampling)
    return speculative_decoder(*args, draft_sampling=draft_sampling, **kwargs)

  monkeypatch.setattr(alpha_lib, 'measure_alpha', alpha)
  monkeypatch.setattr(walltime, 'speculative_decoder', decoder)
  settings = experiments.WalltimeSettings(n=1, temperatures=(1.0,), gamma_max=1, gammas=(),
                                          max_input_len=32, max_decode_len=4, batch_size=1,
                                          repeats=1, num_steps=2, truncations=((0, 0.9),),
                                          untruncated_draft=untruncated)
  alpha_rows, rows, _ = experiments.walltime_experiment(
      target, drafts.PromptLookupDraft(VOCAB), 'prompt_lookup', settings)
  plain, nucleus = given['alpha']
  assert plain is None and given['decoder'][0] is None  # plain T = 1: the target's knobs
  if untruncated:
    for q in (nucleus, given['decoder'][1]):
      assert float(q.top_p) == 1.0 and int(q.top_k) == 0 and float(q.temperature) == 1.0
  else:
    assert nucleus is None and given['decoder'][1] is None
  suffix = ' (q untruncated)' if untruncated else ''
  assert [report.knobs_label(r) for r in (*alpha_rows, *rows)] == [
      'T=1', f'T=1 top_p=0.9{suffix}'] * 2


def test_walltime_experiment_times_every_setting_in_one_interleaved_run(target, monkeypatch):
  calls = []
  time_decoding = walltime.time_decoding

  def recording(decoders, *args, **kwargs):
    calls.append(sorted(decoders))
    return time_decoding(decoders, *args, **kwargs)

  monkeypatch.setattr(walltime, 'time_decoding', recording)
  settings = experiments.WalltimeSettings(n=2, temperatures=(1.0,), gamma_max=1, gammas=(),
                                          max_input_len=32, max_decode_len=6, batch_size=2,
                                          repeats=1, num_steps=2, truncations=((40, 1.0),))
  _, rows, _ = experiments.walltime_experiment(
      target, drafts.PromptLookupDraft(VOCAB), 'prompt_lookup', settings)
  top_k_label = 'T=1 top_k=40 (q untruncated)'
  assert calls == [[('T=1', 'baseline'), ('T=1', 'gamma=1'), (top_k_label, 'baseline'),
                    (top_k_label, 'gamma=1')]]
  plain, top_k = rows
  assert 'speedup_over_plain' not in plain
  assert top_k['speedup_over_plain'] == top_k['measured_speedup'] / plain['measured_speedup']
  assert top_k['baseline_over_plain'] == top_k['baseline_token_ms'] / plain['baseline_token_ms']


def test_knob_ratios_pair_chosen_rows_of_one_temperature():
  row = lambda t, k, p, chosen, speedup, ms: dict(
      task='a', draft='d', temperature=t, top_k=k, top_p=p, chosen=chosen,
      measured_speedup=speedup, baseline_token_ms=ms)
  rows = [row(1.0, 0, 1.0, True, 2.0, 4.0), row(1.0, 0, 1.0, False, 9.0, 9.0),
          row(1.0, 40, 1.0, True, 1.5, 5.0), row(1.0, 0, 0.9, False, 1.0, 1.0),
          row(0.5, 40, 1.0, True, 1.0, 1.0)]
  experiments.add_knob_ratios(rows)
  assert (rows[2]['speedup_over_plain'], rows[2]['baseline_over_plain']) == (0.75, 1.25)
  # unchosen rows, the plain row itself and a temperature without a plain row get nothing
  assert not any('speedup_over_plain' in rows[i] for i in (0, 1, 3, 4))


def test_every_local_task_has_a_metric():
  assert set(experiments.METRICS) == set(data.LOCAL_TASKS)


def test_beam_experiment_compares_speculative_and_plain_beam_search(target, tmp_path):
  draft = models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(1))
  settings = beam_sweep.BeamSettings(n=2, beam_size=2, configs=((1, 2),), max_input_len=32,
                                     max_decode_len=6)
  rows, quality = beam_sweep.beam_experiment(target, draft, 'nano', settings)
  assert [(r['decoder'], r['gamma'], r['draft_width']) for r in rows] == [
      ('plain', 0, 0), ('speculative', 1, 2)]
  for row in rows:
    # Scores of two arithmetic paths: equal to a few float32 ulps of their magnitude.
    assert row['identical'] == 2 and row['max_relative_diff'] <= 16 * tolerances.EPS32
    assert row['walltime_ratio'] > 0 and row['predicted_ratio'] > 0
  assert rows[0]['calls_per_step'] == 1.0 and rows[1]['calls_per_step'] <= 1.0
  assert set(quality) == {'beam', 'greedy'} and 'bleu' in quality['beam']
  md, csv_path, png = beam_sweep.write_report(tmp_path, rows, quality, notes='`the command`')
  assert '`the command`' in md.read_text() and md.read_text().count('\n| ') == 2 + len(rows)
  assert png.read_bytes().startswith(PNG_MAGIC)
  with open(csv_path) as f:
    assert [r['decoder'] for r in csv.DictReader(f)] == ['plain', 'speculative']
