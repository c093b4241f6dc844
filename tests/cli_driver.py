"""Runs scripts/decode.py's `main` once per case, all cases in this one process.

  python tests/cli_driver.py cases.json > results.json

cases.json maps a case name to {"flags": [...]} and optionally
  "signal": [signum, path, records]  send this process signum once the file
                                     at path holds that many lines;
  "max_file_bytes": n                files may not grow past n bytes (a full
                                     disk: writes fail with EFBIG);
  "env": {"NAME": "value", ...}      environment variables set for the case
                                     (SPEC_DECODE_CPU_KERNELS is read when a
                                     function is traced: each run traces anew).
Prints {"name": {"rc": int, "stderr": str}, ...}; rc is None, and stderr ends
with the traceback, when `main` raised. Each case starts from a clear gin
config. One process for all cases saves the ~10 s every decode.py process
spends importing jax and the package; the signals are real ones, caught by
the handlers `main` installs.
"""

import contextlib
import io
import json
import os
import pathlib
import resource
import signal
import sys
import threading
import traceback

import gin

from spec_decode.cli import infer


def _signal_when(signum: int, path: str, records: int) -> threading.Event:
  """Sends this process signum once `path` has `records` lines, unless the returned event is set."""
  stop = threading.Event()

  def watch():
    file = pathlib.Path(path)
    while not (file.exists() and file.read_text().count('\n') >= records):
      if stop.wait(0.005):
        return
    os.kill(os.getpid(), signum)

  threading.Thread(target=watch, daemon=True).start()
  return stop


@contextlib.contextmanager
def _environment(values: dict[str, str]):
  saved = {name: os.environ.get(name) for name in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for name, value in saved.items():
      if value is None:
        os.environ.pop(name, None)
      else:
        os.environ[name] = value


@contextlib.contextmanager
def _file_size_limit(limit: int | None):
  if limit is None:
    yield
    return
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails, EFBIG
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, handler)


def main() -> None:
  with open(sys.argv[1], encoding='utf-8') as f:
    cases = json.load(f)
  results = {}
  for name, case in cases.items():
    gin.clear_config()
    stop = _signal_when(*case['signal']) if 'signal' in case else threading.Event()
    stderr = io.StringIO()
    with (contextlib.redirect_stderr(stderr), _file_size_limit(case.get('max_file_bytes')),
          _environment(case.get('env', {}))):
      try:
        rc = infer.main(case['flags'])
      except Exception:  # pylint: disable=broad-except; reported as this case's result
        rc = None
        traceback.print_exc()
    stop.set()
    results[name] = {'rc': rc, 'stderr': stderr.getvalue()}
  json.dump(results, sys.stdout)


if __name__ == '__main__':
  main()
