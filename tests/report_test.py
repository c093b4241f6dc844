"""Tests for spec_decode.harness.report: the files it writes and the rows they hold."""

import csv
import json

from spec_decode.harness import report

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

ALPHA_ROWS = [
    dict(task='demo_ende', target='small', draft='nano', temperature=0.0, alpha=0.75,
         stderr=0.01, std=0.4, sequences=10, positions=200, q10=0.5, q25=0.6, q50=0.75, q75=0.8,
         q90=0.9),
    dict(task='demo_ende', target='small', draft='bigram', temperature=1.0, alpha=0.31,
         stderr=0.02, std=0.2, sequences=10, positions=210, q10=0.2, q25=0.25, q50=0.3, q75=0.35,
         q90=0.4),
]
TIMING = dict(target_step_ms=2.0, draft_step_ms=0.1, c=0.05, draft_first_ms=0.2, c_first=0.1,
              verify_ms=[2.0, 2.1, 2.2, 2.4, 2.6], verify_measured_ms=[2.0, 2.1, 2.3, 2.1, 2.6],
              r=[1.0, 1.05, 1.1, 1.2, 1.3], iteration_cost={'3': 1.6},
              target_start_ms={'32': 3.0, '64': 5.5}, both_start_ms={'32': 3.5, '64': 6.25})


def _walltime_row(temperature, gamma, chosen, speedup, finite=True):
  row = dict(
      task='demo_ende', draft='nano', temperature=temperature, chosen=chosen, gamma=gamma,
      alpha=0.75, c=0.05, c_first=0.1, r=1.1, measured_speedup=speedup, predicted_speedup=1.9,
      predicted_speedup_eq5=2.1, tokens_per_call=2.2, expected_tokens_per_call=2.3,
      identical=1.0, baseline_s=10.0, speculative_s=10.0 / speedup, baseline_token_ms=2.5,
      target_step_ms=2.0, iteration_ms=5.0, draft_ms=0.6, verify_ms=2.4, fixed_ms=0.5,
      other_ms=1.5, baseline_iteration_ms=2.2, slowdown=1.1, scaled_other_ms=1.2,
      baseline_fixed_ms=8.0, speculative_fixed_ms=9.0, loop_speedup=speedup + 0.1,
      accept_histogram=[5, 4, 3, 9][:gamma + 1], metrics='bleu', bleu_baseline=21.5,
      bleu_speculative=21.5)
  if finite:  # results written before the finite-length predictions lack them
    row.update(predicted_finite_speedup=1.6, finite_tokens_per_call=2.1,
               predicted_positional_speedup=1.4, positional_tokens_per_call=2.0,
               positional_curve=[1.2, 1.4, 1.35, 1.3], predicted_iteration_speedup=1.25,
               predicted_positional_iteration_speedup=1.75, predicted_decode_speedup=1.4,
               predicted_decode_iteration_speedup=1.25)
  return row


WALLTIME_ROWS = [
    _walltime_row(0.0, 2, False, 1.5),
    _walltime_row(0.0, 3, True, 1.75),
    _walltime_row(1.0, 2, True, 1.25, finite=False),
]


def test_knobs_label_names_the_truncation():
  assert report.knobs_label(dict(temperature=0.0)) == 'T=0'
  assert report.knobs_label(dict(temperature=1.0, top_k=40, top_p=1.0)) == 'T=1 top_k=40'
  assert report.knobs_label(dict(temperature=1.0, top_k=0, top_p=0.9)) == 'T=1 top_p=0.9'
  assert (report.knobs_label(dict(temperature=1.0, top_k=0, top_p=0.9, q_untruncated=True))
          == 'T=1 top_p=0.9 (q untruncated)')
  assert (report._slug(('demo_ende', 'nano', 'T=1 top_p=0.9 (q untruncated)'))  # file names
          == 'demo_ende_nano_T1-top_p0.9-q-untruncated')


def test_markdown_table():
  table = report.markdown_table([dict(a=1), dict(a=2)], [('A', lambda r: str(r['a']))])
  assert table.splitlines() == ['| A |', '| --- |', '| 1 |', '| 2 |']


