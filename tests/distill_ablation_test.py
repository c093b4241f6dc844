"""Tests for scripts/studies/distill_ablation.py: its rows, resumption and report."""

import json

from tests import script_runner

distill_ablation = script_runner.load('studies/distill_ablation.py')


def _result(name: str, alpha: float) -> dict:
  keys = [f'{task} T={t:g}' for task, _, _ in distill_ablation.EVALUATIONS
          for t in distill_ablation.TEMPERATURES]
  return {'row': name, **{k: alpha for k in keys}, **{k + ' s.e.': 0.01 for k in keys}}


def test_sequence_kd_is_a_row_only_with_records():
  without = distill_ablation.rows(distill_ablation.Settings())
  assert 'sequence KD' not in without and without['bundled'] == {}
  assert without['tvd, no on-policy'] == {'kind': 'whitebox', 'divergence': 'tvd',
                                          'on_policy_weight': 0.0}
  assert {'tvd', 'fkl', 'rkl', 'jsd'} <= set(without)
  with_records = distill_ablation.rows(distill_ablation.Settings(distill_dir='out/distill'))
  assert with_records['sequence KD'] == {'kind': 'sequence_kd'}


def test_measured_rows_are_reused_and_reported(tmp_path):
  settings = distill_ablation.Settings(steps=7, out_dir=str(tmp_path / 'report'),
                                       work_dir=str(tmp_path / 'work'))
  rows_dir = tmp_path / 'report' / 'rows'
  rows_dir.mkdir(parents=True)
  names = list(distill_ablation.rows(settings))
  for i, name in enumerate(names):  # every row measured already: nothing trains
    file = distill_ablation._slug(name) + '.json'
    (rows_dir / file).write_text(json.dumps(_result(name, 0.5 + 0.01 * i)))
  paths = distill_ablation.run(settings, 'python scripts/studies/distill_ablation.py --steps 7')
  assert [p.name for p in paths] == ['report.md', 'alpha.csv', 'results.json', 'alpha.png']
  text = paths[0].read_text()
  assert '`python scripts/studies/distill_ablation.py --steps 7`' in text and '7 steps of 4096' in text
  assert '| tvd, no on-policy | 0.550 ± 0.010 |' in text
  assert [r['row'] for r in json.loads(paths[2].read_text())['rows']] == names
  assert not (tmp_path / 'work').exists()
