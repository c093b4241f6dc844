"""Tests for scripts/studies/pruned_head.py: coverage, alpha, costs and an interleaved run per head."""

from tests import script_runner


def test_prints_each_head_against_the_full_one():
  done = script_runner.run('studies/pruned_head.py', '--n', '2', '--sizes', '16', '--temperatures', '0',
                           '--repeats', '1', '--max_decode_len', '6', '--gamma', '1',
                           '--steps', '2', '--rounds', '1')
  assert done.returncode == 0, done.stderr[-2000:]
  heads = {row[0]: row[1:] for row in script_runner.table_rows(done.stdout) if row[0] in (
      'full', 'N = 16') and len(row) == 5}
  covered = {name: float(cells[0]) for name, cells in heads.items()}
  alpha = {name: float(cells[1]) for name, cells in heads.items()}
  assert covered['full'] == 1.0 and 0 < covered['N = 16'] < 0.5
  assert 0 < alpha['N = 16'] < alpha['full']  # most of the target's tokens lie outside 16 ids
  timed = {row[0]: row for row in script_runner.table_rows(done.stdout) if len(row) == 6}
  assert set(timed) == {'decoder', 'baseline', 'full', 'N = 16'}
  assert timed['full'][5] == timed['N = 16'][5] == '100%'  # greedy: the baseline's outputs
  assert float(timed['N = 16'][3]) > 0 and timed['baseline'][3] == ''


def test_bad_size_is_an_error():
  done = script_runner.run('studies/pruned_head.py', '--sizes', '1')
  assert done.returncode == 2 and 'sizes must lie in 2..8192' in done.stderr
