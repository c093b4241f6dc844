"""The rendezvous of a multi-process run, in threads: the verdict every process gets.

tests/multihost_test.py runs real processes through the command line; here
the processes are threads of this one.
"""

import threading
import time

import pytest

from spec_decode import rendezvous
from tests.multihost_test import free_port

SETTINGS = {'SEED': 0, 'GAMMA': 4, 'the inputs': '12 lines, sha256 1f2e'}


def _meet(count: int, fingerprints=None, failures=None, timeout_s: float = 20):
  """Runs processes 0..count-1's side of the rendezvous; {id: None or the exception}."""
  port, results = free_port(), {}
  fingerprints = fingerprints or {}
  failures = failures or {}

  def run(index):
    deadline = time.monotonic() + timeout_s
    meet = dict(deadline=deadline, timeout_s=timeout_s, fingerprint=fingerprints.get(index),
                failure=failures.get(index))
    try:
      if index == 0:
        results[index] = rendezvous.gather('localhost', port, count, **meet)
      else:
        results[index] = rendezvous.report('localhost', port, count, index, **meet)
    except Exception as e:  # pylint: disable=broad-except; the result of this process
      results[index] = e

  threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  return results


def test_processes_that_agree_go():
  results = _meet(3, {i: SETTINGS for i in range(3)})
  assert results == {0: None, 1: None, 2: None}


@pytest.mark.parametrize('changes, named', [
    ({'SEED': 1}, "SEED (processes 0, 2: 0; process 1: 1)"),
    ({'the inputs': '12 lines, sha256 77aa'},
     'the inputs (processes 0, 2: 12 lines, sha256 1f2e; process 1: 12 lines, sha256 77aa)'),
    ({'GAMMA': 5, 'SEED': 1}, 'GAMMA (processes 0, 2: 4; process 1: 5), SEED ('),
])
def test_processes_that_disagree_all_stop_naming_what_differs(changes, named):
  fingerprints = {0: SETTINGS, 1: {**SETTINGS, **changes}, 2: SETTINGS}
  results = _meet(3, fingerprints)
  messages = {i: str(e) for i, e in results.items()}
  assert all(isinstance(e, ValueError) for e in results.values()), results
  assert len(set(messages.values())) == 1, messages  # one message, on every process
  assert messages[0].startswith(f'the processes disagree on {named}'), messages[0]
  assert messages[0].endswith('every process of a run needs the same settings and inputs')


def test_a_process_that_failed_its_checks_stops_every_process_naming_it():
  results = _meet(3, {i: SETTINGS for i in range(3)},
                  failures={2: 'inputs.txt line 3: a blank line'})
  assert {i: str(e) for i, e in results.items()} == {
      i: 'process 2 of 3 failed its checks: inputs.txt line 3: a blank line' for i in range(3)}
