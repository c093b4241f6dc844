"""Settings of the test processes: XLA's compile flags, test order.

Most of the suite's time is XLA compiling small loops that then run for
milliseconds. At --xla_backend_optimization_level=0 a tiny T5 speculative loop
compiles in 4.6 s instead of 8.2 s and runs 1.5x slower (EPYC, 2026-12-01).
With XLA:CPU's older elemental emitters (--xla_cpu_use_fusion_emitters=false)
a tiny speculative, baseline and block loop compile in 7.3-8.7 s instead of
14.2 s, and tests/models_test.py takes 42 s instead of 67 s (Xeon,
2026-12-03). Without LLVM's expensive passes
(--xla_llvm_disable_expensive_passes) and with each module's code generated in
one piece (--xla_cpu_parallel_codegen_split_count=1: the two test workers
already fill both cores), four model test files took 116 s instead of 140 s
(EPYC, 2026-12-07). So the tests (and the subprocesses and notebook kernels
they start, which inherit the environment) compile with all four. Every check
compares computations made under the same flags; benchmarks and the demo run
with XLA's defaults. Set any of these flags in XLA_FLAGS to override it.

loadfile (pytest.ini: -n 2 --dist loadfile) hands whole files to the workers in
collection order; a long file collected last leaves the other worker idle
until it ends. The slowest files (summed test times of a full run, EPYC,
2026-12-07) go first, longest first.
"""

import os

import pytest
import sentencepiece as spm

for _flag, _value in (('--xla_backend_optimization_level', '0'),
                      ('--xla_cpu_use_fusion_emitters', 'false'),
                      ('--xla_llvm_disable_expensive_passes', 'true'),
                      ('--xla_cpu_parallel_codegen_split_count', '1')):
  if _flag not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()

SLOWEST_FIRST = ('multihost_test.py', 'shapes_test.py', 'decoder_only_test.py',
                 'sharding_test.py', 'smollm2_pair_test.py', 'drafts_test.py',
                 'accelerator_distill_test.py', 'feature_draft_test.py', 'copying_test.py',
                 'readme_test.py',
                 'llama_test.py', 'experiments_test.py', 'speculative_test.py',
                 'block_verification_test.py', 'notebooks_test.py', 'measure_test.py',
                 'decoding_test.py', 'whitebox_test.py', 'nonfinite_test.py', 'train_test.py',
                 'infer_test.py', 'kernel_isa_test.py', 'loop_law_test.py', 'cli_errors_test.py',
                 'sampling_test.py', 'distill_test.py', 'front_ends_test.py', 'kernels_test.py',
                 'lm_scripts_test.py')


# `pytest -m engine`: the loops, their exactness and sampling, for quick work on the engine.
# Block verification's own exactness tests run in the full suite.
ENGINE = ('decoding_test.py', 'loop_law_test.py', 'speculative_test.py', 'sampling_test.py',
          'cache_test.py', 'theory_test.py')


def pytest_ignore_collect(collection_path, config):
  """With `-m engine`, the other files are not even imported (some import TensorFlow)."""
  if config.getoption('markexpr') == 'engine' and collection_path.suffix == '.py':
    return collection_path.name not in ENGINE
  return None


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
  for item in items:
    if item.path.name in ENGINE:
      item.add_marker(pytest.mark.engine)


@pytest.fixture(scope='session')
def other_vocabulary(tmp_path_factory) -> str:
  """A SentencePiece model of another training than the bundled one (T5's ids: pad 0, EOS 1)."""
  directory = tmp_path_factory.mktemp('other_vocabulary')
  corpus = directory / 'corpus.txt'
  corpus.write_text('\n'.join(f'Zwei Hunde spielen {i} mal im Schnee.' for i in range(200)))
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / 'other'),
                                 vocab_size=40, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
  return str(directory / 'other.model')
