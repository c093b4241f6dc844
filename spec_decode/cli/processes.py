"""The processes of one command-line run: they join agreeing, and they end together.

With NUM_PROCESSES > 1 every process runs the same command. `join` meets the
others at process 0's rendezvous (spec_decode.rendezvous) with a fingerprint
of what must be the same everywhere: the settings that shape the computation
and a digest of the inputs as read and tokenized. A difference, or a process
whose own checks failed (`join(failure=...)`), stops every process there
with the same `error:` line, before any model loads or JAX starts.

From then on a process that fails tells the others (`failed`, from the
command line's error handler) and leaves at once (`leave`: JAX's shutdown
would wait for the others); the others, hearing it or seeing its connection
close (killed, crashed), print one `error:` line with what the output holds
and exit 1, or 0 with a note where the output was complete already.
"""

import hashlib
import json
import os
import sys
from typing import Any

from spec_decode import multihost
from spec_decode.cli import settings as infer_settings
from spec_decode.cli.gin_utils import ConfigError

# COORDINATOR_ADDRESS that lets JAX find the cluster itself (Cloud TPU pod slices, SLURM, ...).
AUTO = 'auto'

# Settings that may differ between the processes of a run: their own, or compared otherwise
# (the inputs by their contents, not the file's path).
_OWN = ('process_id', 'coordinator_address', 'num_processes', 'process_timeout_s',
        'heartbeat_timeout_s', 'memory_limit_gb', 'output_file', 'input_file', 'vocabulary')


class _Output:
  """The output this process writes (or discards) and how many records it will hold."""

  out: Any = None
  total = 0


_OUTPUT = _Output()


def cluster_of(settings: dict[str, Any]) -> 'multihost.Cluster | None | str':
  """The run's cluster; None for one process, AUTO where JAX finds it.

  Raises:
    ConfigError: NUM_PROCESSES or PROCESS_ID without COORDINATOR_ADDRESS, a
      bad address, or a bad JAX_* environment.
  """
  address, count, index = (settings[k] for k in ('coordinator_address', 'num_processes',
                                                 'process_id'))
  try:
    if address == AUTO:
      return AUTO
    if address is None:
      if count != 1 or index:
        raise ConfigError('NUM_PROCESSES and PROCESS_ID need a COORDINATOR_ADDRESS (host:port '
                          f'of process 0, or {AUTO!r} on a Cloud TPU pod slice)')
      cluster = multihost.Cluster.from_env()
      return None if cluster is None or cluster.num_processes == 1 else cluster
    cluster = multihost.Cluster(address, count, index)
    return None if count == 1 else cluster
  except ValueError as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(f'joining the other processes: {e}') from None


def join(settings: dict[str, Any], *, fingerprint: dict[str, Any] | None = None,
         failure: str | None = None) -> None:
  """Joins the other processes of a multi-process run; nothing for one process.

  The cluster comes from COORDINATOR_ADDRESS, NUM_PROCESSES and PROCESS_ID,
  or where COORDINATOR_ADDRESS is None from JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID in the environment.

  Args:
    settings: the run's settings.
    fingerprint: what every process must agree on (`fingerprint`).
    failure: this process's own error, to stop the others with (then this
      raises a ConfigError naming it on every process).

  Raises:
    ConfigError: a bad cluster, a multi-process run without a mesh or with
      beam search, a process that did not arrive within PROCESS_TIMEOUT_S, a
      process that failed its checks, settings or inputs that differ, or a
      busy coordinator port (each named, the same line on every process).
  """
  cluster = cluster_of(settings)
  if cluster is None:
    return
  if settings['decode'] == 'beam':  # a cluster from the environment
    raise ConfigError(infer_settings.BEAM_ONE_PROCESS)
  if not settings['model_parallel']:
    raise ConfigError('a run over several processes needs a mesh: set MODEL_PARALLEL >= 1 '
                      '(include runs/sharded/mesh.gin)')
  try:
    multihost.initialize(None if cluster == AUTO else cluster,
                         timeout_s=settings['process_timeout_s'],
                         heartbeat_timeout_s=int(settings['heartbeat_timeout_s']),
                         fingerprint=fingerprint, failure=failure, on_failure=_on_failure)
  except (ValueError, TimeoutError, OSError) as e:
    raise ConfigError(f'joining the other processes: {e}') from None


def fingerprint(settings: dict[str, Any], vocabulary: Any, examples: list[Any]) -> dict[str, Any]:
  """What the processes of one run must agree on, by the names an error shows.

  Every setting that shapes the computation (gin's names; a config by its
  fields), the vocabulary (its file's sha256 where it has one), and the
  inputs as read and tokenized (their count and sha256), not the input
  file's path.
  """
  shown = {name.upper(): repr(value) for name, value in sorted(settings.items())
           if name not in _OWN}
  model_file = getattr(vocabulary, 'sentencepiece_model_file', None)
  try:
    with open(model_file, 'rb') as f:
      shown['VOCABULARY'] = 'sha256 ' + hashlib.sha256(f.read()).hexdigest()[:16]
  except (OSError, TypeError):  # no local file: its kind and size
    shown['VOCABULARY'] = f'{type(vocabulary).__name__} of {vocabulary.vocab_size} ids'
  inputs = json.dumps([[e.line, e.fields, e.tokens] for e in examples], sort_keys=True)
  shown['the inputs (INPUT_FILE, tokenized)'] = (
      f'{len(examples)} lines, sha256 {hashlib.sha256(inputs.encode()).hexdigest()[:16]}')
  return shown


def stop_others(settings: dict[str, Any], failure: str) -> None:
  """A process of several whose own checks failed: tells the others, raises the run's error.

  Nothing happens for one process, or where the cluster settings themselves
  are bad (no rendezvous to tell): the caller raises its own error then.

  Raises:
    ConfigError: the error of every process, naming this one's failure.
  """
  try:
    if cluster_of(settings) is None:
      return
    join(settings, failure=failure)
  except ConfigError as e:
    if e.message.startswith('joining the other processes: '):
      raise
  except Exception:  # pylint: disable=broad-except; settings too broken to join with
    pass


def writing(out: Any, total: int) -> None:
  """This process's output, for the line a failure elsewhere prints (what it holds)."""
  _OUTPUT.out, _OUTPUT.total = out, total


def failed(message: str) -> None:
  """This process failed (`message`, its error line): tells the others, if any."""
  multihost.finish(message.splitlines()[0] if message else 'failed')


def leave(status: int) -> int:
  """The exit status; a failed process of several leaves now, a finished one says so.

  A process that failed exits at once (os._exit, streams flushed): JAX's
  shutdown would wait for the others, which end on hearing it.
  """
  if not multihost.joined():
    return status
  if status:
    _exit(status)
  multihost.finish()
  return status


def _on_failure(message: str) -> None:
  """Another process failed or left: one line with what the output holds, then exit."""
  out = _OUTPUT.out
  start = '\n' if out is not None else ''  # after a progress bar's line
  if out is not None and getattr(out, 'complete', False):
    print(f'{start}note: {message}, after {out.path} was complete', file=sys.stderr)
    _exit(0)
  held = 'no output was opened yet' if out is None else out.abort(_OUTPUT.total)
  print(f'{start}error: {message}; {held}', file=sys.stderr)
  _exit(1)


def _exit(status: int) -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(status)  # pylint: disable=protected-access
