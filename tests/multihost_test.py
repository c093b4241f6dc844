"""Decoding over two processes on localhost, against one process with the same 8 devices.

The decoding runs are subprocesses (tests/multihost_worker.py and the command
line): 2 processes x 4 CPU devices must give the tokens of 1 process x 8
devices, for speculative, baseline and speculative beam decoding, greedy and
sampled, with the target split across the processes; a killed process or one
that never arrives makes the others exit non-zero, in bounded time, naming it.
"""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from spec_decode import multihost

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).with_name('multihost_worker.py')
TIMEOUT_S = 300  # per run of two processes; they take ~1-2 min on 2 cores


def free_port() -> int:
  """A port p with p and p + 1 free (the coordinator's and the rendezvous')."""
  for _ in range(100):
    with socket.socket() as s:
      s.bind(('localhost', 0))
      port = s.getsockname()[1]
    try:
      with socket.socket() as s:
        s.bind(('localhost', port + 1))
      return port
    except OSError:
      continue
  raise RuntimeError('no two consecutive free ports')


def run_processes(commands: list[list[str]], envs: list[dict[str, str]],
                  timeout_s: float = TIMEOUT_S) -> list[tuple[int, str, float]]:
  """Runs the commands at once; (exit status, stderr, seconds) of each."""
  start = time.monotonic()
  procs = [subprocess.Popen(c, cwd=ROOT, env={**os.environ, **e}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for c, e in zip(commands, envs)]
  results = []
  try:
    for p in procs:
      _, err = p.communicate(timeout=max(timeout_s - (time.monotonic() - start), 1))
      results.append((p.returncode, err, time.monotonic() - start))
  finally:
    for p in procs:
      p.kill()
  return results


def worker(workdir, count: int, port: int, mode: str = 'decode'):
  commands = [[sys.executable, str(WORKER), str(workdir), str(count), str(i), str(port), mode]
              for i in range(count)]
  return run_processes(commands, [{}] * count)


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """The reference run (1 process, 8 devices): checkpoints and decoded_1.json."""
  path = tmp_path_factory.mktemp('multihost')
  [(status, err, _)] = worker(path, 1, 0)
  assert status == 0, err[-3000:]
  return path


def test_two_processes_decode_as_one(workdir):
  results = worker(workdir, 2, free_port())
  for status, err, _ in results:
    assert status == 0, err[-3000:]
  one = json.loads((workdir / 'decoded_1.json').read_text())
  two = json.loads((workdir / 'decoded_2.json').read_text())
  assert sorted(two) == ['baseline_greedy', 'baseline_sampled', 'lm_speculative_greedy',
                         'lm_speculative_sampled', 'speculative_beam', 'speculative_greedy',
                         'speculative_sampled']
  assert {name: two[name] == one[name] for name in two} == {name: True for name in two}
  for name in ('greedy', 'sampled'):  # the decoder-only pair over the mesh == on one device
    assert one[f'lm_speculative_{name}'] == one[f'lm_one_device_{name}']
  assert one['speculative_greedy'] == one['baseline_greedy']  # the runs are not trivial
  assert one['speculative_sampled'] != one['baseline_greedy']


def cli(workdir, count: int, index: int, port: int, *bindings: str) -> list[str]:
  return [sys.executable, 'scripts/decode.py', '--gin_file=runs/sharded/tiny_cpu.gin',
          '--gin_file=runs/sharded/processes.gin',
          f"--gin.TARGET_CHECKPOINT='{workdir / 'tiny'}'",
          f"--gin.DRAFT_CHECKPOINT='{workdir / 'nano'}'", '--gin.TEMPERATURE=1.0',
          '--gin.MAX_DECODE_LEN=12', f"--gin.INPUT_FILE='{workdir / 'inputs.txt'}'",
          f"--gin.OUTPUT_FILE='{workdir / f'out_{count}.jsonl'}'",
          f"--gin.COORDINATOR_ADDRESS='localhost:{port}'", f'--gin.NUM_PROCESSES={count}',
          f'--gin.PROCESS_ID={index}', *bindings]


def test_command_line_over_two_processes(workdir):
  """MODEL_PARALLEL 4 over 8 devices: each process holds one replica's rows."""
  (workdir / 'inputs.txt').write_text('\n'.join(
      ['A man rides a bicycle.', 'Two dogs play in the snow.', 'Hello.'] * 4) + '\n')
  port = free_port()
  [(status, err, _)] = run_processes([cli(workdir, 1, 0, port)], [{'JAX_NUM_CPU_DEVICES': '8'}])
  assert status == 0, err[-3000:]
  results = run_processes([cli(workdir, 2, i, port) for i in range(2)],
                          [{'JAX_NUM_CPU_DEVICES': '4'}] * 2)
  for status, err, _ in results:
    assert status == 0, err[-3000:]
  one, two = ([json.loads(line) for line in (workdir / f'out_{n}.jsonl').read_text().splitlines()]
              for n in (1, 2))
  assert len(two) == 12 and [r['output_ids'] for r in two] == [r['output_ids'] for r in one]
  assert len({tuple(r['output_ids']) for r in one}) > 3  # sampled, not all alike
  assert 'tokens per target call' in results[0][1]  # process 0 prints the summary,
  assert 'tokens per target call' not in results[1][1]  # the others do not
  assert not list(workdir.glob('*.incomplete'))


def test_a_killed_process_stops_the_others_naming_it(workdir):
  """Process 1 exits after joining; process 0 hears its connection close and ends at once."""
  [(status0, err0, seconds), (status1, _, _)] = worker(workdir, 2, free_port(), 'die')
  assert status1 == 9
  assert status0 == 1, err0[-3000:]
  assert seconds < 90  # the joining, then seconds (JAX's heartbeats would take 10 s more)
  assert ('error: process 1 of 2 left the run without finishing (killed or crashed, or its host '
          'failed)') in err0, err0[-3000:]


def _error_lines(err: str) -> list[str]:
  return [line for line in err.splitlines() if line.startswith('error: ')]


def _lines_file(path: pathlib.Path, lines: list[str]) -> str:
  path.write_text('\n'.join(lines) + '\n')
  return f"--gin.INPUT_FILE='{path}'"


@pytest.mark.parametrize('differ, named', [
    (['--gin.SEED=1'], 'the processes disagree on SEED (process 0: 0; process 1: 1): every '
                       'process of a run needs the same settings and inputs'),
    (['--gin.GAMMA=3', '--gin.TEMPERATURE=0.5'],
     'the processes disagree on GAMMA (process 0: 4; process 1: 3), TEMPERATURE (process 0: 1.0; '
     'process 1: 0.5)'),
    ('same_length', 'the processes disagree on the inputs (INPUT_FILE, tokenized) (process 0: 4 '
                    'lines, sha256 '),
    ('fewer_lines', 'the processes disagree on the inputs (INPUT_FILE, tokenized) (process 0: 4 '
                    'lines, sha256 '),
    ('blank_line', 'process 1 of 2 failed its checks: {w}/inputs_1.txt line 2: a blank line'),
])
def test_processes_that_differ_stop_together_before_loading(workdir, tmp_path, differ, named):
  """One error line on both processes, naming what differs, within seconds; no output."""
  inputs = ['A man rides a bicycle.', 'Two dogs play.', 'Hello.', 'A cat sleeps.']
  own = {'same_length': inputs[::-1], 'fewer_lines': inputs[:3],
         'blank_line': [inputs[0], '', inputs[1]]}.get(differ) if isinstance(differ, str) else None
  port = free_port()
  flags = [[_lines_file(tmp_path / 'inputs_0.txt', inputs)],
           [_lines_file(tmp_path / 'inputs_1.txt', own)] if own else
           [_lines_file(tmp_path / 'inputs_0.txt', inputs), *differ]]
  commands = [cli(workdir, 2, i, port, f"--gin.OUTPUT_FILE='{tmp_path / 'out_2.jsonl'}'",
                  *flags[i]) for i in range(2)]
  results = run_processes(commands, [{'JAX_NUM_CPU_DEVICES': '4'}] * 2, 120)
  for status, err, seconds in results:
    assert status == 1, err[-3000:]
    [line] = _error_lines(err)
    assert line.startswith('error: joining the other processes: ' + named.format(w=tmp_path)), line
    assert 'Traceback' not in err
  assert results[-1][2] < 60  # the imports and the rendezvous; nothing loads or compiles
  assert not list(tmp_path.glob('out_*'))


def test_a_busy_coordinator_port_is_named_on_every_process(workdir, tmp_path):
  inputs = _lines_file(tmp_path / 'inputs.txt', ['Hello.'])
  port = free_port()
  with socket.create_server(('', port)):
    results = run_processes(
        [cli(workdir, 2, i, port, inputs, f"--gin.OUTPUT_FILE='{tmp_path / 'out.jsonl'}'")
         for i in range(2)], [{'JAX_NUM_CPU_DEVICES': '4'}] * 2, 120)
  for status, err, _ in results:
    assert status == 1, err[-3000:]
    [line] = _error_lines(err)
    assert line == (f"error: joining the other processes: process 0 cannot start JAX's "
                    f'coordination service: port {port} (the COORDINATOR_ADDRESS port) is busy '
                    '(Address already in use); choose a free port'), line
  assert not list(tmp_path.glob('out*'))


def test_a_process_killed_mid_run_ends_process_0_saying_what_the_output_holds(workdir, tmp_path):
  """Process 1 is killed once process 0 has written a record: process 0 ends at once."""
  inputs = _lines_file(tmp_path / 'inputs.txt', ['A man rides a bicycle.', 'Hello.'] * 150)
  out = tmp_path / 'out_2.jsonl'
  port = free_port()
  commands = [cli(workdir, 2, i, port, '--gin.MODEL_PARALLEL=4', '--gin.BATCH_SIZE=2', inputs,
                  f"--gin.OUTPUT_FILE='{out}'") for i in range(2)]
  procs = [subprocess.Popen(c, cwd=ROOT, env={**os.environ, 'JAX_NUM_CPU_DEVICES': '4'},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for c in commands]
  try:
    partial = pathlib.Path(f'{out}.incomplete')
    deadline = time.monotonic() + TIMEOUT_S
    while not (partial.exists() and partial.read_text().count('\n') >= 2):
      assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].stderr.read()
      time.sleep(0.05)
    procs[1].kill()
    killed = time.monotonic()
    _, err = procs[0].communicate(timeout=TIMEOUT_S)
    seconds = time.monotonic() - killed
  finally:
    for p in procs:
      p.kill()
      p.communicate()
  assert procs[0].returncode == 1, err[-3000:]
  [line] = _error_lines(err) or [err[-3000:]]
  records = partial.read_text().count('\n')
  assert line == (f'error: process 1 of 2 left the run without finishing (killed or crashed, or '
                  f'its host failed); {out} was not written; the first {records} of 300 records '
                  f'(the last line possibly cut) are in {partial}'), line
  assert 2 <= records < 300 and not out.exists()
  assert seconds < 30  # at once, not after HEARTBEAT_TIMEOUT_S (100 s)


_AGREE = '''
import sys
import jax
from spec_decode import multihost
index, port, seed, failure = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
jax.distributed.initialize(f'localhost:{port}', 2, index, initialization_timeout=60)
try:
  multihost.agree({'SEED': seed, 'GAMMA': 4}, failure)
  print('agreed')
except ValueError as e:
  print(f'error: {e}')
'''


@pytest.mark.parametrize('seeds, failures, expected', [
    ((0, 0), ('', ''), ['agreed', 'agreed']),
    ((0, 1), ('', ''), ['error: the processes disagree on SEED (process 0: digest '] * 2),
    ((0, 0), ('', 'line 2: a blank line'),
     ['error: process 1 of 2 failed its checks: its own error says why',
      'error: line 2: a blank line']),
])
def test_processes_jax_joined_compare_digests(seeds, failures, expected):
  """Where JAX finds the cluster (no rendezvous), the fingerprints' digests are compared."""
  port = free_port()
  commands = [[sys.executable, '-c', _AGREE, str(i), str(port), str(seeds[i]), failures[i]]
              for i in range(2)]
  env = {**os.environ, 'JAX_NUM_CPU_DEVICES': '1'}
  procs = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for c in commands]
  outputs = [p.communicate(timeout=120) for p in procs]
  for (out, err), wanted in zip(outputs, expected):
    assert out.strip().splitlines()[-1].startswith(wanted), (out, err[-2000:])  # after Gloo's


