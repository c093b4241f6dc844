"""Tests for scripts/plot_training.py: runs continued in a second workdir."""

import importlib.util
import json
import pathlib
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / 'scripts' / 'plot_training.py'


@pytest.fixture(name='plot_training')
def _plot_training():
  spec = importlib.util.spec_from_file_location('plot_training', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _log(workdir: pathlib.Path, records: list[dict]) -> str:
  workdir.mkdir()
  (workdir / 'log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  return str(workdir)


def test_second_stage_replaces_the_first_past_its_start(plot_training, tmp_path):
  first = _log(tmp_path / 'a', [
      {'step': 10, 'train_loss': 5.0}, {'step': 20, 'train_loss': 4.0},
      {'step': 20, 'eval_loss': 4.5},
      {'step': 20, 'train_loss': 3.9},  # resumed at 10: the later record counts
      {'step': 30, 'train_loss': 3.5}, {'step': 30, 'eval_loss': 3.8}])
  second = _log(tmp_path / 'b', [
      {'step': 5, 'train_loss': 3.0}, {'step': 10, 'eval_loss': 2.9}])
  train, evals, starts = plot_training.read_stages(f'{first},{second}@20')
  assert train == {10: 5.0, 20: 3.9, 25: 3.0}
  assert evals == {20: 4.5, 30: 2.9}
  assert starts == [20]


def test_main_writes_the_png(plot_training, tmp_path, monkeypatch):
  run = _log(tmp_path / 'a', [{'step': 1, 'train_loss': 2.0}, {'step': 1, 'eval_loss': 2.5}])
  out = tmp_path / 'loss.png'
  monkeypatch.setattr(sys, 'argv', ['plot_training.py', str(out), f'target={run}'])
  plot_training.main()
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_other_keys_plot_white_box_logs(plot_training, tmp_path):
  run = _log(tmp_path / 'a', [{'step': 10, 'beta': 0.6, 'loss': 0.4},
                              {'step': 0, 'eval_alpha': 0.65}, {'step': 10, 'eval_alpha': 0.7}])
  train, evals, _ = plot_training.read_stages(run, 'beta', 'eval_alpha')
  assert train == {10: 0.6} and evals == {0: 0.65, 10: 0.7}
