"""Runs a file of scripts/ as a user would, and reads the Markdown tables it prints."""

import pathlib
import subprocess
import sys

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
