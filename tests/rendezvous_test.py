"""The rendezvous of a multi-process run, in threads: the verdict every process gets, the channel.

tests/multihost_test.py runs real processes through the command line; here
the processes are threads of this one, so each case takes milliseconds.
"""

import socket
import threading
import time

import pytest

from spec_decode import rendezvous
from tests.multihost_test import free_port

SETTINGS = {'SEED': 0, 'GAMMA': 4, 'the inputs': '12 lines, sha256 1f2e'}


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch):
  monkeypatch.setattr(rendezvous, 'FAILURE_GRACE_S', 0.5)  # the hooks here do not exit
  monkeypatch.setattr(rendezvous, 'LEFT_GRACE_S', 1.0)


def _meet(count: int, fingerprints=None, failures=None, timeout_s: float = 20,
          coordinator_port: int | None = None):
  """Runs processes 0..count-1's side of the rendezvous; {id: Channel or the exception}."""
  port, results = free_port(), {}
  fingerprints = fingerprints or {}
  failures = failures or {}

  def run(index):
    deadline = time.monotonic() + timeout_s
    meet = dict(deadline=deadline, timeout_s=timeout_s, fingerprint=fingerprints.get(index),
                failure=failures.get(index))
    try:
      if index == 0:
        results[index] = rendezvous.gather('localhost', port, count,
                                           coordinator_port=coordinator_port, **meet)
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
  assert all(isinstance(r, rendezvous.Channel) for r in results.values()), results


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


def test_a_busy_coordinator_port_is_named_on_every_process():
  with socket.create_server(('', 0)) as busy:
    port = busy.getsockname()[1]
    results = _meet(2, coordinator_port=port)
  for error in results.values():
    assert isinstance(error, OSError), results
    assert str(error).startswith(f"process 0 cannot start JAX's coordination service: port "
                                 f'{port} (the COORDINATOR_ADDRESS port) is busy')


def _channels(count: int):
  results = _meet(count)
  assert all(isinstance(r, rendezvous.Channel) for r in results.values()), results
  heard, events = {}, {i: threading.Event() for i in range(count)}

  def hook(index):
    def on_failure(message):
      heard[index] = message
      events[index].set()
    return on_failure

  for i, channel in results.items():
    channel.watch(hook(i))
  return results, heard, events


def test_a_failure_reaches_every_process_through_process_0():
  channels, heard, events = _channels(3)
  channels[2].finish('out of memory loading the target')
  assert events[0].wait(10) and events[1].wait(10)
  assert heard == {i: 'process 2 of 3 failed: out of memory loading the target' for i in (0, 1)}


def test_process_0_failing_tells_the_others():
  channels, heard, events = _channels(2)
  threading.Thread(target=channels[0].finish, args=('writing out.jsonl: disk full',)).start()
  assert events[1].wait(10)
  assert heard == {1: 'process 0 of 2 failed: writing out.jsonl: disk full'}


def test_a_connection_that_closes_without_done_is_a_process_gone():
  channels, heard, events = _channels(3)
  for lines in channels[1]._peers.values():  # pylint: disable=protected-access
    lines.connection.shutdown(socket.SHUT_RDWR)  # as the kernel does for a killed process
  assert events[0].wait(10) and events[2].wait(10)
  message = 'process 1 of 3 left the run without finishing (killed or crashed, or its host failed)'
  assert (heard[0], heard[2]) == (message, message)  # (process 1, the dead one, hears nothing)


def test_a_collective_failing_as_a_peer_dies_names_the_peer():
  """Process 1 is killed mid all-reduce: process 0's own error comes first, its name wins."""
  channels, heard, events = _channels(3)
  for lines in channels[1]._peers.values():  # pylint: disable=protected-access
    lines.connection.shutdown(socket.SHUT_RDWR)
  started = time.monotonic()
  channels[0].finish('XlaRuntimeError: all-reduce failed: Connection reset by peer')
  assert events[0].is_set() and time.monotonic() - started < 1.0  # the peer, named at once
  assert events[2].wait(10)
  message = 'process 1 of 3 left the run without finishing (killed or crashed, or its host failed)'
  assert (heard[0], heard[2]) == (message, message)


def test_a_failure_of_its_own_is_reported_after_the_grace():
  channels, heard, events = _channels(2)
  started = time.monotonic()
  channels[1].finish('writing out.jsonl: disk full')
  assert time.monotonic() - started >= rendezvous.LEFT_GRACE_S
  assert events[0].wait(10) and heard == {0: 'process 1 of 2 failed: writing out.jsonl: disk full'}


def test_processes_that_finish_end_quietly():
  channels, heard, _ = _channels(3)
  for i in (1, 2, 0):
    channels[i].finish()
  time.sleep(0.5)  # then the processes exit, closing their connections
  for channel in channels.values():
    for lines in channel._peers.values():  # pylint: disable=protected-access
      lines.connection.shutdown(socket.SHUT_RDWR)
  time.sleep(0.5)
  assert not heard


@pytest.mark.parametrize('records, status', [(3, 0), (1, 1)])
def test_the_command_line_s_hook_says_what_the_output_holds(tmp_path, monkeypatch, capsys,
                                                            records, status):
  """Another process failed: exit 1 saying what the output holds, or 0 once it was complete."""
  from spec_decode.cli import jsonl  # pylint: disable=import-outside-toplevel
  from spec_decode.cli import processes  # pylint: disable=import-outside-toplevel

  def leave(code):
    raise SystemExit(code)

  monkeypatch.setattr(processes, '_exit', leave)
  out = jsonl.Output(str(tmp_path / 'out.jsonl'), '-')
  processes.writing(out, 3)
  out.write([{'line': i} for i in range(records)])
  if records == 3:
    out.close()
  with pytest.raises(SystemExit) as exited:
    processes._on_failure('process 1 of 2 failed: boom')  # pylint: disable=protected-access
  assert exited.value.code == status
  line = capsys.readouterr().err.strip()
  if status:
    assert line == (f'error: process 1 of 2 failed: boom; {tmp_path}/out.jsonl was not written; '
                    f'the first 1 of 3 records (the last line possibly cut) are in '
                    f'{tmp_path}/out.jsonl.incomplete')
  else:
    assert line == f'note: process 1 of 2 failed: boom, after {tmp_path}/out.jsonl was complete'
  processes.writing(None, 0)
