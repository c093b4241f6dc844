"""The README's code runs as written: the quickstart, the command line, the paper's commands.

Commands that take minutes at full size run here at a small size: the README's own command line
with a few size flags appended (argparse keeps the last value).
"""

import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import nbformat
import pytest

import spec_decode
from spec_decode import demo

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / 'README.md').read_text(encoding='utf-8')
# The commands of "Reproducing the paper's tables" that run elsewhere, and where.
ELSEWHERE = {
    'python -m spec_decode.demo': 'scripts/accelerator_check.sh --small (tests/shapes_test.py)',
    'bash scripts/accelerator_check.sh': 'tests/shapes_test.py, at --small',
}
# Size flags appended to each remaining command.
SMALL = {
    'scripts/theory.py': [],
    'scripts/measure_alpha.py': ['--n', '2', '--max_decode_len', '8', '--temperatures', '0'],
    'scripts/lm_alpha.py': ['--n', '2', '--max_decode_len', '4'],
    'scripts/studies/lenience.py': ['--n', '1', '--lenience', '1', '0.5', '--max_decode_len',
                                    '8', '--repeats', '1'],
    'scripts/studies/shape_walltime.py': ['--target', 'nano', '--draft', 'nano', '--vocab_size',
                                          '256', '--input_len', '8', '--max_decode_len', '8',
                                          '--gammas', '2', '--alphas', '0.5', '--repeats', '1',
                                          '--batch_size', '1'],
}


def code_blocks(heading: str, language: str) -> list[str]:
  """The ```language blocks of the README section that starts with `heading`."""
  section = README.split(f'\n{heading}\n', 1)[1].split('\n## ', 1)[0]
  return re.findall(rf'```{language}\n(.*?)```', section, re.S)


def paper_commands() -> list[str]:
  lines = code_blocks("## Reproducing the paper's tables", 'bash')[0].splitlines()
  return [line.split('  #', 1)[0].strip() for line in lines if line.strip()]


def test_the_python_quickstart_runs_as_written(tmp_path):
  done = subprocess.run([sys.executable, '-c', code_blocks('## Python', 'python')[0]],
                        cwd=tmp_path, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  translation, calls = done.stdout.strip().splitlines()[-2:]
  assert re.fullmatch(r"\['\w.+'\]", translation), done.stdout
  assert re.fullmatch(r'\d+\.\d\d tokens per target call', calls), done.stdout


def _public_names(code: str) -> set[tuple[str, str]]:
  return set(re.findall(r'\b(sd|demo)\.(\w+)', code))


def test_every_public_name_in_the_readme_and_notebooks_resolves():
  code = '\n'.join(code_blocks('## Python', 'python'))
  for notebook in sorted((ROOT / 'notebooks').glob('*.ipynb')):
    cells = nbformat.read(notebook, as_version=4).cells
    code += '\n'.join(c.source for c in cells if c.cell_type == 'code')
  names = _public_names(code)
  assert ('sd', 'T5Model') in names and ('demo', 'VOCABULARY') in names
  modules = {'sd': spec_decode, 'demo': demo}
  missing = [f'{m}.{n}' for m, n in sorted(names) if not hasattr(modules[m], n)]
  assert not missing, missing
  assert not [f'sd.{n}' for n in spec_decode.__all__ if not hasattr(spec_decode, n)]


def test_the_command_line_example_decodes_from_any_directory(tmp_path):
  script = next(b for b in code_blocks('## Command line', 'bash') if 'spec-decode' in b)
  bin_dir = os.path.dirname(sys.executable)
  env = dict(os.environ, PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}')
  done = subprocess.run(['bash', '-euo', 'pipefail', '-c', script], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  records = [json.loads(line) for line in (tmp_path / 'outputs.jsonl').read_text().splitlines()]
  assert len(records) == len((tmp_path / 'inputs.txt').read_text().splitlines()) >= 1
  assert all(r['output'] and r['target_calls'] >= 1 for r in records)


def test_every_paper_command_runs_somewhere():
  commands = paper_commands()
  assert len(commands) >= 5
  unknown = [c for c in commands
             if not any(c.startswith(k) for k in ELSEWHERE) and _script(c) not in SMALL]
  assert not unknown, f'README commands no test runs: {unknown}'


def _script(command: str) -> str:
  return shlex.split(command)[1]


@pytest.mark.parametrize('script', sorted(SMALL))
def test_paper_command_runs_at_a_small_size(script, tmp_path):
  command = next(c for c in paper_commands() if _script(c) == script)
  args = shlex.split(command)[2:] + SMALL[script]
  if '--out_dir' in args:
    args += ['--out_dir', str(tmp_path / 'out')]
  done = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  assert done.stdout.strip(), done.stderr[-3000:]
  if '--out_dir' in args:
    assert any((tmp_path / 'out').iterdir())
