"""scripts/lm_alpha.py and scripts/lm_walltime.py at a small size, on random bundled-size models."""

import json

import jax
import pytest

from spec_decode import checkpoints
from spec_decode import lm
from tests import script_runner


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
  path = tmp_path_factory.mktemp('lm_pair')
  for name, seed in (('lm_target', 0), ('lm_draft', 1)):
    model = lm.DecoderOnlyModel.random(lm.bundled_config(name), jax.random.key(seed))
    checkpoints.write_t5x(str(path / name), model.params, dtype='bfloat16')
  return path


def test_lm_alpha_prints_the_table3_row(pair, tmp_path):
  run = script_runner.run('lm_alpha.py', '--target', str(pair / 'lm_target'), '--draft',
                          str(pair / 'lm_draft'), '--n', '4', '--max_decode_len', '4',
                          '--out_dir', str(tmp_path))
  assert run.returncode == 0, run.stderr[-3000:]
  rows = script_runner.table_rows(run.stdout)
  assert [r[0] for r in rows[1:]] == ['draft', 'unigram', 'bigram']
  assert rows[1][3:] == ['0.88', '0.89']  # the paper's, beside ours
  records = json.loads((tmp_path / 'alpha.json').read_text())['rows']
  assert {(r['draft'], r['temperature']) for r in records} == {
      (d, t) for d in ('draft', 'unigram', 'bigram') for t in (0.0, 1.0)}
  assert all(0.0 <= r['alpha'] <= 1.0 and r['positions'] == 16 for r in records)


def test_lm_walltime_compares_measured_and_predicted(pair, tmp_path):
  run = script_runner.run('lm_walltime.py', '--target', str(pair / 'lm_target'), '--draft',
                          str(pair / 'lm_draft'), '--n', '2', '--max_decode_len', '4',
                          '--gammas', '2', '--temperatures', '1', '--repeats', '1',
                          '--out_dir', str(tmp_path))
  assert run.returncode == 0, run.stderr[-3000:]
  [record] = json.loads((tmp_path / 'walltime.json').read_text())['rows']
  assert record['gamma'] == 2 and record['measured_speedup'] > 0
  assert record['predicted_speedup'] > 0 and 0 < record['c'] < 1
