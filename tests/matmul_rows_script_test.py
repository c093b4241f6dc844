"""Tests for scripts/studies/matmul_rows.py: a row per (weights, K), r(1) = 1, bad rows named."""

from tests import script_runner


def test_prints_r_of_k_for_both_sizes():
  done = script_runner.run('studies/matmul_rows.py', '--d', '8', '--n', '16', '--matrices', '3', '--rows',
                           '1', '3', '--steps', '2', '--rounds', '2')
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [row for row in script_runner.table_rows(done.stdout) if row[0] in ('all', 'one')]
  assert [(r[0].strip(), r[2].strip()) for r in rows] == [('all', '1'), ('all', '3'),
                                                          ('one', '1'), ('one', '3')]
  assert [float(r[-1]) for r in rows][::2] == [1.0, 1.0]
  assert all(float(r[3]) > 0 for r in rows)  # ms per pass


def test_rows_without_one_are_an_error():
  done = script_runner.run('studies/matmul_rows.py', '--rows', '2', '4')
  assert done.returncode == 2 and 'include 1' in done.stderr
