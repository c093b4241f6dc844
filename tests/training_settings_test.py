"""Tests of training.checks: every bad setting fails when its config is built, naming it.

Also the vocabulary a run trains with (recorded, checked against a resumed run
and against the checkpoints it loads) and the divergence's shape checks. Nothing
here trains: each failure comes before anything compiles.
"""

import gin
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.cli import gin_utils
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.t5.config import t5_1_1
from spec_decode.training import checks
from spec_decode.training import lm
from spec_decode.training import tasks  # registers the demo tasks
from spec_decode.training import train
from spec_decode.training import whitebox

del tasks

NAN, INF = float('nan'), float('inf')


@pytest.mark.parametrize('name, value', [
    ('mixture', ''), ('num_steps', 0), ('num_steps', -5), ('num_steps', 2.5), ('num_steps', True),
    ('batch_tokens', 0), ('batch_tokens', -4096), ('batch_tokens', 383),
    ('input_buckets', (64, 32)), ('input_buckets', ()), ('input_buckets', (32, 32)),
    ('target_buckets', (0, 32)), ('optimizer', 'sgd'), ('learning_rate', -1e-3),
    ('learning_rate', 0.0), ('learning_rate', NAN), ('learning_rate', INF),
    ('warmup_steps', -1), ('weight_decay', NAN), ('z_loss', -1.0), ('eval_every', 0),
    ('eval_batches', 0), ('eval_batches', -2), ('checkpoint_every', 0), ('seed', -1),
    ('init_checkpoint', ''),
])
def test_a_bad_train_setting_is_named_with_its_value(name, value):
  with pytest.raises(ConfigError) as error:
    train.TrainConfig(**{name: value})
  assert f'TrainConfig.{name} = {value!r}: ' in str(error.value)


@pytest.mark.parametrize('config', [train.TrainConfig, whitebox.WhiteboxConfig, lm.LMTrainConfig])
def test_a_warmup_longer_than_the_run_is_refused(config):
  # The learning rate would never reach its peak: 10 steps of a 1000-step warmup end at 1% of it.
  with pytest.raises(ConfigError, match=rf'{config.__name__}.warmup_steps = 1000: must be at most '
                                        r'num_steps = 10: .* this run would end at 0.01 of it'):
    config(num_steps=10, warmup_steps=1000)
  assert config(num_steps=10, warmup_steps=10).warmup_steps == 10
  assert config(num_steps=10, warmup_steps=0).warmup_steps == 0


def test_batch_tokens_must_hold_a_row_of_the_largest_bucket():
  with pytest.raises(ConfigError, match=r'>= input_buckets\[-1\] \+ target_buckets\[-1\] = 384'):
    train.TrainConfig(batch_tokens=383)
  assert train.TrainConfig(batch_tokens=384).batch_tokens == 384


@pytest.mark.parametrize('name, value', [
    ('divergence', 'kl'), ('temperature', 0.0), ('temperature', -1.0), ('temperature', NAN),
    ('temperature', INF), ('eval_temperature', -0.5), ('eval_temperature', NAN),
    ('on_policy_temperature', NAN), ('on_policy_temperature', -1.0),
    ('reference_weight', NAN), ('on_policy_weight', -1.0),
    ('tasks', (('demo_multi30k', NAN),)), ('tasks', (('demo_multi30k', 0.0),)),
    ('num_steps', 0), ('batch_tokens', 0), ('learning_rate', NAN), ('eval_every', 0),
    ('eval_examples', -1), ('max_decode_len', 0), ('max_decode_len', 65), ('log_every', 0),
    ('on_policy_every', 0), ('on_policy_samples', 0), ('train_seconds', NAN),
    ('train_seconds', -1.0), ('compile_buckets', 'yes'), ('target_buckets', (64, 32)),
])
def test_a_bad_whitebox_setting_is_named_with_its_value(name, value):
  with pytest.raises(ConfigError) as error:
    whitebox.WhiteboxConfig(**{name: value})
  assert f'WhiteboxConfig.{name} = {value!r}: ' in str(error.value)


def test_the_defaults_and_the_gin_files_settings_are_valid():
  train.TrainConfig()
  whitebox.WhiteboxConfig()
  gin.clear_config()
  gin.add_config_file_search_path(str(gin_utils.GIN_DIR))
  try:
    gin_utils.parse_gin(['runs/train.gin', 'models/demo/target.gin'],
                        ['MODEL_CONFIG = @demo_target/t5.T5Config()', "WORKDIR = '/w'"],
                        train.train)
    cfg = gin.get_configurable(train.TrainConfig)()
  finally:
    gin.clear_config()
  assert cfg.optimizer == 'adafactor' and cfg.num_steps == 1200


