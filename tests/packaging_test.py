"""What a wheel install gets: gin files, manifests and data found without the checkout."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from spec_decode import data
from spec_decode.kernels import build

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _package(tmp_path, *, packaged=(), beside=(), setup_py=False):
  package = tmp_path / 'site' / 'spec_decode'
  package.mkdir(parents=True)
  for name in packaged:
    (package / name).mkdir()
  for name in beside:
    (package.parent / name).mkdir()
  if setup_py:
    (package.parent / 'setup.py').write_text('')
  return package


def test_a_wheel_finds_its_own_copy_not_a_library_of_the_same_name(tmp_path, monkeypatch):
  # site-packages/gin is the gin-config library; site-packages/spec_decode/gin is ours.
  package = _package(tmp_path, packaged=['gin'], beside=['gin'])
  monkeypatch.setattr(data, '_PACKAGE_DIR', package)
  assert data.repository_dir('gin') == package / 'gin'


def test_a_checkout_finds_the_folder_beside_the_package(tmp_path, monkeypatch):
  package = _package(tmp_path, beside=['gin'], setup_py=True)
  monkeypatch.setattr(data, '_PACKAGE_DIR', package)
  assert data.repository_dir('gin') == package.parent / 'gin'


def test_a_folder_beside_an_installed_package_is_not_ours(tmp_path, monkeypatch):
  monkeypatch.setattr(data, '_PACKAGE_DIR', _package(tmp_path, beside=['gin']))
  with pytest.raises(FileNotFoundError, match='no gin/ folder'):
    data.repository_dir('gin')


def test_the_wheel_carries_gin_files_manifests_data_and_the_entry_point(tmp_path):
  # Built from the tracked files alone, as from a fresh clone (no build/ or egg-info left over).
  clone = tmp_path / 'clone'
  tracked = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, check=True,
                           timeout=60).stdout.decode().split('\0')
  for name in filter(None, tracked):
    if (ROOT / name).is_file():
      (clone / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(ROOT / name, clone / name)
  done = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                         '-q', '-w', str(tmp_path), str(clone)], capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  [wheel] = tmp_path.glob('spec_decode-*.whl')
  with zipfile.ZipFile(wheel) as archive:
    names = set(archive.namelist())
    entry_points = next(archive.read(n).decode() for n in names if n.endswith('entry_points.txt'))
  gin_files = {p.relative_to(ROOT / 'gin').as_posix() for p in (ROOT / 'gin').rglob('*.gin')}
  assert {f'spec_decode/gin/{name}' for name in gin_files} <= names
  assert 'spec_decode/configs/paper_table2.json' in names
  bundled = {p.relative_to(ROOT).as_posix() for p in (ROOT / 'spec_decode' / 'data').rglob('*')
             if p.is_file() and '__pycache__' not in p.parts}
  assert 'spec_decode/data/models/target/target.decoder.decoder_norm.scale/.zarray' in bundled
  assert not bundled - names, sorted(bundled - names)[:5]
  assert 'spec-decode = spec_decode.' in entry_points
  kernel_files = {f'spec_decode/kernels/{os.path.basename(p)}'
                  for p in build.SOURCES + build.HEADERS}  # what an install compiles
  assert kernel_files <= names, sorted(kernel_files - names)
