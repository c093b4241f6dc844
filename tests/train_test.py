"""Tests for spec_decode.train: bucketing, learning, resuming."""

import json

import numpy as np

from spec_decode import tasks  # registers the demo tasks
from spec_decode import train
from spec_decode.t5.config import t5_1_1

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
  batches = list(train.bucketed_batches((_example(*l) for l in lengths), cfg))
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
