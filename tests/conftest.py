"""Settings of the test processes: XLA's backend optimisation level, test order.

Most of the suite's time is XLA compiling small loops that then run for
milliseconds. At --xla_backend_optimization_level=0 a tiny T5 speculative loop
compiles in 4.6 s instead of 8.2 s and runs 1.5x slower (EPYC, 2026-12-01), so
the tests (and the subprocesses and notebook kernels they start, which inherit
the environment) compile at level 0. Every check compares computations made
under the same flags; benchmarks and the demo run at XLA's default level. Set
XLA_FLAGS with any --xla_backend_optimization_level to override it.

loadfile (pytest.ini: -n 2 --dist loadfile) hands whole files to the workers in
collection order; a long file collected last leaves the other worker idle
until it ends. The slowest files (measured with --durations, same day) go
first, longest first.
"""

import os

if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                             + ' --xla_backend_optimization_level=0').strip()

SLOWEST_FIRST = ('sharding_test.py', 'notebooks_test.py', 'drafts_test.py', 'measure_test.py',
                 'infer_test.py', 'speculative_test.py', 'cli_errors_test.py', 'shapes_test.py',
                 'experiments_test.py', 'train_test.py', 'whitebox_test.py', 'models_test.py',
                 'decoding_test.py')


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
