"""Where the processes of one run meet before JAX joins them, and how they end together.

Process 0 listens at the coordinator's port + 1; every other process connects
and says hello with what the processes must agree on (a fingerprint: name ->
value, e.g. the settings and a digest of the inputs) or why it cannot run (its
failure). Process 0 compares them and sends every process the same verdict:
go, or one message naming the processes that failed, the entries that differ,
the processes that never arrived, or a busy coordinator port. A verdict other
than go ends every process before any of them starts JAX.

After go the connections stay open for the run (`Channel`, process 0 linked to
each other process): a process that ends says so ('done', or 'failed' and
why), and one whose connection closes without a word is gone (killed,
crashed). Process 0 relays a failure to the others, and each process runs its
`on_failure` hook at once, where JAX would abort it (exit 134) only after its
heartbeat timeout. A host that vanishes without closing its connections is
still JAX's to detect.
"""

import json
import os
import socket
import threading
import time
from typing import Any, Callable, Mapping

HELLO, GO, STOP, DONE, FAILED = 'spec_decode rendezvous', 'go', 'stop', 'done', 'failed'
ANSWER_GRACE_S = 10.0  # process 0 answers by its own deadline, a little after the others'
FAILURE_GRACE_S = 5.0  # a failing process 0 waits this long for the others to hear it
LEFT_GRACE_S = 2.0  # a failing process waits this long to learn whether a peer left first
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


class Channel:
  """The run's open connections: process 0 to each other process, or one to process 0.

  Attributes:
    process_id: this process.
    count: processes in the run.
  """

  def __init__(self, process_id: int, count: int, peers: Mapping[int, Lines]):
    self.process_id, self.count = process_id, count
    self._peers = dict(peers)
    self._done: set[int] = set()
    self._closed: set[int] = set()
    self._changed = threading.Condition()
    self._failed = False
    self._reported = threading.Event()

  def watch(self, on_failure: Callable[[str], None]) -> None:
    """Watches every connection from daemon threads; `on_failure(message)` once a run fails.

    on_failure runs once, on a watcher thread, when another process says it
    failed or its connection closes without 'done'; it is expected to end
    this process (os._exit). Process 0 first relays the message to the
    others and waits up to FAILURE_GRACE_S for them to close.
    """
    for peer, lines in self._peers.items():
      threading.Thread(target=self._watch, args=(peer, lines, on_failure), daemon=True,
                       name=f'spec_decode-watch-{peer}').start()

  def _watch(self, peer: int, lines: Lines, on_failure: Callable[[str], None]) -> None:
    lines.connection.settimeout(None)
    while True:
      line = lines.receive()
      if line == DONE:
        with self._changed:
          self._done.add(peer)
        continue
      if line is None:
        with self._changed:
          self._closed.add(peer)
          self._changed.notify_all()
          if peer in self._done or self._failed:
            return
        message = (f'process {peer} of {self.count} left the run without finishing (killed or '
                   'crashed, or its host failed)')
      elif line.startswith(FAILED + ' '):
        message = line[len(FAILED) + 1:]
        if self.process_id == 0:  # the others' messages are process 0's, whole
          message = f'process {peer} of {self.count} failed: {message}'
      else:
        continue  # nothing else is said after go
      if self._claim_failure():
        self._tell_others(message, but=peer)
        on_failure(message)
        self._reported.set()
      return

  def _left(self) -> bool:
    """Whether a peer's connection closed without 'done' (call holding `_changed`)."""
    return bool(self._closed - self._done)

  def _claim_failure(self) -> bool:
    """Whether this is the run's first failure here (then this caller reports it)."""
    with self._changed:
      first, self._failed = not self._failed, True
      self._changed.notify_all()
      return first

  def _tell_others(self, message: str, but: int | None = None) -> None:
    """Process 0: sends the failure to every other process, waits a while for them to close."""
    if self.process_id != 0:
      return
    others = [peer for peer in self._peers if peer != but]
    for peer in others:
      self._peers[peer].send(f'{FAILED} {message}')
    deadline = time.monotonic() + FAILURE_GRACE_S
    with self._changed:
      while not self._closed.issuperset(others) and time.monotonic() < deadline:
        self._changed.wait(max(deadline - time.monotonic(), 0.001))

  def finish(self, failure: str | None = None) -> None:
    """Tells the others this process is done, or failed (`failure`, one line).

    A failing process first waits up to LEFT_GRACE_S for word of another
    failure: a collective fails when a peer dies, and then the watcher names
    the peer (it ends the process; here, at most a while later, returns).
    Process 0 failing waits up to FAILURE_GRACE_S for the others to close
    their connections (they end on hearing it) before returning, so that
    they hear it before its exit ends JAX's coordination service.
    """
    if failure is None:
      for lines in self._peers.values():
        lines.send(DONE)
      return
    with self._changed:  # a collective fails when a peer dies: then its watcher names the peer
      self._changed.wait_for(lambda: self._failed or self._left(), timeout=LEFT_GRACE_S)
      first = not (self._failed or self._left())
      self._failed = self._failed or first
    if not first:  # a watcher reports the failure elsewhere and ends this process
      self._reported.wait(FAILURE_GRACE_S + LEFT_GRACE_S)
      return
    if self.process_id == 0:
      self._tell_others(f'process 0 of {self.count} failed: {failure}')
    else:
      self._peers[0].send(f'{FAILED} {failure}')


def gather(host: str, port: int, count: int, deadline: float, timeout_s: float,
           fingerprint: Mapping[str, Any] | None, failure: str | None,
           coordinator_port: int | None = None) -> Channel:
  """Process 0: waits for every other process's hello, sends the verdict; the run's Channel.

  Raises:
    OSError: process 0 cannot listen at `port`, or `coordinator_port` is busy.
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
  keep = False
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
      error: type[Exception] = ValueError
      if stop is None and coordinator_port is not None:
        stop, error = _busy(coordinator_port), OSError
      for peer in arrived.values():
        peer.send(GO if stop is None else f'{STOP} {stop}')
      if stop is not None:
        raise error(stop)
      keep = True
      return Channel(0, count, arrived)
    finally:
      if not keep:
        for peer in arrived.values():
          peer.connection.close()


def _busy(port: int) -> str | None:
  """A message if `port` (where JAX's coordination service will listen) is taken, else None."""
  try:
    with socket.create_server(('', port)):
      return None
  except OSError as e:
    why = os.strerror(e.errno) if e.errno else str(e)
    return (f'process 0 cannot start JAX\'s coordination service: port {port} (the '
            f'COORDINATOR_ADDRESS port) is busy ({why}); choose a free port')


def report(host: str, port: int, count: int, index: int, deadline: float, timeout_s: float,
           fingerprint: Mapping[str, Any] | None, failure: str | None) -> Channel:
  """Process i > 0: says hello to process 0 (retrying until it listens), waits for the verdict.

  Raises:
    TimeoutError: process 0 never listened, did not answer, or names a
      process that did not arrive.
    OSError, ValueError: the verdict (a busy coordinator port; a failure or a
      difference), or a refused hello.
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
  if answer == GO:
    return Channel(index, count, {0: lines})
  connection.close()
  if answer is not None and answer.startswith(STOP + ' '):
    stop = answer[len(STOP) + 1:]
    raise (OSError if 'coordination service' in stop else ValueError)(stop)
  raise (TimeoutError if answer and 'did not arrive' in answer else ValueError)(
      answer or 'process 0 closed the rendezvous without an answer')
