"""Training decoder-only language models on the bundled English text (short runs)."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.models import decoder_only
from spec_decode.t5.decoder_only import DecoderOnlyConfig, DecoderOnlyTransformer
from spec_decode.training import lm as lm_training
from tests.tolerances import assert_close

TINY = DecoderOnlyConfig(vocab_size=8192, emb_dim=16, num_heads=2, num_layers=1, head_dim=8,
                         mlp_dim=32)


def test_sequences_end_with_eos_and_fit_the_buckets():
  seqs = lm_training.sequences('validation')
  assert len(seqs) > 1500
  assert all(s[-1] == 1 and 2 <= len(s) <= lm_training.LENGTH_BUCKETS[-1] for s in seqs)


def test_batches_shift_right_and_cover_every_sequence_once():
  seqs = lm_training.sequences('test')[:100]
  got = []
  for batch in lm_training.batches(seqs, 256, None):
    rows, length = batch['targets'].shape
    assert rows == 256 // length and length in lm_training.LENGTH_BUCKETS
    np.testing.assert_array_equal(batch['inputs'][:, 1:], batch['targets'][:, :-1])
    assert not batch['inputs'][:, 0].any()
    got += [tuple(t[t > 0]) for t in batch['targets'] if t.any()]
  assert sorted(got) == sorted(tuple(s) for s in seqs)


def test_distillation_loss_is_the_cross_entropy_of_the_teachers_distribution():
  student, teacher = (decoder_only.DecoderOnlyModel.random(TINY, jax.random.key(i)) for i in (0, 1))
  batch = next(lm_training.batches(lm_training.sequences('test')[:40], 512, None))
  loss, _ = lm_training.loss_fn(student.params, DecoderOnlyTransformer(TINY), batch,
                                teacher.params, DecoderOnlyTransformer(TINY), 0.0)
  p = np.asarray(jax.nn.softmax(teacher.network.apply({'params': teacher.params},
                                                      batch['inputs'])), np.float64)
  log_q = np.asarray(jax.nn.log_softmax(student.network.apply({'params': student.params},
                                                              batch['inputs'])), np.float64)
  w = batch['weights']
  assert_close(loss, -np.sum(np.sum(p * log_q, -1) * w) / w.sum(), ulps=256)


def test_a_short_run_writes_a_loadable_checkpoint_and_its_log(tmp_path):
  cfg = lm_training.LMTrainConfig(num_steps=3, warmup_steps=1, eval_every=2, batch_tokens=256)
  summary = lm_training.train(TINY, cfg, str(tmp_path / 'target'))
  assert summary['steps'] == 3 and summary['eval_loss'] > 0
  log = [json.loads(line) for line in (tmp_path / 'target' / 'log.jsonl').read_text().splitlines()]
  assert [r['step'] for r in log] == [1, 2, 3] and 'eval_loss' in log[1]
  target = decoder_only.DecoderOnlyModel.load(str(tmp_path / 'target' / 'checkpoint'), TINY, 'float32')
  assert json.loads((tmp_path / 'target' / 'checkpoint' / 'vocabulary.json').read_text())[
      'vocab_size'] == 8192
  draft = lm_training.train(TINY, cfg, str(tmp_path / 'draft'), teacher=target)
  assert draft['distilled_from']['emb_dim'] == 16
  assert {x.dtype for x in jax.tree.leaves(target.params)} == {jnp.dtype('float32')}
