"""Tests for training.train: bucketing, learning, resuming, starting from a checkpoint."""

import json

import jax
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.t5.config import t5_1_1
from spec_decode.t5.network import Transformer
from spec_decode import data
from spec_decode.training import batches as batches_lib
from spec_decode.training import tasks  # registers the demo tasks
from spec_decode.training import train

del tasks


def _example(in_len, tgt_len, max_in=16, max_tgt=8):
  ex = {'encoder_input_tokens': np.zeros(max_in, np.int32),
        'decoder_input_tokens': np.zeros(max_tgt, np.int32),
        'decoder_target_tokens': np.zeros(max_tgt, np.int32),
        'decoder_loss_weights': np.zeros(max_tgt, np.int32)}
  ex['encoder_input_tokens'][:in_len] = 5
  ex['decoder_target_tokens'][:tgt_len] = 6
  ex['decoder_loss_weights'][:tgt_len] = 1
  return ex


def test_bucketed_batches_have_fixed_shapes_and_keep_all_tokens():
  cfg = train.TrainConfig(input_buckets=(4, 16), target_buckets=(4, 8), batch_tokens=40)
  lengths = [(3, 2), (10, 7), (4, 4), (16, 1), (2, 8), (1, 1)] * 20
  batches = list(batches_lib.bucketed_batches((_example(*l) for l in lengths), cfg))
  shapes = {b['encoder_input_tokens'].shape + b['decoder_target_tokens'].shape for b in batches}
  assert shapes == {(5, 4, 5, 4), (1, 16, 1, 8), (2, 16, 2, 4), (3, 4, 3, 8)}
  # Each bucket yields whole batches; only a partly filled last batch is held.
  per_bucket = {}
  for in_len, tgt_len in lengths:
    key = (4 if in_len <= 4 else 16, 4 if tgt_len <= 4 else 8)
    per_bucket[key] = per_bucket.get(key, 0) + 1
  for (in_len, tgt_len), count in per_bucket.items():
    rows = cfg.batch_tokens // (in_len + tgt_len)
    yielded = sum(b['encoder_input_tokens'].shape[0] for b in batches
                  if b['encoder_input_tokens'].shape[1] == in_len
                  and b['decoder_target_tokens'].shape[1] == tgt_len)
    assert yielded == count // rows * rows


def test_training_lowers_the_loss_and_resumes(tmp_path):
  model = t5_1_1('nano', vocab_size=8192)
  cfg = train.TrainConfig(mixture='demo_ende', num_steps=12, batch_tokens=1024,
                          input_buckets=(32, 64), target_buckets=(32, 64), learning_rate=3e-3,
                          warmup_steps=2, eval_every=6, eval_batches=2, checkpoint_every=6)
  state = train.train(model, cfg, tmp_path)
  assert int(state.step) == 12
  log = [json.loads(line) for line in open(tmp_path / 'log.jsonl')]
  evals = [r['eval_loss'] for r in log if 'eval_loss' in r]
  assert len(evals) == 2 and evals[1] < evals[0] < np.log(8192) + 1
  # Resume: a longer run continues from the saved step 12, not from scratch.
  longer = train.TrainConfig(**{**cfg.__dict__, 'num_steps': 14})
  state = train.train(model, longer, tmp_path)
  assert int(state.step) == 14
  log = [json.loads(line) for line in open(tmp_path / 'log.jsonl')]
  assert [r['step'] for r in log if 'eval_loss' in r] == [6, 12, 14]
  # The run recorded its vocabulary, the mixture's; a shorter run than the saved one is refused.
  assert checkpoints.check_vocabulary(tmp_path / 'checkpoints' / '14', data.VOCAB_PATH)
  with pytest.raises(ConfigError, match='num_steps = 12, but .* already holds step 14'):
    train.train(model, cfg, tmp_path)
  # The export carries the run's record.
  train.export(model, cfg, tmp_path, str(tmp_path / 't5x'), dtype='float32')
  assert checkpoints.read_vocabulary(tmp_path / 't5x')['path'] == str(tmp_path / 't5x' /
                                                                     'vocabulary.json')


def test_adafactor_run_starts_from_a_t5x_checkpoint(tmp_path):
  model = t5_1_1('nano', vocab_size=8192)
  start = jax.device_get(train.init_state(Transformer(model), train.optimizer(train.TrainConfig()),
                                          seed=7).params)
  checkpoints.write_t5x(str(tmp_path / 'init'), start)
  cfg = train.TrainConfig(mixture='demo_ende', num_steps=4, batch_tokens=1024,
                          input_buckets=(32, 64), target_buckets=(32, 64),
                          optimizer='adafactor', learning_rate=1e-2, warmup_steps=1,
                          eval_every=4, eval_batches=2, checkpoint_every=4,
                          init_checkpoint=str(tmp_path / 'init'))
  tx = train.optimizer(cfg)
  state = train.start_state(train.checkpoint_manager(tmp_path / 'loaded'), model, tx, cfg.seed,
                            cfg.init_checkpoint)
  for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(start)):
    np.testing.assert_array_equal(got, want)
  state = train.train(model, cfg, tmp_path / 'run')
  assert int(state.step) == 4
  log = [json.loads(line) for line in open(tmp_path / 'run' / 'log.jsonl')]
  evals = [r['eval_loss'] for r in log if 'eval_loss' in r]
  assert evals[0] < train.evaluate(start, Transformer(model), cfg)


def test_unknown_optimizer_is_a_clear_error():
  with pytest.raises(ConfigError, match="optimizer = 'sgd': unknown optimizer"):
    train.TrainConfig(optimizer='sgd')
