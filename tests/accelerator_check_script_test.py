"""scripts/accelerator_check.sh with a Python that cannot run it: one line naming it, exit 1.

(The check itself runs in tests/shapes_test.py; these cases stop before any stage.)
"""

import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / 'scripts' / 'accelerator_check.sh'


def _check(tmp_path, python: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHON=python)
  return subprocess.run(['bash', str(SCRIPT), '--small', '--out', str(tmp_path / 'out')],
                        env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize('python, why', [
    ('/bin/false', '(exit 1): it printed nothing'),
    ('/nonexistent/python3', '(exit 127): '),
    # A real Python without its site-packages: jax does not import.
    ('{tmp}/python_without_site', "(exit 1): ModuleNotFoundError: No module named 'jax'"),
])
def test_a_python_that_cannot_run_the_check_is_named(tmp_path, python, why):
  wrapper = tmp_path / 'python_without_site'
  wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
  wrapper.chmod(0o755)
  python = python.format(tmp=tmp_path)
  result = _check(tmp_path, python)
  assert result.returncode == 1, result.stderr
  assert result.stderr.startswith(f'error: PYTHON={python} cannot run the check {why}'), \
      result.stderr
  assert not (tmp_path / 'out').exists()
