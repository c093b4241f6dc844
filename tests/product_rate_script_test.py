"""Tests for scripts/studies/product_rate.py: a row per (shape, rows), rates that add up, bad input named."""

from tests import script_runner


def test_prints_a_rate_per_shape_and_row_count():
  done = script_runner.run('studies/product_rate.py', '--shapes', '32x80', '16x64', '--rows', '1',
                           '3', '--steps', '2', '--rounds', '2')
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [row for row in script_runner.table_rows(done.stdout) if 'x' in row[0]
          and row[0].strip()[0].isdigit()]
  assert [(r[0].strip(), int(r[1])) for r in rows] == [('32x80', 1), ('32x80', 3), ('16x64', 1),
                                                       ('16x64', 3)]
  for row in rows:
    shape, count = row[0].strip(), int(row[1])
    inputs, outputs = (int(n) for n in shape.split('x'))
    for us, rate in ((float(row[2]), float(row[3])), (float(row[4]), float(row[5]))):
      # G multiply-adds per second = rows x in x out / (us x 1e3), to the printed precision.
      assert abs(rate - count * inputs * outputs / us / 1e3) <= 0.5 + 0.05 * rate


def test_bad_shapes_and_rows_are_named():
  done = script_runner.run('studies/product_rate.py', '--shapes', '384by8192')
  assert done.returncode == 2 and 'IN x OUT' in done.stderr
  done = script_runner.run('studies/product_rate.py', '--rows', '0', '2')
  assert done.returncode == 2 and 'rows must lie' in done.stderr