def test_a_process_that_never_arrives_is_named():
  """Processes 0 and 1 of 3 wait 2 s for process 2, then both name it."""
  port, errors = free_port(), {}

  def join(index):
    try:
      multihost.initialize(multihost.Cluster(f'localhost:{port}', 3, index), timeout_s=2)
    except TimeoutError as e:
      errors[index] = str(e)

  threads = [threading.Thread(target=join, args=(i,)) for i in (0, 1)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  expected = f'process(es) 2 of 3 did not arrive at localhost:{port + 1} within 2 s'
  assert errors == {0: expected, 1: expected}


def test_without_process_0_the_others_name_it():
  with pytest.raises(TimeoutError, match='process 0 .* did not listen .* within 1 s'):
    multihost.initialize(multihost.Cluster(f'localhost:{free_port()}', 2, 1), timeout_s=1)


def test_command_line_names_the_missing_process(tmp_path):
  """Process 0 of 2 alone: exit 1 within PROCESS_TIMEOUT_S, naming process 1, no output."""
  (tmp_path / 'inputs.txt').write_text('Hello.\n')
  command = cli(tmp_path, 2, 0, free_port(), '--gin.PROCESS_TIMEOUT_S=2')
  [(status, err, seconds)] = run_processes([command], [{'JAX_NUM_CPU_DEVICES': '4'}], 120)
  assert status == 1, err[-3000:]
  assert 'error: joining the other processes: process(es) 1 of 2 did not arrive' in err
  assert not list(tmp_path.glob('out_*'))


@pytest.mark.parametrize('cluster, message', [
    (('localhost', 2, 0), 'host:port'),
    (('localhost:0', 2, 0), 'host:port'),
    (('localhost:99999', 2, 0), 'host:port'),
    (('localhost:1234', 0, 0), 'num_processes must be an integer >= 1'),
    (('localhost:1234', 2, 2), 'process_id 2 is not below num_processes 2'),
    (('localhost:1234', 2, -1), 'process_id must be an integer >= 0'),
    (('localhost:1234', 2.0, 0), 'num_processes must be an integer'),
])
def test_bad_clusters_are_named(cluster, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    multihost.Cluster(*cluster)


def test_cluster_from_the_environment():
  assert multihost.Cluster.from_env({}) is None
  env = {multihost.ENV_ADDRESS: 'h:5', multihost.ENV_COUNT: '4', multihost.ENV_ID: '3'}
  assert multihost.Cluster.from_env(env) == multihost.Cluster('h:5', 4, 3)
  with pytest.raises(ValueError, match='missing JAX_PROCESS_ID'):
    multihost.Cluster.from_env({k: v for k, v in env.items() if k != multihost.ENV_ID})
  with pytest.raises(ValueError, match='must be integers'):
    multihost.Cluster.from_env({**env, multihost.ENV_COUNT: 'four'})


def test_a_busy_rendezvous_port_is_named():
  port = free_port()
  with socket.create_server(('', port + 1)):
    with pytest.raises(OSError, match=f'process 0 cannot listen at port {port + 1}'):
      multihost.initialize(multihost.Cluster(f'localhost:{port}', 2, 0), timeout_s=1)
