"""Tests for training.whitebox: the divergences, the data mix, a tiny run and resuming it."""

import dataclasses
import itertools
import json

import gin
import jax
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.cli import gin_utils
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.harness import loading
from spec_decode import models
from spec_decode.t5.config import t5_1_1
from spec_decode.training import distill
from spec_decode.training import whitebox

LN2 = np.log(2.0)
# Two positions of hand-made distributions over 4 tokens, and a third one that
# the mask leaves out (it would change every mean).
P = np.array([[0.5, 0.25, 0.125, 0.125], [0.7, 0.1, 0.1, 0.1], [0.97, 0.01, 0.01, 0.01]])
Q = np.array([[0.125, 0.5, 0.25, 0.125], [0.4, 0.2, 0.2, 0.2], [0.01, 0.01, 0.01, 0.97]])
MASK = np.array([[True, True, False]])
# Per position, by hand: tvd = 0.5 sum |p - q|, fkl = sum p log(p / q),
# rkl = sum q log(q / p), jsd from m = (p + q) / 2.
HAND = {
    'tvd': (0.375, 0.3),
    'fkl': (0.625 * LN2, 0.7 * np.log(7 / 4) - 0.3 * LN2),
    'rkl': (0.5 * LN2, 0.4 * np.log(4 / 7) + 0.6 * LN2),
    'jsd': (0.5 * (0.5 * np.log(0.5 / 0.3125) + 0.25 * np.log(0.25 / 0.375)
                   + 0.125 * np.log(0.125 / 0.1875)
                   + 0.125 * np.log(0.125 / 0.3125) + 0.5 * np.log(0.5 / 0.375)
                   + 0.25 * np.log(0.25 / 0.1875)),
            0.5 * (0.7 * np.log(0.7 / 0.55) + 0.3 * np.log(0.1 / 0.15)
                   + 0.4 * np.log(0.4 / 0.55) + 0.6 * np.log(0.2 / 0.15))),
}


def _numpy_divergence(name, p, q):
  """The definitions, per position, in float64."""
  m = (p + q) / 2
  kl = lambda a, b: np.sum(a * np.log(a / b), axis=-1)
  return {'tvd': 0.5 * np.sum(np.abs(p - q), axis=-1), 'fkl': kl(p, q), 'rkl': kl(q, p),
          'jsd': 0.5 * kl(p, m) + 0.5 * kl(q, m)}[name]


@pytest.mark.parametrize('name', whitebox.DIVERGENCES)
@pytest.mark.parametrize('temperature', [1.0, 0.5])
def test_divergences_match_hand_computed_values(name, temperature):
  np.testing.assert_allclose(_numpy_divergence(name, P[:2], Q[:2]), HAND[name], rtol=1e-12)
  # Logits T * log(p): the softmax at temperature T gives back p exactly.
  target_logits, draft_logits = (temperature * np.log(x)[None] for x in (P, Q))
  stats = whitebox.divergence(name, target_logits, draft_logits, MASK, temperature)
  np.testing.assert_allclose(stats.loss, np.mean(HAND[name]), rtol=1e-5)
  np.testing.assert_allclose(stats.beta, np.mean(np.sum(np.minimum(P[:2], Q[:2]), axis=-1)),
                             rtol=1e-6)
  assert stats.agreement == 0.5  # position 0: argmax 0 against 1; position 1: both 0


@pytest.mark.parametrize('name', whitebox.DIVERGENCES)
def test_temperature_divides_the_logits(name):
  rng = np.random.default_rng(0)
  target, draft = rng.normal(size=(2, 2, 3, 16)) * 3
  mask = np.array([[True, False, True], [True, True, False]])

  def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

  for temperature in (1.0, 2.5):
    p, q = softmax(target / temperature), softmax(draft / temperature)
    want = np.mean(_numpy_divergence(name, p, q)[mask])
    stats = whitebox.divergence(name, target.astype(np.float32), draft.astype(np.float32),
                                mask, temperature)
    np.testing.assert_allclose(stats.loss, want, rtol=2e-5)
    np.testing.assert_allclose(stats.beta, np.mean(np.minimum(p, q).sum(-1)[mask]), rtol=1e-5)


