"""Decoding over several processes: one JAX process per host, as T5X runs pods.

Each host runs the same program. `initialize` joins the processes (a
rendezvous that names any process that does not arrive, then
`jax.distributed.initialize`); from then on `jax.devices()` lists every
host's devices and `sharding.make_mesh` lays one mesh over all of them. Each
host feeds only the rows its own devices hold (`host_rows`, `global_array`),
the compiled loops of `spec_decode.models.sharding` run as on one host (XLA adds the
collectives between hosts), and `gather` brings the outputs back to every
host, where process 0 writes them.

  multihost.initialize(multihost.Cluster('10.0.0.1:1234', num_processes=2, process_id=i))
  mesh = sharding.make_mesh(model_parallel=8)          # over both hosts' devices
  inputs = multihost.global_array(lambda rows: tokens[rows], (B, S),
                                  sharding.batch_sharding(mesh, target.rules, (B, S)))
  out = multihost.gather(spec_decode.speculative_generate(target, draft, inputs, key, ...))

The results do not depend on the process count: every host draws the same
keys (per row, from one seed), and the arithmetic is that of one process
with the same mesh. A process that dies stops the others: JAX's coordination
service misses its heartbeats for `heartbeat_timeout_s` and ends every other
process with an error naming it (exit status non-zero, never a hang).
"""

import dataclasses
import os
import socket
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