def test_write_report_writes_every_file(tmp_path):
  paths = report.write_report(tmp_path / 'out', title='Tables', alpha_rows=ALPHA_ROWS,
                              walltime_rows=WALLTIME_ROWS, timing=TIMING, notes='some notes')
  names = {p.name for p in paths}
  assert names == {
      'report.md', 'results.json', 'table3_alpha.csv', 'table2_walltime.csv', 'r_vs_k.png',
      'speedup_vs_gamma_demo_ende_nano_T0.png', 'tokens_per_call_demo_ende_nano_T0.png',
      'speedup_vs_gamma_demo_ende_nano_T1.png', 'tokens_per_call_demo_ende_nano_T1.png'}
  for path in paths:
    assert path.exists() and path.stat().st_size > 0
    if path.suffix == '.png':
      assert path.read_bytes()[:8] == PNG_MAGIC

  md = (tmp_path / 'out' / 'report.md').read_text()
  assert md.startswith('# Tables\n\nsome notes')
  assert ('| demo_ende | small | nano | T=0 | 0.750 ± 0.010 | 0.400 | 0.50 / 0.75 / 0.90 | 200 '
          '| 10 |') in md
  # measured / predicted at the outputs' lengths: 1.75 / 1.60 = 1.09; at each
  # position's beta 1.75 / 1.40 = 1.25; with whole iterations 1.75 / 1.25 = 1.40, 1.75 / 1.75;
  # whole decodes 1.75 / 1.4 = 1.25, with i(gamma) 1.75 / 1.25 = 1.40.
  assert ('| demo_ende | nano | T=0 | 3 | 0.750 | 0.050 (0.100) | 1.75X | 1.90X | 0.92 '
          '| 1.60X (1.09) | 1.40X (1.25) | 1.25X (1.40); 1.75X (1.00) | 1.40X (1.25); 1.25X (1.40) '
          '| 2.10X | 2.20 (2.30; 2.10; 2.00) | yes | bleu 21.5 / 21.5 |') in md
  assert ('| demo_ende | nano | T=1 | 2 | 0.750 | 0.050 (0.100) | 1.25X | 1.90X | 0.66 | - | - '
          '| - | - | 2.10X | 2.20 (2.30; -; -) | n/a (sampled) |') in md
  assert ('by the target alone / by both models in one program, per encoder input length: '
          '32 tokens: 3.000 / 3.500 ms, 64 tokens: 5.500 / 6.250 ms.') in md
  assert ('| demo_ende | nano | T=0 | 3 | 2.500 | 2.000 | 5.000 | 0.600 | 2.400 | 0.500 | 1.500 '
          '| 1.10 | 1.200 | 8.0 / 9.0 | 1.85X (1.40X; 1.75X) |') in md
  assert '**c = 0.050**' in md and '**c_first = 0.100**' in md and '| 5 | 2.6000 | 2.6000 | 1.300 |' in md
  assert '**i(3) = 1.600** target steps, against c_first + 2 c + r(4) = 1.400 summed.' in md
  assert '| 4 | 2.1000 | 2.4000 | 1.200 |' in md  # measured, then as used
  for name in names - {'report.md'}:
    assert name in md or name.endswith(('.csv', '.json'))

  with open(tmp_path / 'out' / 'table2_walltime.csv') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 3 and rows[1]['gamma'] == '3' and rows[1]['accept_histogram'] == '5 4 3 9'
  with open(tmp_path / 'out' / 'table3_alpha.csv') as f:
    assert [r['draft'] for r in csv.DictReader(f)] == ['nano', 'bigram']
  results = json.loads((tmp_path / 'out' / 'results.json').read_text())
  assert results['walltime'] == WALLTIME_ROWS and results['timing'] == TIMING


def test_timing_says_when_gamma_was_chosen_with_other_parts(tmp_path):
  report.write_report(tmp_path / 'a', title='t', timing=TIMING)
  assert 'between the inputs' not in (tmp_path / 'a' / 'report.md').read_text()
  before = dict(TIMING, c=0.04, c_first=0.09, r=[1.0, 1.2, 1.4, 1.5, 1.6])
  report.write_report(tmp_path / 'b', title='t', timing=dict(TIMING, gamma_chosen_with=before))
  md = (tmp_path / 'b' / 'report.md').read_text()
  assert 'timed in rounds between the inputs of the walltime run below' in md
  assert 'c = 0.040, c_first = 0.090, r(K) = 1.000, 1.200, 1.400, 1.500, 1.600.' in md
  assert '**c = 0.050**' in md  # the table's parts are the ones timed between the loops


def test_knob_rows_get_a_section_against_plain_sampling(tmp_path):
  plain = _walltime_row(1.0, 2, True, 1.25)
  top_k = dict(_walltime_row(1.0, 2, True, 1.0), top_k=40, speedup_over_plain=0.8,
               baseline_over_plain=1.1)
  report.write_report(tmp_path, title='t', walltime_rows=[plain, top_k], timing=TIMING)
  md = (tmp_path / 'report.md').read_text()
  section = md.split('### top-k and top-p against plain sampling')[1].split('###')[0]
  assert '| demo_ende | nano | T=1 top_k=40 | 2 | 1.00X | 0.800 | 1.100 |' in section
  assert '| T=1 | ' not in section  # the plain row is the reference, not a row
  report.write_report(tmp_path, title='t', walltime_rows=[plain], timing=TIMING)
  assert 'against plain sampling' not in (tmp_path / 'report.md').read_text()


def test_alpha_only_report(tmp_path):
  paths = report.write_report(tmp_path, title='alpha', alpha_rows=ALPHA_ROWS)
  assert {p.name for p in paths} == {'report.md', 'results.json', 'table3_alpha.csv'}
  md = (tmp_path / 'report.md').read_text()
  assert '| demo_ende | small | bigram | T=1 | 0.310 ± 0.020 |' in md and 'Walltime' not in md


def test_greedy_mismatch_is_flagged(tmp_path):
  row = dict(_walltime_row(0.0, 2, True, 1.5), identical=0.5)
  report.write_report(tmp_path, title='t', walltime_rows=[row], timing=TIMING)
  assert 'NO (50% of outputs)' in (tmp_path / 'report.md').read_text()