def test_tvd_is_one_minus_beta():
  rng = np.random.default_rng(1)
  target, draft = rng.normal(size=(2, 4, 6, 50)).astype(np.float32) * 2
  mask = rng.random((4, 6)) < 0.7
  stats = whitebox.divergence('tvd', target, draft, mask, 0.8)
  assert 0.1 < stats.beta < 0.9
  np.testing.assert_allclose(stats.loss, 1 - stats.beta, atol=1e-6)
  with pytest.raises(ValueError, match="unknown divergence 'kl'"):
    whitebox.divergence('kl', target, draft, mask, 1.0)


@pytest.mark.parametrize('change, message', [
    (dict(divergence='kl'), 'unknown divergence'),
    (dict(temperature=0.0), r'temperature = 0.0: must be a finite number > 0'),
    (dict(distilled_weight=0.5), 'needs distill_dir'),
    (dict(reference_weight=0.0, on_policy_weight=0.0), 'one of them > 0'),
    (dict(tasks=(('demo_nope', 1.0),)), 'tasks are'),
    (dict(max_decode_len=65), 'max_decode_len'),
    (dict(train_seconds=0), r'train_seconds = 0: must be a finite number > 0'),
])
def test_bad_settings_are_config_errors(change, message):
  with pytest.raises(ConfigError, match=message):
    whitebox.WhiteboxConfig(**change)


def test_gin_file_builds_the_default_settings():
  gin.clear_config()
  gin.add_config_file_search_path(str(gin_utils.GIN_DIR))
  try:
    gin_utils.parse_gin(
        ['runs/whitebox.gin', 'models/demo/target.gin', 'models/demo/draft_small.gin'],
        ['TARGET_CONFIG = @demo_target/t5.T5Config()', "TARGET_CHECKPOINT = '/t'",
         'DRAFT_CONFIG = @demo_draft_small/t5.T5Config()', "WORKDIR = '/w'"], whitebox.train)
    cfg = gin.get_configurable(whitebox.WhiteboxConfig)()
  finally:
    gin.clear_config()
  assert cfg.divergence in whitebox.DIVERGENCES and cfg.on_policy_weight > 0


def test_mixture_draws_sources_by_weight():
  cfg = whitebox.WhiteboxConfig(tasks=(('demo_multi30k', 1.0),), reference_weight=1.0,
                                on_policy_weight=3.0, input_buckets=(64,), target_buckets=(64,))
  mixture = distill.Mixture(cfg, seed=0)
  mixture.pool = [([7, 1], [5, 5, 1])]  # recognisable on-policy examples
  drawn = [next(mixture.examples) for _ in range(2000)]
  share = np.mean([e == mixture.pool[0] for e in drawn])
  assert abs(share - 0.75) < 0.04
  references = [e for e in drawn if e != mixture.pool[0]]
  assert all(x[-1] == 1 and y[-1] == 1 and len(x) > 5 for x, y in references)


def test_mixture_reads_unfinished_outputs_by_their_ids(tmp_path):
  records = [dict(inputs='summarize: loops', targets='RRRR', target_ids=[9, 9, 9, 9],
                  finished=False),
             dict(inputs='translate English to German: A dog.', targets='Ein Hund.')]
  distill.write_split(tmp_path / 'train.jsonl', records)
  cfg = whitebox.WhiteboxConfig(tasks=(('demo_multi30k', 1.0),), distill_dir=str(tmp_path),
                                reference_weight=0.0, distilled_weight=1.0, on_policy_weight=0.0,
                                input_buckets=(64,), target_buckets=(64,))
  outputs = {tuple(y) for _, y in itertools.islice(distill.Mixture(cfg, seed=0).examples, 20)}
  # The unfinished output's own ids, no EOS added; a finished one re-encoded with EOS.
  assert outputs == {(9, 9, 9, 9), tuple(loading.encode('Ein Hund.', 64))}