# The environment variables `Cluster.from_env` reads (JAX's own names).
ENV_ADDRESS, ENV_COUNT, ENV_ID = 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'
_HELLO, _GO = 'spec_decode rendezvous', 'go'
_ANSWER_GRACE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Cluster:
  """Where the processes meet and which one this is.

  Attributes:
    coordinator_address: 'host:port' of process 0, reachable from every host.
      The rendezvous that names missing processes also uses port + 1.
    num_processes: processes in the job, >= 1.
    process_id: this process, in [0, num_processes).
  """

  coordinator_address: str
  num_processes: int
  process_id: int

  def __post_init__(self):
    host, _, port = str(self.coordinator_address).rpartition(':')
    if not host or not port.isdigit() or not 0 < int(port) < 65535:
      raise ValueError(f'coordinator_address must be host:port (port 1..65534; the next port '
                       f'is used too), got {self.coordinator_address!r}')
    for name, low in (('num_processes', 1), ('process_id', 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f'{name} must be an integer >= {low}, got {value!r}')
    if self.process_id >= self.num_processes:
      raise ValueError(f'process_id {self.process_id} is not below num_processes '
                       f'{self.num_processes}')

  @property
  def host(self) -> str:
    return self.coordinator_address.rpartition(':')[0]

  @property
  def port(self) -> int:
    return int(self.coordinator_address.rpartition(':')[2])

  @classmethod
  def from_env(cls, environ: Mapping[str, str] = os.environ) -> 'Cluster | None':
    """The cluster of JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID; None if unset.

    Raises:
      ValueError: some of the three set but not all, or a value that is not one.
    """
    values = {name: environ.get(name) for name in (ENV_ADDRESS, ENV_COUNT, ENV_ID)}
    if all(v is None for v in values.values()):
      return None
    missing = [name for name, v in values.items() if v is None]
    if missing:
      raise ValueError(f'set all of {", ".join(values)} or none; missing {", ".join(missing)}')
    try:
      count, index = int(values[ENV_COUNT]), int(values[ENV_ID])
    except ValueError:
      raise ValueError(f'{ENV_COUNT} and {ENV_ID} must be integers, got '
                       f'{values[ENV_COUNT]!r} and {values[ENV_ID]!r}') from None
    return cls(values[ENV_ADDRESS], count, index)


def initialize(cluster: Cluster | None = None, *, timeout_s: float = 300.0,
               heartbeat_timeout_s: int = 100) -> None:
  """Joins this process to the others; call it before anything else uses JAX.

  With a cluster (or one in the environment, `Cluster.from_env`) the
  processes first meet at process 0 (port + 1): one that has not arrived
  within `timeout_s` makes every other exit with a TimeoutError naming it.
  Then `jax.distributed.initialize` connects them. Without either, JAX
  detects the cluster itself (a Cloud TPU pod slice, SLURM, ...).

  Args:
    cluster: the coordinator, process count and this process's id.
    timeout_s: how long a process waits for the others, in seconds.
    heartbeat_timeout_s: after this many seconds without a heartbeat from a
      process, JAX ends every other process with an error naming it.

  Raises:
    TimeoutError: a process did not arrive (named) or process 0 did not answer.
    ValueError: processes that disagree on the process count, or one id twice.
    OSError: process 0 cannot listen at the coordinator's port + 1.
  """
  cluster = cluster or Cluster.from_env()
  if cluster is None:
    jax.distributed.initialize(initialization_timeout=int(timeout_s),
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
    return
  if cluster.num_processes == 1:
    return
  deadline = time.monotonic() + timeout_s
  (_gather_at_coordinator if cluster.process_id == 0 else _report_to_coordinator)(
      cluster, deadline, timeout_s)
  jax.distributed.initialize(cluster.coordinator_address, cluster.num_processes,
                             cluster.process_id,
                             initialization_timeout=max(1, int(deadline - time.monotonic())),
                             heartbeat_timeout_seconds=heartbeat_timeout_s)


def _gather_at_coordinator(cluster: Cluster, deadline: float, timeout_s: float) -> None:
  """Process 0: waits until every other process has said hello, then lets them go."""
  arrived: dict[int, socket.socket] = {}
  try:
    server = socket.create_server(('', cluster.port + 1))
  except OSError as e:
    raise OSError(f'process 0 cannot listen at port {cluster.port + 1} (the coordinator\'s port '
                  f'+ 1) for the other processes: {e}') from None
  with server:
    try:
      while len(arrived) < cluster.num_processes - 1:
        server.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
          connection, _ = server.accept()
        except TimeoutError:
          missing = sorted(set(range(1, cluster.num_processes)) - set(arrived))
          message = (f'process(es) {", ".join(map(str, missing))} of {cluster.num_processes} '
                     f'did not arrive at {cluster.host}:{cluster.port + 1} within {timeout_s:g} s')
          for peer in arrived.values():
            _send(peer, message)
          raise TimeoutError(message) from None
        connection.settimeout(max(deadline - time.monotonic(), 0.001))
        hello = _receive(connection).split()
        count, index = (int(hello[-2]), int(hello[-1])) if len(hello) == 4 else (None, None)
        if count != cluster.num_processes or index in arrived or not 0 < index < count:
          message = (f'process 0 of {cluster.num_processes} met a process that says '
                     f'{" ".join(hello)!r}: the processes disagree on the count, or an id repeats')
          _send(connection, message)
          raise ValueError(message)
        arrived[index] = connection
      for peer in arrived.values():
        _send(peer, _GO)
    finally:
      for peer in arrived.values():
        peer.close()


def _report_to_coordinator(cluster: Cluster, deadline: float, timeout_s: float) -> None:
  """Process i > 0: says hello to process 0 (retrying until it listens), waits for go."""
  address = (cluster.host, cluster.port + 1)
  while True:
    try:
      connection = socket.create_connection(address, timeout=max(deadline - time.monotonic(), 0.001))
      break
    except OSError:
      if time.monotonic() >= deadline:
        raise TimeoutError(f'process 0 (the coordinator) did not listen at {address[0]}:'
                           f'{address[1]} within {timeout_s:g} s') from None
      time.sleep(0.2)
  with connection:
    _send(connection, f'{_HELLO} {cluster.num_processes} {cluster.process_id}')
    # Process 0 answers by its own deadline, which can fall a little after this one's.
    connection.settimeout(max(deadline - time.monotonic(), 0.001) + _ANSWER_GRACE_S)
    try:
      answer = _receive(connection)
    except TimeoutError:
      raise TimeoutError(f'process 0 did not let process {cluster.process_id} go within '
                         f'{timeout_s:g} s') from None
  if answer != _GO:
    raise (TimeoutError if 'did not arrive' in answer else ValueError)(
        answer or 'process 0 closed the rendezvous without an answer')


def _send(connection: socket.socket, line: str) -> None:
  try:
    connection.sendall(line.encode() + b'\n')
  except OSError:
    pass  # A peer that left learns nothing; its own timeout ends it.


def _receive(connection: socket.socket) -> str:
  data = b''
  while not data.endswith(b'\n'):
    chunk = connection.recv(4096)
    if not chunk:
      break
    data += chunk
  return data.decode(errors='replace').strip()


def host_rows(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> np.ndarray:
  """The rows (axis 0) of a global array of `shape` that this host's devices hold.

  Args:
    sharding: the array's sharding, e.g. `sharding.batch_sharding(mesh, rules, shape)`.
    shape: the global shape [B, ...].

  Returns:
    [R] int, ascending row indices; all B rows where rows are not split.
  """
  rows = set()
  for index in sharding.addressable_devices_indices_map(shape).values():
    rows.update(range(shape[0])[index[0]] if index else range(shape[0]))
  return np.asarray(sorted(rows), np.int64)


def global_array(host_data: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...],
                 sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array built from the rows this host holds (no host sees the others').

  Args:
    host_data: rows [R] int -> the array's values at those rows, [R, ...];
      called with this host's rows only (`host_rows`).
    shape: the global shape [B, ...].
    sharding: where the array lies.

  Returns:
    A jax.Array of `shape` over every host's devices.
  """
  rows = host_rows(sharding, shape)
  values = np.asarray(host_data(rows))
  if values.shape != (len(rows),) + tuple(shape[1:]):
    raise ValueError(f'host_data gave {values.shape} for {len(rows)} rows of a {shape} array')
  where = {row: i for i, row in enumerate(rows.tolist())}

  def shard(index):
    row_slice = index[0] if index else slice(None)
    local = [where[row] for row in range(shape[0])[row_slice]]
    return values[local][(slice(None),) + tuple(index[1:])]

  return jax.make_array_from_callback(tuple(shape), sharding, shard)


def gather(tree: Any) -> Any:
  """A pytree of global arrays as NumPy arrays, whole on every host.

  Arrays split over several hosts are all-gathered
  (`multihost_utils.process_allgather`); others are read as they are. Every
  process must call it with the same tree (it runs collectives).
  """
  def whole(x):
    if getattr(x, 'is_fully_addressable', True):
      return jax.device_get(x)
    return multihost_utils.process_allgather(x, tiled=True)

  return jax.tree.map(whole, tree)
