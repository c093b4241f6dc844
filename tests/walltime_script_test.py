"""Tests for scripts/walltime.py's arguments (the timing itself: experiments_test)."""

from tests import script_runner

DEMO = ['--target_config', 'demo_target', '--target_checkpoint', 'spec_decode/data/models/target',
        '--draft_config', 'demo_draft_small', '--draft_checkpoint',
        'spec_decode/data/models/draft_small', '--out_dir', 'unused']


def test_a_head_size_beyond_the_vocabulary_is_an_error():
  done = script_runner.run('walltime.py', *DEMO, '--head_size', '9000')
  assert done.returncode == 2
  assert '--head_size: size must lie in 2..8192, got 9000' in done.stderr
