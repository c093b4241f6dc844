"""scripts/lm_walltime.py at a small size, on random bundled-size models (lm_alpha.py: readme_test)."""

import json

import jax
import pytest

from spec_decode import checkpoints
from spec_decode.models import decoder_only
from tests import script_runner


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
  path = tmp_path_factory.mktemp('lm_pair')
  for name, seed in (('lm_target', 0), ('lm_draft', 1)):
    model = decoder_only.DecoderOnlyModel.random(decoder_only.bundled_config(name), jax.random.key(seed))
    checkpoints.write_t5x(str(path / name), model.params, dtype='bfloat16')
  return path


def test_lm_walltime_compares_measured_and_predicted(pair, tmp_path):
  run = script_runner.run('lm_walltime.py', '--target', str(pair / 'lm_target'), '--draft',
                          str(pair / 'lm_draft'), '--n', '2', '--max_decode_len', '4',
                          '--gammas', '2', '--temperatures', '1', '--repeats', '1',
                          '--out_dir', str(tmp_path))
  assert run.returncode == 0, run.stderr[-3000:]
  [record] = json.loads((tmp_path / 'walltime.json').read_text())['rows']
  assert record['gamma'] == 2 and record['measured_speedup'] > 0
  assert record['predicted_speedup'] > 0 and 0 < record['c'] < 1
