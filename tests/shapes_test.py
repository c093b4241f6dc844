"""Tests for scripts/studies/shape_walltime.py (its speedup tables, settings and report) and
scripts/accelerator_check.sh (CPU, tiny shapes)."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spec_decode import theory
from tests import script_runner

ROOT = pathlib.Path(__file__).resolve().parents[1]
shape_walltime = script_runner.load('studies/shape_walltime.py')
# What the accelerator image lacks (and what the check must not need): the script must run
# without any of it. tqdm, which the demo stages import, travels in build/device_site; sacrebleu
# is on the image.
ABSENT = ('seqio', 'tensorflow', 'tensorflow_datasets', 'gin', 'matplotlib', 'safetensors',
          'rouge_score', 'torch', 'transformers')


def _record(iteration_ms: dict[int, float], *, batch_size: int = 1, token_ms: float = 10.0,
            first_ms: float = 1.0) -> dict:
  """A measure_shapes record with given per-iteration costs (target step 10 ms)."""
  gammas = sorted(iteration_ms)
  k_max = max(gammas) + 1
  r = [1.0 + 0.1 * k for k in range(k_max)]
  return dict(
      settings=dict(batch_size=batch_size, alphas=[0.5, 0.9], target='xxl', draft='small'),
      steps=dict(c=0.05, c_first=first_ms / 10.0, r=r, draft_first_ms=first_ms,
                 draft_step_ms=0.5, target_step_ms=10.0, verify_ms=[10.0 * x for x in r],
                 verify_measured_ms=[10.0 * x for x in r]),
      loops=[dict(loop='baseline', gamma=0, iteration_ms=token_ms)]
      + [dict(loop=f'gamma {g}', gamma=g, iteration_ms=ms) for g, ms in iteration_ms.items()])


def test_speedup_is_eq1_over_the_measured_iteration():
  out = shape_walltime.speedups(_record({2: 15.0, 7: 25.0}))
  # alpha 0.5, gamma 2: E = 1.75 tokens.
  assert out['table'][0]['0.5'] == pytest.approx(1.75 * 10.0 / 15.0)
  e7 = float(theory.expected_tokens(0.9, 7))
  assert out['table'][1]['0.9'] == pytest.approx(e7 * 10.0 / 25.0)
  best = {row['alpha']: row for row in out['best']}
  assert best[0.5]['gamma'] == 2 and best[0.9]['gamma'] == 7
  assert best[0.9]['parts_speedup'] == pytest.approx(float(theory.walltime_improvement(
      0.9, best[0.9]['parts_gamma'], 0.05, np.asarray(_record({2: 1, 7: 1})['steps']['r']), 0.1)))
  # The paper's EnDe T5-small rows (gamma 7) get this run's figure; the pair is XXL/small.
  ende_small = [row for row in out['paper'] if row['task'] == 'EnDe' and row['draft'] == 'T5-small']
  assert all(row['this_pair'] and row['predicted'] is not None for row in ende_small)
  assert all(row['predicted'] is None for row in out['paper'] if row['gamma'] not in (2, 7))


def test_block_verification_loops_stay_out_of_the_speedup_tables():
  record = _record({3: 20.0})
  record['loops'].append(dict(loop='gamma 3 block', gamma=3, verification='block',
                              iteration_ms=1.0))
  assert shape_walltime.speedups(record) == shape_walltime.speedups(_record({3: 20.0}))


def test_a_batch_s_iterations_cost_what_was_timed_whatever_was_accepted():
  one, eight = (shape_walltime.speedups(_record({3: 20.0}, batch_size=b))['table'][0]['0.9']
                for b in (1, 8))
  assert one == eight == pytest.approx(float(theory.expected_tokens(0.9, 3)) * 10 / 20)


@pytest.mark.parametrize('change, message', [
    (dict(dtype='fp16'), 'dtype'), (dict(draft_dtype='fp16'), 'draft_dtype'),
    (dict(gammas=()), 'gammas'), (dict(gammas=(0, 2)), 'gammas'),
    (dict(batch_size=0), 'batch_size'), (dict(alphas=(1.5,)), 'alpha'),
    (dict(gammas=(1, 2), block_gammas=(3,)), 'block_gammas')])
def test_bad_settings_are_named(change, message):
  with pytest.raises(ValueError, match=message):
    shape_walltime.ShapeSettings(**change)


def test_the_draft_takes_its_own_dtype_where_given():
  settings = shape_walltime.ShapeSettings(target='base', draft='small', dtype='float32',
                                          draft_dtype='bf16_weights')
  target = shape_walltime.model_config('base', settings)
  draft = shape_walltime.model_config('small', settings, settings.draft_dtype)
  assert (target.dtype, target.param_dtype) == ('float32', 'float32')
  assert (draft.dtype, draft.param_dtype) == ('float32', 'bfloat16')
  float32 = shape_walltime.ShapeSettings(dtype='float32')
  assert shape_walltime.model_config('small', float32).param_dtype == 'float32'


def test_report_rebuilds_from_its_json(tmp_path):
  record = _record({1: 12.0, 2: 15.0})
  record.update(shape_walltime.speedups(record), devices=['cpu:0'], device_kind='cpu',
                platform='cpu', jax_version='0', build_s=1.0, params=dict(target=11e9, draft=77e6),
                start_ms=dict(target=5.0, draft=1.0), peak_memory_gib=1.0,
                peak_memory_kind='peak process RSS')
  record['settings'].update(dtype='bfloat16', input_len=64, max_decode_len=32, model_parallel=1,
                            repeats=3)
  for row in record['loops']:
    row.update(compile_s=1.0, iterations=32)
  paths = shape_walltime.write_report(tmp_path, record, 'python scripts/studies/shape_walltime.py')
  text = paths[0].read_text()
  assert text.startswith(shape_walltime.ALPHA_IS_INPUT)
  assert '| gamma 2 | 1.0 | 15.000 |' in text and 'T5-small' in text
  assert json.loads(paths[1].read_text())['table'] == record['table']
  assert {p.name for p in paths} >= {'loops.csv', 'speedup.csv', 'r_vs_k.png'}


def test_accelerator_check_small_runs_without_the_absent_packages(tmp_path):
  blocker = tmp_path / 'blocker'
  blocker.mkdir()
  (blocker / 'sitecustomize.py').write_text(textwrap.dedent(f'''
      import importlib.abc, sys
      class _Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
          if name.split('.')[0] in {ABSENT!r}:
            raise ImportError(f'{{name}} is not installed on the accelerator image')
          return None
      sys.meta_path.insert(0, _Absent())
  '''))
  env = dict(os.environ, PYTHONPATH=str(blocker), PYTHON=sys.executable)
  done = subprocess.run(['bash', 'scripts/accelerator_check.sh', '--small'], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  index = ROOT / done.stdout.strip().splitlines()[-1].removeprefix('report: ')
  text = index.read_text()
  for stage, output in (('xxl_small_batch1', 'xxl_small_batch1/report.md'),
                        ('demo_pair', 'demo_pair/report.md'),
                        ('greedy_identity', 'greedy_identity.log'),
                        ('xxl_small_batch8', 'xxl_small_batch8/report.md')):
    assert f'| {stage} | [{output}]({output}) | ' in text and (index.parent / output).exists()
  assert text.count(' | ok |') == 4
  for run in ('xxl_small_batch1', 'xxl_small_batch8'):
    text = (index.parent / run / 'report.md').read_text()
    assert text.startswith(shape_walltime.ALPHA_IS_INPUT) and '(no plots: ' in text
    result = json.loads((index.parent / run / 'results.json').read_text())
    assert [row['loop'] for row in result['loops']][0] == 'baseline'
    if run.endswith('1'):  # block verification's loop is timed beside token verification's
      assert [row['loop'] for row in result['loops']][-1] == 'gamma 1 block'
    # Tiny loops: their ms per iteration (loop minus the timed starts) is noise here, so only
    # that every loop ran to full length is checked.
    assert all(row['seconds'] > 0 and 1 <= row['iterations'] <= 4 for row in result['loops'])
    assert len(result['steps']['r']) == (3 if run.endswith('1') else 2)
  # The demo pair with its real weights: greedy speculation reproduces the baseline.
  demo_report = (index.parent / 'demo_pair' / 'report.md').read_text()
  demo_row = next(line for line in demo_report.splitlines()
                  if line.startswith('| demo_ende |') and '| T=0 |' in line and 'bleu' in line)
  assert '| yes |' in demo_row and '(no plots: ' in demo_report  # tables without matplotlib
  identity = (index.parent / 'greedy_identity.log').read_text()
  assert '| float32 | 2 | 0/2 (0.0%) |' in identity


def test_accelerator_check_skips_what_its_time_bound_leaves_no_room_for(tmp_path):
  done = subprocess.run(['bash', 'scripts/accelerator_check.sh', '--small', '--seconds', '20',
                         '--out', str(tmp_path / 'out')], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, PYTHON=sys.executable))
  assert done.returncode == 0, done.stderr[-3000:]
  # 15 s left (5 held back) is under half of every stage's share: nothing starts to be cut.
  text = (tmp_path / 'out' / 'README.md').read_text()
  for stage in ('xxl_small_batch1', 'demo_pair', 'greedy_identity', 'xxl_small_batch8'):
    assert f'| {stage} | - | 0 | skipped: ' in text
  assert not (tmp_path / 'out' / 'xxl_small_batch1.log').exists()


def test_accelerator_check_names_a_bad_argument():
  done = subprocess.run(['bash', 'scripts/accelerator_check.sh', '--seconds', 'soon'], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 2 and 'usage:' in done.stderr
  done = subprocess.run(['bash', 'scripts/accelerator_check.sh', '--only', 'xxl_small_batch9'],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert done.returncode == 2 and 'unknown stage xxl_small_batch9' in done.stderr
