"""Tests for scripts/measure_alpha.py: one report row per draft, never two drafts under one name."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / 'scripts' / 'measure_alpha.py'


@pytest.fixture(name='measure_alpha')
def _measure_alpha():
  spec = importlib.util.spec_from_file_location('measure_alpha', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_drafts_of_one_config_are_told_apart_by_checkpoint(measure_alpha):
  names = measure_alpha.draft_names(
      ['demo_draft_small', 'demo_draft_large', 'configs/demo_draft_small.json'],
      ['bundled/small', 'bundled/large', 'out/new_small'])
  assert names == ['demo_draft_small (bundled/small)', 'demo_draft_large',
                   'demo_draft_small (out/new_small)']


def test_the_same_draft_twice_is_an_error(measure_alpha):
  with pytest.raises(SystemExit, match='given twice'):
    measure_alpha.draft_names(['demo_draft_small'] * 2, ['ckpt'] * 2)