def test_tiny_run_raises_alpha_with_on_policy_data_and_resumes(tmp_path):
  target = models.T5Model.random(t5_1_1('tiny', vocab_size=8192), jax.random.key(0))
  checkpoints.write_t5x(str(tmp_path / 'target'), target.params)
  cfg = whitebox.WhiteboxConfig(
      divergence='tvd', tasks=(('demo_multi30k', 1.0),), reference_weight=0.5,
      on_policy_weight=0.5, on_policy_every=10, on_policy_samples=16, max_decode_len=16,
      num_steps=30, batch_tokens=768, input_buckets=(32,), target_buckets=(16,),
      optimizer='adamw', learning_rate=3e-3, warmup_steps=3, eval_every=30, eval_examples=24,
      log_every=5, checkpoint_every=15)
  draft_config = t5_1_1('nano', vocab_size=8192)
  run = lambda c, **kw: whitebox.train(target.config, str(tmp_path / 'target'), draft_config, c,
                                       str(tmp_path / 'run'), **kw)
  state = run(cfg)
  assert int(state.step) == 30
  log = [json.loads(line) for line in open(tmp_path / 'run' / 'log.jsonl')]
  evals = [r for r in log if 'eval_alpha' in r]
  assert [r['step'] for r in evals] == [0, 30]
  assert evals[1]['eval_alpha'] > evals[0]['eval_alpha'] + 0.05  # measured: 0.48 -> 0.61
  pools = [r for r in log if 'on_policy_length' in r]
  assert [r['step'] for r in pools] == [0, 10, 20] and all(r['on_policy_length'] >= 1
                                                          for r in pools)
  train_lines = [r for r in log if 'loss' in r]
  assert [r['step'] for r in train_lines] == [5, 10, 15, 20, 25, 30]
  assert train_lines[-1]['beta'] > train_lines[0]['beta']
  # Resume: the count continues from the saved step 30; the export is bf16 T5X.
  state = run(dataclasses.replace(cfg, num_steps=32), export_dir=str(tmp_path / 'export'))
  assert int(state.step) == 32
  log = [json.loads(line) for line in open(tmp_path / 'run' / 'log.jsonl')]
  assert [r['step'] for r in log if 'eval_alpha' in r] == [0, 30, 32]
  exported = checkpoints.load_params(str(tmp_path / 'export'), draft_config, dtype='bfloat16')
  assert checkpoints.check_vocabulary(tmp_path / 'export', data.vocabulary())['path'] == str(
      tmp_path / 'export' / 'vocabulary.json')
  for got, want in zip(jax.tree.leaves(exported), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(got, np.asarray(want).astype(got.dtype))
  with pytest.raises(ConfigError, match='not empty'):
    run(cfg, export_dir=str(tmp_path / 'export'))


def test_compile_buckets_compiles_every_bucket_shape_before_the_loop_meets_it(tmp_path):
  target = models.T5Model.random(t5_1_1('nano', vocab_size=8192), jax.random.key(0))
  checkpoints.write_t5x(str(tmp_path / 'target'), target.params)
  cfg = whitebox.WhiteboxConfig(
      divergence='tvd', tasks=(('demo_multi30k', 1.0),), reference_weight=1.0,
      on_policy_weight=0.0, max_decode_len=16, num_steps=6, warmup_steps=2, batch_tokens=256,
      input_buckets=(16, 32), target_buckets=(8, 16), eval_examples=0, log_every=3,
      checkpoint_every=6, compile_buckets=True)
  jax.clear_caches()
  state = whitebox.train(target.config, str(tmp_path / 'target'), t5_1_1('nano', vocab_size=8192),
                         cfg, str(tmp_path / 'run'))
  assert int(state.step) == 6
  # One program per (input, target) bucket, all made before the first step: the loop's steps,
  # whatever buckets they met, compiled nothing more.
  assert whitebox.train_step._cache_size() == 4  # pylint: disable=protected-access
