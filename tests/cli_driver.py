"""Runs scripts/decode.py's `main` once per command line, in this one process.

  python tests/cli_driver.py cases.json > results.json

cases.json: {"name": [flag, ...], ...}. Prints {"name": {"rc": int,
"stderr": str}, ...}. Each run starts from a clear gin config. One process for
all the cases saves the ~10 s every decode.py process spends importing seqio
(and TensorFlow); cli_test.py runs the cases that need a process of their own
(signals, a file size limit) as scripts/decode.py itself.
"""

import contextlib
import io
import json
import sys

import gin

from spec_decode import infer


def main() -> None:
  with open(sys.argv[1], encoding='utf-8') as f:
    cases = json.load(f)
  results = {}
  for name, flags in cases.items():
    gin.clear_config()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      rc = infer.main(flags)
    results[name] = {'rc': rc, 'stderr': stderr.getvalue()}
  json.dump(results, sys.stdout)


if __name__ == '__main__':
  main()
