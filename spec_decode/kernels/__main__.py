"""Builds and registers the CPU kernels now; prints the library's path (or why not)."""

import sys

from spec_decode.kernels import build

try:
  print(build.load())
except build.BuildError as e:
  print(f'error: {e}', file=sys.stderr)
  sys.exit(1)
