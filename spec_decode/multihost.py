"""Decoding over several processes: one JAX process per host, as T5X runs pods.

Each host runs the same program. `initialize` joins the processes (a
rendezvous, `spec_decode.rendezvous`, that names any process that does not
arrive and compares what the processes must agree on, then
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
with the same mesh. A process that fails says so (`finish`), and one that
dies closes its rendezvous connections: either ends the others at once
(`initialize`'s on_failure). A host that vanishes without closing them is
JAX's to detect: its coordination service misses the heartbeats for
`heartbeat_timeout_s` and aborts every other process (exit status non-zero,
never a hang).
"""

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils

from spec_decode import rendezvous

# The environment variables `Cluster.from_env` reads (JAX's own names).
ENV_ADDRESS, ENV_COUNT, ENV_ID = 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'


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
               heartbeat_timeout_s: int = 100, fingerprint: Mapping[str, Any] | None = None,
               failure: str | None = None,
               on_failure: Callable[[str], None] | None = None) -> None:
  """Joins this process to the others; call it before anything else uses JAX.

  With a cluster (or one in the environment, `Cluster.from_env`) the
  processes first meet at process 0 (port + 1, `spec_decode.rendezvous`):
  they compare their fingerprints there, and one that has not arrived within
  `timeout_s` makes every other exit with a TimeoutError naming it. Then
  `jax.distributed.initialize` connects them, and the rendezvous'
  connections stay open for the run: a process that fails (`finish`) or
  whose connection closes ends the others at once through `on_failure`.
  Without either, JAX detects the cluster itself (a Cloud TPU pod slice,
  SLURM, ...) and the fingerprints are compared through JAX (`agree`).

  Args:
    cluster: the coordinator, process count and this process's id.
    timeout_s: how long a process waits for the others, in seconds.
    heartbeat_timeout_s: after this many seconds without a heartbeat from a
      process, JAX ends every other process with an error naming it.
    fingerprint: what the processes must agree on, name -> JSON value (the
      settings, a digest of the inputs); None agrees with anything.
    failure: why this process cannot run (its own check failed): every
      process then stops, the message naming this one, instead of waiting
      for it.
    on_failure: called once, on another thread, with a message when another
      process fails or leaves mid-run; it should end this process. The
      default prints `error: <message>` and exits with status 1.

  Raises:
    TimeoutError: a process did not arrive (named) or process 0 did not answer.
    ValueError: processes that disagree on the process count, one id twice,
      a failed process or fingerprints that differ (named, the same message
      on every process).
    OSError: process 0 cannot listen at the coordinator's port + 1, or the
      coordinator's port is busy (named).
  """
  global _CHANNEL
  cluster = cluster or Cluster.from_env()
  if cluster is None:
    jax.distributed.initialize(initialization_timeout=int(timeout_s),
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
    agree(fingerprint, failure)
    return
  if cluster.num_processes == 1:
    return
  deadline = time.monotonic() + timeout_s
  meet = dict(deadline=deadline, timeout_s=timeout_s, fingerprint=fingerprint, failure=failure)
  if cluster.process_id == 0:
    channel = rendezvous.gather(cluster.host, cluster.port + 1, cluster.num_processes,
                                coordinator_port=cluster.port, **meet)
  else:
    channel = rendezvous.report(cluster.host, cluster.port + 1, cluster.num_processes,
                                cluster.process_id, **meet)
  _CHANNEL = channel
  channel.watch(on_failure or _exit_on_failure)
  try:
    jax.distributed.initialize(cluster.coordinator_address, cluster.num_processes,
                               cluster.process_id,
                               initialization_timeout=max(1, int(deadline - time.monotonic())),
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
  except Exception as e:  # pylint: disable=broad-except; XLA raises its own runtime errors
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    if cluster.process_id == 0 and 'RPC server' in message:
      message = (f'process 0 cannot start JAX\'s coordination service at port {cluster.port} '
                 f'(the COORDINATOR_ADDRESS port): {message}')
    finish(message)
    raise OSError(message) from None


_CHANNEL: rendezvous.Channel | None = None


def _exit_on_failure(message: str) -> None:
  print(f'error: {message}', file=sys.stderr, flush=True)
  os._exit(1)  # pylint: disable=protected-access


def joined() -> bool:
  """Whether this process joined others through `initialize`'s rendezvous."""
  return _CHANNEL is not None


def finish(failure: str | None = None) -> None:
  """Tells the other processes that this one is done, or failed (`failure`, one line).

  Call it once this process's part of the run is over (process 0: the output
  written). After a failure, end the process without waiting for JAX's
  shutdown (which would wait for the others): the others end on hearing it.
  Nothing happens for a process that did not meet others at a rendezvous.
  """
  if _CHANNEL is not None:
    _CHANNEL.finish(failure)


def agree(fingerprint: Mapping[str, Any] | None, failure: str | None = None) -> None:
  """Compares the fingerprints of the processes JAX joined (no rendezvous), by names' digests.

  Every process must call it, after `jax.distributed.initialize` (it runs a
  collective). Only digests travel, so a difference names the entries and
  the processes, not the values, and a failure only the process.

  Raises:
    ValueError: a process failed, or the fingerprints differ: the same
      message on every process.
  """
  count = jax.process_count()
  if count == 1:
    if failure:
      raise ValueError(failure)
    return
  names = sorted(fingerprint or {})
  digests = [_digest(failure is not None)] + [_digest((fingerprint or {})[n]) for n in names]
  everyone = np.asarray(multihost_utils.process_allgather(
      np.asarray(digests, np.uint32)))  # [processes, 1 + names, 2]
  hellos = {i: {'failure': 'its own error says why' if (row[0] != _digest(False)).any() else None,
                'fingerprint': {n: 'digest ' + ''.join(f'{w:08x}' for w in row[1 + j])
                                for j, n in enumerate(names)}}
            for i, row in enumerate(everyone)}
  stop = rendezvous.verdict(hellos, count)
  if stop is not None:
    raise ValueError(failure or stop)


def _digest(value: Any) -> np.ndarray:
  """[2] uint32: 64 bits of the sha256 of the value's JSON."""
  digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
  return np.frombuffer(digest[:8], np.uint32)


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
