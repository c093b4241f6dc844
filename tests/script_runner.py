"""Runs a file of scripts/ as a user would, and reads the Markdown tables it prints.

`load` imports a script as a module, for tests of its functions.
"""

import functools
import importlib.util
import pathlib
import subprocess
import sys
import types

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / 'scripts'


def run(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
  """`python scripts/<name> args...`, its stdout and stderr captured as text."""
  return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True,
                        text=True, timeout=timeout)


def table_rows(stdout: str, first: str = '') -> list[list[str]]:
  """The stripped cells of every table line starting with `| first`, separators left out."""
  rows = [[cell.strip() for cell in line.split('|')[1:-1]] for line in stdout.splitlines()
          if line.startswith(f'| {first}')]
  return [row for row in rows if not all(set(cell) <= {'-'} for cell in row)]


@functools.cache
def load(name: str) -> types.ModuleType:
  """scripts/<name> imported as a module (its main() not run), once per process."""
  path = SCRIPTS / name
  spec = importlib.util.spec_from_file_location(name.removesuffix('.py').replace('/', '.'), path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module
