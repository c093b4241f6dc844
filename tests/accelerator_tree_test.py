"""Tests for scripts/accelerator_tree.py: a checkout trimmed for a copy of bounded size, restored."""

import subprocess

import pytest

from tests import script_runner

accelerator_tree = script_runner.load('accelerator_tree.py')


def _git(root, *args):
  return subprocess.run(['git', *args], cwd=root, check=True, capture_output=True,
                        text=True).stdout


@pytest.fixture(name='repo')
def _repo(tmp_path):
  files = {'spec_decode/data/models/target/w': 4000, 'spec_decode/data/models/draft_large/w': 3000,
           'spec_decode/data/models/lm_target/a b': 2000, 'docs/results/x/report.md': 1000,
           'docs/results/y.md': 500, 'README.md': 100}
  for name, n in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b'x' * n)
  _git(tmp_path, 'init', '-q')
  _git(tmp_path, 'add', '.')
  _git(tmp_path, '-c', 'user.email=a@b', '-c', 'user.name=a', 'commit', '-qm', 'start')
  (tmp_path / 'notes.txt').write_bytes(b'x' * 50)  # untracked, not ignored: a copy sends it
  return tmp_path


def test_trim_leaves_out_the_paths_until_restore_and_refuses_commits_meanwhile(repo):
  exclude = repo / '.git' / 'info' / 'exclude'
  before = exclude.read_text() if exclude.exists() else ''
  assert accelerator_tree.size(repo)[0] == 10650
  untracked = accelerator_tree.trim(repo)
  assert sorted(untracked) == ['docs/results/x/report.md', 'docs/results/y.md',
                               'spec_decode/data/models/draft_large/w',
                               'spec_decode/data/models/lm_target/a b']
  total, parts = accelerator_tree.size(repo)
  assert total == 4150 and set(parts) == {'spec_decode/data/models/target', 'README.md',
                                          'notes.txt'}
  assert all((repo / p).read_bytes() for p in untracked)  # still on disk, unchanged
  assert _git(repo, 'status', '--porcelain', '--untracked-files=all').splitlines() == [
      'D  docs/results/x/report.md', 'D  docs/results/y.md',
      'D  spec_decode/data/models/draft_large/w', 'D  "spec_decode/data/models/lm_target/a b"',
      '?? notes.txt']
  commit = subprocess.run(['git', '-c', 'user.email=a@b', '-c', 'user.name=a', 'commit', '-qm',
                           'x'], cwd=repo, capture_output=True, text=True)
  assert commit.returncode != 0 and 'accelerator_tree.py restore' in commit.stderr
  with pytest.raises(accelerator_tree.TreeError, match='already trimmed'):
    accelerator_tree.trim(repo)

  assert sorted(accelerator_tree.restore(repo)) == sorted(untracked)
  assert _git(repo, 'status', '--porcelain').splitlines() == ['?? notes.txt']
  assert exclude.read_text() == before
  assert not (repo / '.git' / 'hooks' / 'pre-commit').exists()
  assert accelerator_tree.size(repo)[0] == 10650
  with pytest.raises(accelerator_tree.TreeError, match='nothing to restore'):
    accelerator_tree.restore(repo)


def test_keep_sends_a_trimmed_path_and_a_hook_of_ones_own_stops_trim(repo):
  untracked = accelerator_tree.trim(repo, keep=['spec_decode/data/models/draft_large/'])
  assert 'spec_decode/data/models/draft_large/w' not in untracked and len(untracked) == 3
  accelerator_tree.restore(repo)
  hook = repo / '.git' / 'hooks' / 'pre-commit'
  hook.write_text('#!/bin/sh\nexit 0\n')
  with pytest.raises(accelerator_tree.TreeError, match='move that one aside'):
    accelerator_tree.trim(repo)
  assert _git(repo, 'status', '--porcelain').splitlines() == ['?? notes.txt']


def test_the_command_line_prints_what_is_sent(repo):
  done = script_runner.run('accelerator_tree.py', 'trim', '--root', str(repo))
  assert done.returncode == 0 and 'untracked 4 files' in done.stdout
  assert '0.00 MiB sent in all' in done.stdout  # 4,150 bytes
  again = script_runner.run('accelerator_tree.py', 'trim', '--root', str(repo))
  assert again.returncode == 1 and 'error: already trimmed' in again.stderr
  done = script_runner.run('accelerator_tree.py', 'restore', '--root', str(repo))
  assert done.returncode == 0 and 'tracked 4 files again' in done.stdout
