"""Tests for scripts/matmul_rows.py: a row per (weights, K), r(1) = 1, bad rows named."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / 'scripts' / 'matmul_rows.py'


def _run(*args):
  return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                        timeout=300)


def test_prints_r_of_k_for_both_sizes():
  done = _run('--d', '8', '--n', '16', '--matrices', '3', '--rows', '1', '3', '--steps', '2',
              '--rounds', '2')
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [line.split('|')[1:-1] for line in done.stdout.splitlines()
          if line.startswith('| all') or line.startswith('| one')]
  assert [(r[0].strip(), r[2].strip()) for r in rows] == [('all', '1'), ('all', '3'),
                                                          ('one', '1'), ('one', '3')]
  assert [float(r[-1]) for r in rows][::2] == [1.0, 1.0]
  assert all(float(r[3]) > 0 for r in rows)  # ms per pass


def test_rows_without_one_are_an_error():
  done = _run('--rows', '2', '4')
  assert done.returncode == 2 and 'include 1' in done.stderr
