"""The row kernels' code paths for each x86-64 instruction-set level, checked in C++.

The library is built for the machine that builds it (-march=native), so its
AVX-512 and AVX2 paths cannot both run here through XLA. Each checker includes
distributions.cc and compares a kernel with plain float64 arithmetic or a full
sort, built here for the machine's own level, AVX2 without AVX-512, and
baseline x86-64. With an earlier plain lane loop of masked float sums in
distributions.cc, GCC 12 at -O3 -march=x86-64-v3 gave 55 of 216 thresholds wrong
(none at -O1 or natively on an AVX-512 machine; not reduced further).
"""

import os
import platform
import subprocess

import jax
import pytest

from spec_decode.kernels import build

CHECKERS = ('threshold_check.cc', 'softmax_check.cc', 'argmax_check.cc')


def _instruction_sets():
  """-march values this machine runs: its own, and on x86-64 AVX2 (if it has it) and baseline."""
  if platform.machine() not in ('x86_64', 'AMD64'):
    return ['native']
  with open('/proc/cpuinfo', encoding='utf-8') as f:
    avx2 = ' avx2 ' in f.read()
  return ['native'] + (['x86-64-v3'] if avx2 else []) + ['x86-64']


@pytest.mark.parametrize('isa', _instruction_sets())
@pytest.mark.parametrize('checker', CHECKERS)
def test_every_instruction_set_path_matches_the_reference(checker, isa, tmp_path):
  binary = str(tmp_path / 'check')
  compiled = subprocess.run(
      [build.compiler(), '-O3', f'-march={isa}', '-ffp-contract=fast', '-std=c++17', '-w',
       f'-I{jax.ffi.include_dir()}', os.path.join(os.path.dirname(__file__), checker),
       '-o', binary],
      capture_output=True, text=True, timeout=build.COMPILE_TIMEOUT_S, check=False)
  assert compiled.returncode == 0, compiled.stderr[-2000:]
  done = subprocess.run([binary], capture_output=True, text=True, timeout=60, check=False)
  last = done.stdout.splitlines()[-1] if done.stdout else ''
  assert done.returncode == 0 and last.startswith('0 of ') and last.endswith(' wrong'), (
      done.stdout + done.stderr)
