"""Where the processes of one run meet before JAX joins them, and how they end together.

Process 0 listens at the coordinator's port + 1; every other process connects
and says hello with what the processes must agree on (a fingerprint: name ->
value, e.g. the settings and a digest of the inputs) or why it cannot run (its
failure). Process 0 compares them and sends every process the same verdict:
go, or one message naming the processes that failed, the entries that differ,
or the processes that never arrived. A verdict other than go ends every
process before any of them starts JAX.
"""

import json
import socket
import time
from typing import Any, Mapping

HELLO, GO, STOP = 'spec_decode rendezvous', 'go', 'stop'
ANSWER_GRACE_S = 10.0  # process 0 answers by its own deadline, a little after the others'
_SHOWN = 60  # characters of a differing value a message shows


class Lines:
  """The newline-terminated lines of a socket, one at a time."""

  def __init__(self, connection: socket.socket):
    self.connection, self._buffer = connection, b''

  def send(self, line: str) -> None:
    try:
      self.connection.sendall(line.replace('\n', ' ').encode() + b'\n')
    except OSError:
      pass  # A peer that left learns nothing; its own end or timeout ends it.

  def receive(self) -> str | None:
    """The next line, or None once the other end closed (or the connection failed)."""
    while b'\n' not in self._buffer:
      try:
        chunk = self.connection.recv(4096)
      except TimeoutError:
        raise
      except OSError:
        chunk = b''
      if not chunk:
        return None
      self._buffer += chunk
    line, self._buffer = self._buffer.split(b'\n', 1)
    return line.decode(errors='replace')


def verdict(hellos: Mapping[int, Mapping[str, Any]], count: int) -> str | None:
  """None when every process may go; else the one message that stops them all.

  Args:
    hellos: process id -> {'fingerprint': {name: value}, 'failure': message or None}.
    count: processes in the run.
  """
  failed = [f'process {i} of {count} failed its checks: {h["failure"]}'
            for i, h in sorted(hellos.items()) if h.get('failure')]
  if failed:
    return '; '.join(failed)
  fingerprints = {i: h.get('fingerprint') or {} for i, h in sorted(hellos.items())}
  names = sorted(set().union(*fingerprints.values()))
  differ = []
  for name in names:
    groups: dict[str, list[int]] = {}
    for i, fingerprint in fingerprints.items():
      groups.setdefault(json.dumps(fingerprint.get(name)), []).append(i)
    if len(groups) > 1:
      shown = '; '.join(f'{_processes(ids)}: {_short(json.loads(value))}'
                        for value, ids in groups.items())
      differ.append(f'{name} ({shown})')
  if differ:
    return (f'the processes disagree on {", ".join(differ)}: every process of a run needs the same '
            'settings and inputs')
  return None


def _processes(ids: list[int]) -> str:
  return f'process{"es" if len(ids) > 1 else ""} {", ".join(map(str, ids))}'


def _short(value: Any) -> str:
  text = value if isinstance(value, str) else repr(value)
  return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + '...'


def hello(count: int, index: int, fingerprint: Mapping[str, Any] | None,
          failure: str | None) -> str:
  """The line process `index` says to process 0."""
  payload = json.dumps({'fingerprint': dict(fingerprint or {}), 'failure': failure})
  return f'{HELLO} {count} {index} {payload}'


def parse_hello(line: str | None) -> tuple[int | None, int | None, dict[str, Any]]:
  """(count, index, payload) of a hello line; Nones for anything else."""
  parts = (line or '').split(' ', 4)
  try:
    if ' '.join(parts[:2]) == HELLO and len(parts) == 5:
      return int(parts[2]), int(parts[3]), json.loads(parts[4])
  except ValueError:
    pass
  return None, None, {}


def gather(host: str, port: int, count: int, deadline: float, timeout_s: float,
           fingerprint: Mapping[str, Any] | None, failure: str | None) -> None:
  """Process 0: waits for every other process's hello, sends them the verdict.

  Raises:
    OSError: process 0 cannot listen at `port`.
    TimeoutError: a process did not arrive by the deadline (named).
    ValueError: processes that disagree on the count, an id twice, a failed
      process or a fingerprint that differs (the verdict).
  """
  try:
    server = socket.create_server(('', port))
  except OSError as e:
    raise OSError(f'process 0 cannot listen at port {port} (the coordinator\'s port + 1) for the '
                  f'other processes: {e}') from None
  arrived: dict[int, Lines] = {}
  hellos = {0: {'fingerprint': fingerprint, 'failure': failure}}
  with server:
    try:
      while len(arrived) < count - 1:
        server.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
          connection, _ = server.accept()
        except TimeoutError:
          missing = sorted(set(range(1, count)) - set(arrived))
          message = (f'process(es) {", ".join(map(str, missing))} of {count} did not arrive at '
                     f'{host}:{port} within {timeout_s:g} s')
          for peer in arrived.values():
            peer.send(message)
          raise TimeoutError(message) from None
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        lines = Lines(connection)
        try:
          line = lines.receive()
        except TimeoutError:
          line = None
        said, index, payload = parse_hello(line)
        if said != count or index in arrived or index is None or not 0 < index < count:
          message = (f'process 0 of {count} met a process that says {(line or "")[:80]!r}: the '
                     'processes disagree on the count, or an id repeats')
          lines.send(message)
          connection.close()
          raise ValueError(message)
        arrived[index], hellos[index] = lines, payload
      stop = verdict(hellos, count)
      for peer in arrived.values():
        peer.send(GO if stop is None else f'{STOP} {stop}')
      if stop is not None:
        raise ValueError(stop)
    finally:
      for peer in arrived.values():
        peer.connection.close()


def report(host: str, port: int, count: int, index: int, deadline: float, timeout_s: float,
           fingerprint: Mapping[str, Any] | None, failure: str | None) -> None:
  """Process i > 0: says hello to process 0 (retrying until it listens), waits for the verdict.

  Raises:
    TimeoutError: process 0 never listened, did not answer, or names a
      process that did not arrive.
    ValueError: the verdict (a failure or a difference), or a refused hello.
  """
  while True:
    try:
      connection = socket.create_connection((host, port),
                                            timeout=max(deadline - time.monotonic(), 0.001))
      break
    except OSError:
      if time.monotonic() >= deadline:
        raise TimeoutError(f'process 0 (the coordinator) did not listen at {host}:{port} within '
                           f'{timeout_s:g} s') from None
      time.sleep(0.2)
  lines = Lines(connection)
  lines.send(hello(count, index, fingerprint, failure))
  connection.settimeout(max(deadline - time.monotonic(), 0.001) + ANSWER_GRACE_S)
  try:
    answer = lines.receive()
  except TimeoutError:
    connection.close()
    raise TimeoutError(f'process 0 did not let process {index} go within {timeout_s:g} s') from None
  connection.close()
  if answer == GO:
    return
  if answer is not None and answer.startswith(STOP + ' '):
    raise ValueError(answer[len(STOP) + 1:])
  raise (TimeoutError if answer and 'did not arrive' in answer else ValueError)(
      answer or 'process 0 closed the rendezvous without an answer')
