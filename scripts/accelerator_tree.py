r"""Sends less of this repository to a remote accelerator that takes a checkout of bounded size.

  python scripts/accelerator_tree.py size              # MiB a copy of the checkout sends
  python scripts/accelerator_tree.py trim              # untrack what the accelerator scripts never read
  python scripts/accelerator_tree.py trim --keep spec_decode/data/models/draft_large
  python scripts/accelerator_tree.py restore           # track it all again

Remote machines that copy a git checkout (its tracked files and the untracked
ones git does not ignore) may bound its size; one lent here took 64 MiB, and
the bundled checkpoints alone hold more. `trim` takes the files of TRIM (the
checkpoints and results that scripts/accelerator_check.sh and
scripts/accelerator_distill.sh with their defaults never read) out of git's
index and ignores them in .git/info/exclude: they stay on disk, unchanged, but
such a copy leaves them out. Nothing is committed. While trimmed, a pre-commit
hook refuses every commit (one would delete those files from the project);
`restore` puts the index entries back from HEAD and removes the exclusions and
the hook. The state lives in .git/accelerator_tree.json.

`size` counts what such a copy would send: `git ls-files --cached --others
--exclude-standard`, files present on disk.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
from typing import Sequence

# Paths the accelerator scripts do not read with their defaults: the larger demo draft, the
# language-model pair, the SmolLM2 draft, the committed results and figures.
TRIM = ('spec_decode/data/models/draft_large', 'spec_decode/data/models/lm_target',
        'spec_decode/data/models/lm_draft', 'spec_decode/data/models/smollm2_draft',
        'docs/results', 'docs/figures')
STATE = 'accelerator_tree.json'
BEGIN, END = '# accelerator_tree: trimmed paths', '# accelerator_tree: end'
HOOK = ('#!/bin/sh\n# accelerator_tree\necho "the checkout is trimmed for an accelerator: '
        'python scripts/accelerator_tree.py restore, then commit" >&2\nexit 1\n')


class TreeError(RuntimeError):
  """The checkout is not in the state the command needs (the message says why)."""


def git(root: pathlib.Path, *args: str) -> str:
  return subprocess.run(['git', *args], cwd=root, check=True, capture_output=True,
                        text=True).stdout


def _files(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
  """The state file, the pre-commit hook and info/exclude in the repository's git folder."""
  meta = (root / git(root, 'rev-parse', '--git-dir').strip()).resolve()
  return meta / STATE, meta / 'hooks' / 'pre-commit', meta / 'info' / 'exclude'


def size(root: pathlib.Path) -> tuple[int, dict[str, int]]:
  """Bytes a copy of the checkout sends, in all and by top-level folder (or file)."""
  parts: dict[str, int] = {}
  names = git(root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard').split('\0')
  for name in dict.fromkeys(n for n in names if n):
    path = root / name
    if path.is_file():
      top = '/'.join(name.split('/')[:4 if name.startswith('spec_decode/data/models/') else 2])
      parts[top] = parts.get(top, 0) + path.stat().st_size
  return sum(parts.values()), parts


def _under(path: str, prefix: str) -> bool:
  prefix = prefix.rstrip('/')
  return path == prefix or path.startswith(prefix + '/')


def trim(root: pathlib.Path, keep: Sequence[str] = ()) -> list[str]:
  """Untracks TRIM's files but those under `keep`; returns the paths untracked.

  Raises:
    TreeError: already trimmed, or a pre-commit hook of another's in the way.
  """
  state, hook, exclude = _files(root)
  if state.exists():
    raise TreeError(f'already trimmed ({state}): restore first')
  if hook.exists():
    raise TreeError(f'{hook} exists: trim installs its own pre-commit hook, move that one aside')
  tracked = git(root, 'ls-files', '-z', '--', *TRIM).split('\0')
  paths = [p for p in tracked if p and not any(_under(p, k) for k in keep)]
  if paths:
    subprocess.run(['git', 'rm', '-q', '--cached', '--pathspec-from-file=-',
                    '--pathspec-file-nul'], cwd=root, check=True,
                   input='\0'.join(paths), text=True)
  exclude.parent.mkdir(exist_ok=True)
  text = exclude.read_text() if exclude.exists() else ''
  exclude.write_text(text + ('' if not text or text.endswith('\n') else '\n') + '\n'.join(
      [BEGIN, *('/' + p for p in paths), END]) + '\n')
  hook.parent.mkdir(exist_ok=True)
  hook.write_text(HOOK)
  hook.chmod(0o755)
  state.write_text(json.dumps({'paths': paths}))
  return paths


def restore(root: pathlib.Path) -> list[str]:
  """Tracks the trimmed paths again from HEAD; returns them.

  Raises:
    TreeError: not trimmed.
  """
  state, hook, exclude = _files(root)
  if not state.exists():
    raise TreeError('not trimmed: nothing to restore')
  paths = json.loads(state.read_text())['paths']
  if paths:
    subprocess.run(['git', 'reset', '-q', '--pathspec-from-file=-', '--pathspec-file-nul'],
                   cwd=root, check=True, input='\0'.join(paths), text=True)
  lines = exclude.read_text().splitlines()
  if BEGIN in lines and END in lines:
    lines = lines[:lines.index(BEGIN)] + lines[lines.index(END) + 1:]
  exclude.write_text(''.join(line + '\n' for line in lines))
  if hook.exists() and '# accelerator_tree' in hook.read_text():
    hook.unlink()
  state.unlink()
  return paths


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('command', choices=['size', 'trim', 'restore'])
  parser.add_argument('--keep', nargs='+', default=[], metavar='PATH',
                      help='paths under TRIM to send all the same')
  parser.add_argument('--root', default=os.path.join(os.path.dirname(__file__), '..'))
  args = parser.parse_args(argv)
  root = pathlib.Path(git(pathlib.Path(args.root), 'rev-parse', '--show-toplevel').strip())
  try:
    if args.command == 'trim':
      print(f'untracked {len(trim(root, args.keep))} files (on disk still; restore to track them)')
    elif args.command == 'restore':
      print(f'tracked {len(restore(root))} files again')
  except TreeError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  total, parts = size(root)
  for name, n in sorted(parts.items(), key=lambda kv: -kv[1])[:8]:
    print(f'{n / 2**20:8.2f} MiB  {name}')
  print(f'{total / 2**20:8.2f} MiB sent in all')
  return 0


if __name__ == '__main__':
  sys.exit(main())
