"""Tests for scripts/studies/nucleus_mass.py: shares per cap that never fall as the cap shrinks, costs."""

from tests import script_runner


def test_prints_shares_and_costs_per_cap():
  done = script_runner.run('studies/nucleus_mass.py', '--n', '3', '--drafts', 'draft_small', '--caps', '8',
                           '2', '64', '--gamma', '2', '--steps', '2', '--rounds', '1')
  assert done.returncode == 0, done.stderr[-2000:]
  shares = {row[0].split(',')[0] + (' windows' if ',' in row[0] else ''):
            [float(x) for x in row[1:]] for row in script_runner.table_rows(done.stdout)
            if row[0].startswith(('target', 'draft_small'))}
  assert set(shares) == {'target', 'draft_small', 'target windows'}
  for values in shares.values():  # caps sorted 2, 8, 64: fewer positions beyond a larger cap
    assert len(values) == 3 and 1 >= values[0] >= values[1] >= values[2] >= 0
  assert shares['target'][0] > 0  # two tokens rarely hold 0.9 at T = 1
  # A window of 3 positions needs the bisection when any of them does.
  assert all(w >= p for w, p in zip(shares['target windows'], shares['target']))
  costs = [row for row in script_runner.table_rows(done.stdout) if row[0] in ('2', '8', '64')]
  assert [row[0] for row in costs] == ['2', '8', '64']
  assert all(float(x) > 0 for row in costs for x in row[1:])


def test_bad_top_p_is_an_error():
  done = script_runner.run('studies/nucleus_mass.py', '--top_p', '1.0')
  assert done.returncode == 2 and 'top_p must lie in (0, 1)' in done.stderr
