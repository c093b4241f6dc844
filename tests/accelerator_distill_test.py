"""Tests for scripts/accelerator_distill.sh: every stage at tiny sizes without the image's gaps."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
# What the accelerator image lacks besides gin and tqdm, which the script takes from a carried
# folder (build/device_site) and here from the test environment.
ABSENT = ('seqio', 'tensorflow', 'tensorflow_datasets', 'matplotlib', 'safetensors', 'sacrebleu',
          'rouge_score', 'torch', 'transformers')


def _run(tmp_path, *args):
  blocker = tmp_path / 'blocker'
  blocker.mkdir(exist_ok=True)
  # Imports of the absent packages fail, and probes for them (etils asks importlib.util.find_spec
  # whether tensorflow exists) find nothing, as on the image.
  (blocker / 'sitecustomize.py').write_text(textwrap.dedent(f'''
      import importlib.abc, importlib.util, sys
      _absent = lambda name: name.split('.')[0] in {ABSENT!r}
      class _Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
          if _absent(name):
            raise ModuleNotFoundError(f'{{name}} is not installed on the accelerator image')
          return None
      sys.meta_path.insert(0, _Absent())
      _find_spec = importlib.util.find_spec
      importlib.util.find_spec = lambda name, *a, **k: None if _absent(name) else _find_spec(
          name, *a, **k)
  '''))
  env = dict(os.environ, PYTHONPATH=str(blocker), PYTHON=sys.executable)
  return subprocess.run(['bash', 'scripts/accelerator_distill.sh', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)


def test_small_run_stopped_by_its_time_bound_writes_records_draft_and_alpha(tmp_path):
  # The target's outputs first (--records_only), then training on them (--records), as a short
  # lease runs it: the records made on one machine, the training on another.
  records = tmp_path / 'records'
  done = _run(tmp_path, str(records), '--small', '--records_only')
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  stages = [line.split()[0] for line in (records / 'seconds.txt').read_text().splitlines()]
  assert stages == ['records_greedy', 'records_sampled'] and (records / 'DONE').exists()
  assert not (records / 't5x').exists()
  # --small's 3 steps (its warmup cut to the run's length) do not fit in 1 s (the first step
  # ends after ~12 s on 2 idle cores): training stops itself after the step that passes the
  # bound, and exports it.
  out = tmp_path / 'out'
  done = _run(tmp_path, str(out), '--small', '--train_seconds', '1', '--records',
              str(records / 'mix'))
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert 'train_seconds 1 ran out: stopped after step ' in done.stderr
  assert (out / 'DONE').exists() and not (out / 'workdir').exists()
  stages = [line.split()[0] for line in (out / 'seconds.txt').read_text().splitlines()]
  assert stages == ['train', 'alpha_multi30k', 'alpha_debsum']
  records = (out / 'mix' / 'train.jsonl').read_text().splitlines()
  assert 24 + 8 <= len(records) <= 24 + 8 + 16  # greedy outputs all kept, unfinished samples not
  assert all(isinstance(json.loads(r)['targets'], str) for r in records)
  steps = [json.loads(line)['step'] for line in (out / 'log.jsonl').read_text().splitlines()
           if 'step' in json.loads(line)]
  last = int(done.stderr.split('stopped after step ')[1].split()[0])
  assert 1 <= last < 3 and max(steps) == last  # the last step is logged
  assert (out / 't5x' / 'checkpoint').exists()
  for name, temperatures in (('alpha_multi30k', ['T=0', 'T=1']), ('alpha_debsum', ['T=0'])):
    report = (out / name / 'report.md').read_text()
    assert str(out / 't5x') in report and 'spec_decode/data/models/draft_small' in report
    assert all(f'| {t} |' in report for t in temperatures)


def test_bad_arguments_are_named(tmp_path):
  done = _run(tmp_path, str(tmp_path / 'out'), '--draft', 'draft_huge')
  assert done.returncode == 2 and 'usage:' in done.stderr
  assert not (tmp_path / 'out').exists()


def test_records_that_are_not_there_or_with_records_only_are_named(tmp_path):
  done = _run(tmp_path, str(tmp_path / 'out'), '--records', str(tmp_path / 'nowhere'))
  assert done.returncode == 2 and 'expected train.jsonl and validation.jsonl' in done.stderr
  done = _run(tmp_path, str(tmp_path / 'out'), '--records', str(tmp_path), '--records_only')
  assert done.returncode == 2 and 'usage:' in done.stderr
  assert not (tmp_path / 'out').exists()
