"""Tests for scripts/nucleus_mass.py: shares per cap that never fall as the cap shrinks, costs."""

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / 'scripts' / 'nucleus_mass.py'


def _run(*args):
  return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                        timeout=600)


def _table(stdout, first):
  return [[cell.strip() for cell in line.split('|')[1:-1]] for line in stdout.splitlines()
          if line.startswith(f'| {first}')]


def test_prints_shares_and_costs_per_cap():
  done = _run('--n', '3', '--drafts', 'draft_small', '--caps', '8', '2', '64', '--gamma', '2',
              '--steps', '2', '--rounds', '1')
  assert done.returncode == 0, done.stderr[-2000:]
  shares = {row[0].split(',')[0] + (' windows' if ',' in row[0] else ''):
            [float(x) for x in row[1:]] for row in _table(done.stdout, '')
            if row[0].startswith(('target', 'draft_small'))}
  assert set(shares) == {'target', 'draft_small', 'target windows'}
  for values in shares.values():  # caps sorted 2, 8, 64: fewer positions beyond a larger cap
    assert len(values) == 3 and 1 >= values[0] >= values[1] >= values[2] >= 0
  assert shares['target'][0] > 0  # two tokens rarely hold 0.9 at T = 1
  # A window of 3 positions needs the bisection when any of them does.
  assert all(w >= p for w, p in zip(shares['target windows'], shares['target']))
  costs = [row for row in _table(done.stdout, '') if row[0] in ('2', '8', '64')]
  assert [row[0] for row in costs] == ['2', '8', '64']
  assert all(float(x) > 0 for row in costs for x in row[1:])


def test_bad_top_p_is_an_error():
  done = _run('--top_p', '1.0')
  assert done.returncode == 2 and 'top_p must lie in (0, 1)' in done.stderr