def test_a_run_records_its_vocabulary_and_a_resumed_run_checks_it(tmp_path, other_vocabulary):
  run = tmp_path / 'checkpoints'
  checks.run_vocabulary(run, other_vocabulary, allow_mismatch=False)
  assert checkpoints.read_vocabulary(run)['file'] == 'other.model'
  checks.run_vocabulary(run, other_vocabulary, allow_mismatch=False)
  with pytest.raises(ValueError, match='ALLOW_VOCABULARY_MISMATCH'):
    checks.run_vocabulary(run, data.VOCAB_PATH, allow_mismatch=False)
  with pytest.warns(UserWarning, match='vocabulary mismatch'):
    checks.run_vocabulary(run, data.VOCAB_PATH, allow_mismatch=True)


def test_training_refuses_an_init_checkpoint_of_another_vocabulary(tmp_path, other_vocabulary):
  # Only the record is there: the check comes before any parameter is read.
  checkpoints.write_vocabulary(tmp_path / 'init', other_vocabulary)
  cfg = train.TrainConfig(mixture='demo_ende', init_checkpoint=str(tmp_path / 'init'))
  with pytest.raises(ValueError) as error:
    train.train(t5_1_1('nano', vocab_size=8192), cfg, str(tmp_path / 'run'))
  for name in ('other.model', str(tmp_path / 'init'), 'spm_8k.model',
               '--gin.ALLOW_VOCABULARY_MISMATCH=True'):
    assert name in str(error.value)
  with pytest.raises(ConfigError, match='vocab_size 100, but the vocabulary .* has 8192 ids'):
    train.train(t5_1_1('nano', vocab_size=100), cfg, str(tmp_path / 'run'))


def test_whitebox_refuses_a_target_or_records_of_another_vocabulary(tmp_path, other_vocabulary):
  checkpoints.write_vocabulary(tmp_path / 'target', other_vocabulary)
  model = t5_1_1('nano', vocab_size=8192)
  run = lambda cfg, target: whitebox.train(model, str(target), model, cfg, str(tmp_path / 'run'))
  with pytest.raises(ValueError, match=f'checkpoint {tmp_path / "target"} was trained with '
                     'other.model'):
    run(whitebox.WhiteboxConfig(), tmp_path / 'target')
  checkpoints.write_vocabulary(tmp_path / 'distill', other_vocabulary)
  cfg = whitebox.WhiteboxConfig(distill_dir=str(tmp_path / 'distill'), distilled_weight=1.0)
  with pytest.raises(ValueError, match=f'checkpoint {tmp_path / "distill"} was trained with'):
    run(cfg, data.DATA_DIR / 'models' / 'target')
  with pytest.raises(ValueError, match=f'checkpoint {tmp_path / "target"} was trained with'):
    run(whitebox.WhiteboxConfig(init_checkpoint=str(tmp_path / 'target')),
        data.DATA_DIR / 'models' / 'target')


@pytest.mark.parametrize('p_shape, q_shape, mask_shape', [
    ((2, 5, 100), (2, 5, 120), (2, 5)),  # two vocabularies
    ((2, 5, 100), (2, 6, 100), (2, 5)),  # two sequence lengths
    ((2, 5, 100), (2, 5, 100), (2, 6)),  # a mask of other positions
    ((10, 100), (10, 100), (10,)),       # no batch axis
])
def test_divergence_names_mismatched_shapes(p_shape, q_shape, mask_shape):
  with pytest.raises(ValueError) as error:
    whitebox.divergence('tvd', np.zeros(p_shape, np.float32), np.zeros(q_shape, np.float32),
                        np.ones(mask_shape, bool), 1.0)
  for shape in (p_shape, q_shape, mask_shape):
    assert str(shape) in str(error.value)


@pytest.mark.parametrize('temperature', [0.0, -1.0, NAN, INF])
def test_divergence_refuses_a_bad_temperature(temperature):
  logits = np.zeros((1, 2, 4), np.float32)
  with pytest.raises(ValueError, match=f'temperature = {temperature!r}: must be a finite'):
    whitebox.divergence('fkl', logits, logits, np.ones((1, 2), bool), temperature)
