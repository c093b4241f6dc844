"""Decoder-only T5 1.1 language models (T5X's layout) in the decoding loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.models import alpha as alpha_lib
from spec_decode.models import decoder_only
from spec_decode.models import drafts
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.options import Knobs, LoopOptions
from spec_decode.checkpoints.param_trees import flatten
from spec_decode.t5.decoder_only import DecoderOnlyConfig, DecoderOnlyTransformer
from tests import stubs
from tests.tolerances import assert_close

# Each statistical test rejects at this p-value (its false-positive rate).
FALSE_POSITIVE_RATE = 1e-4
TARGET = DecoderOnlyConfig(vocab_size=64, emb_dim=32, num_heads=4, num_layers=2, head_dim=8,
                           mlp_dim=64)
DRAFT = DecoderOnlyConfig(vocab_size=64, emb_dim=16, num_heads=2, num_layers=1, head_dim=8,
                          mlp_dim=32)
EOS = 1


def _model(config: DecoderOnlyConfig, seed: int,
           scale: float = 1.0) -> decoder_only.DecoderOnlyModel:
  """Random parameters; scale > 1 sharpens the output layer (fewer, likelier tokens)."""
  model = decoder_only.DecoderOnlyModel.random(config, jax.random.key(seed))
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * scale if 'logits_dense' in jax.tree_util.keystr(path) else x,
      model.params)
  return model.replace(params=params)


def _forward(model: decoder_only.DecoderOnlyModel, tokens: jax.Array) -> jax.Array:
  """Teacher forcing: [B, L] (0 first) -> [B, L, V]."""
  return model.network.apply({'params': model.params}, tokens)


def test_cached_chunks_equal_teacher_forcing_behind_ragged_prompts():
  model = _model(TARGET, 0)
  prompts, lengths = np.array([[5, 6, 7, 8], [9, 10, 0, 0], [0, 0, 0, 0]]), np.array([4, 2, 0])
  continuation = np.array([[11, 12, 13, 14, 15]] * 3)
  step_fn, cache = model.start(
      protocol.Batch(jnp.asarray(prompts), jnp.asarray(lengths), reads=model.reads), 8)
  chunks = []
  for chunk in (continuation[:, :1], continuation[:, 1:3], continuation[:, 3:]):
    logits, cache = step_fn(jnp.asarray(chunk), cache)  # loop position 0's token is replaced
    chunks.append(logits)
  cached = np.concatenate(chunks, axis=1)  # [B, 5, V]
  for b, length in enumerate(lengths):
    sequence = np.concatenate([[0], prompts[b, :length], continuation[b, 1:]])
    full = np.asarray(_forward(model, jnp.asarray(sequence[None])))[0]
    assert_close(cached[b], full[length:], ulps=64)


def test_greedy_speculative_equals_baseline_and_rows_their_batch_of_one():
  target, draft = _model(TARGET, 1, 2.0), _model(DRAFT, 2, 2.0)
  prompts, lengths = np.array([[3, 4, 5], [6, 0, 0], [7, 8, 0]]), np.array([3, 0, 2])
  kwargs = dict(max_decode_len=10, eos_id=EOS)
  baseline = models.generate(target, prompts, 0, lengths=lengths, **kwargs)
  for verification in ('token', 'block'):
    out = models.speculative_generate(target, draft, prompts, 0, lengths=lengths, gamma=3,
                                      verification=verification, **kwargs)
    np.testing.assert_array_equal(out.tokens, baseline.tokens)
  for b in range(3):
    one = models.generate(target, prompts[b:b + 1], 0, lengths=lengths[b:b + 1], **kwargs)
    np.testing.assert_array_equal(one.tokens[0], baseline.tokens[b])
  assert len({tuple(row) for row in np.asarray(baseline.tokens)}) == 3


def test_speculative_beam_search_finds_the_beams_of_beam_search():
  target, draft = _model(TARGET, 3, 2.0), _model(DRAFT, 4, 2.0)
  prompts, lengths = np.array([[3, 4, 5], [6, 0, 0]]), np.array([3, 1])
  plain = models.beam_generate(target, prompts, lengths=lengths, beam_size=3, max_decode_len=8,
                               eos_id=EOS)
  fast = models.beam_generate(target, prompts, lengths=lengths, beam_size=3, max_decode_len=8,
                              eos_id=EOS, draft=draft, draft_width=2, gamma=3)
  np.testing.assert_array_equal(fast.tokens, plain.tokens)
  assert_close(fast.scores, plain.scores, ulps=16)


@pytest.mark.parametrize('gamma', [0, 2])
def test_sampled_sequences_follow_the_target(gamma):
  """Joint law of the first three tokens after two ragged prompts == p's, by chi-square.

  Two tests per case (one per prompt), each at FALSE_POSITIVE_RATE. Checked by
  hand once: a too-lenient acceptance test (u < p/q + 0.5 in speculative.py)
  fails the gamma = 2 case.
  """
  small = dict(vocab_size=8, num_buckets=8, max_distance=16)
  target = _model(DecoderOnlyConfig(**{**TARGET.__dict__, **small}), 5, 3.0)
  draft = _model(DecoderOnlyConfig(**{**DRAFT.__dict__, **small}), 6, 3.0)
  prompts, lengths = np.array([[3, 2, 4], [5, 0, 0]]), np.array([3, 0])
  rows = 40_000
  options = LoopOptions(3, gamma, eos_id=-1)
  batch = protocol.Batch(jnp.asarray(np.repeat(prompts, rows, 0)),
                         jnp.asarray(np.repeat(lengths, rows)), reads=target.reads)
  out = jax.jit(front_ends.decode, static_argnums=4)(
      target, draft if gamma else None, batch, jax.random.key(7), options,
      Knobs.create(sampling_lib.SamplingParams.create(temperature=1.0)))
  tokens = np.asarray(out.tokens)
  for i, (prompt, length) in enumerate(zip(prompts, lengths)):
    law = stubs.first_three_law(lambda x: _forward(target, x), np.append(0, prompt[:length]),
                                target.vocab_size)  # T5X's sequences start with BOS 0
    pvalue = stubs.first_three_pvalue(tokens[i * rows:(i + 1) * rows], law)
    assert pvalue > FALSE_POSITIVE_RATE, f'prompt {i}'
  if gamma:
    hist = np.asarray(out.accept_histogram)
    assert hist[0] > 0 and hist[gamma] > 0, hist


def test_t5x_checkpoint_round_trip_and_named_errors(tmp_path):
  model = _model(TARGET, 8)
  path = str(tmp_path / 'lm')
  checkpoints.write_t5x(path, model.params)
  loaded = decoder_only.DecoderOnlyModel.load(path, TARGET)
  for name, x in flatten(model.params).items():
    np.testing.assert_array_equal(flatten(loaded.params)[name], x, err_msg=name)
  assert set(flatten(model.params)) >= {'decoder/token_embedder/embedding',
                                        'decoder/layers_1/self_attention/query/kernel',
                                        'decoder/logits_dense/kernel'}
  with pytest.raises(ValueError, match='missing array decoder/layers_2/mlp/wo/kernel'):
    decoder_only.DecoderOnlyModel.load(path,
                                       DecoderOnlyConfig(**{**TARGET.__dict__, 'num_layers': 3}))
  with pytest.raises(ValueError, match='vocab size mismatch: decoder/token_embedder/embedding'):
    decoder_only.DecoderOnlyModel.load(path,
                                       DecoderOnlyConfig(**{**TARGET.__dict__, 'vocab_size': 128}))


@pytest.mark.parametrize('prompts, lengths, match', [
    ([[3, 4]], [3], r'lengths must lie in 0..P=2'),
    ([[3, 64]], None, r'prompt_tokens\[0, 1\] = 64 is outside the vocabulary'),
    ([[3.0, 4.0]], None, 'integer token ids'),
    ([[3, 4]], [1, 2], r'lengths must be \[B=1\] integers'),
])
def test_bad_prompts_are_named(prompts, lengths, match):
  with pytest.raises(ValueError, match=match):
    models.generate(_model(TARGET, 0), np.asarray(prompts), 0, lengths=lengths, max_decode_len=4,
                    eos_id=EOS)


def test_a_draft_of_another_vocabulary_is_refused():
  other = DecoderOnlyConfig(**{**DRAFT.__dict__, 'vocab_size': 128})
  with pytest.raises(ValueError, match='draft vocab_size 128 != target vocab_size 64'):
    models.speculative_generate(_model(TARGET, 0), _model(other, 1), np.array([[3]]), 0,
                                gamma=2, max_decode_len=4, eos_id=EOS)


def test_network_shapes_are_t5x_decoder_only():
  shapes = jax.eval_shape(DecoderOnlyTransformer(TARGET).init, jax.random.key(0),
                          jax.ShapeDtypeStruct((1, 1), jnp.int32))['params']
  assert sorted(shapes) == ['decoder']
  assert shapes['decoder']['relpos_bias']['rel_embedding'].shape == (4, 32)
  assert shapes['decoder']['layers_0']['mlp']['wi_1']['kernel'].shape == (32, 64)


def test_alpha_of_a_bigram_draft_behind_prompts_by_hand():
  """alpha_lib.betas against sum_x min(p, q) computed from teacher forcing and the table."""
  target = _model(TARGET, 9, 2.0)
  rng = np.random.default_rng(0)
  bigram = np.log(rng.dirichlet(np.ones(64), 64)).astype(np.float32)  # row t: log q(. | t)
  draft = drafts.TableDraft.dense(bigram)
  prompts, lengths = np.array([[3, 4, 5], [6, 0, 0], [0, 0, 0]]), np.array([3, 1, 0])
  batch = protocol.Batch(jnp.asarray(prompts), jnp.asarray(lengths), reads=target.reads)
  sampling = sampling_lib.SamplingParams.create(temperature=1.0)
  out = models.generate(target, prompts, 1, lengths=lengths, max_decode_len=6, eos_id=-1,
                        sampling=sampling)
  betas = np.asarray(alpha_lib.betas(target, draft, batch, out.tokens, sampling))
  for b, length in enumerate(lengths):
    sequence = np.concatenate([[0], prompts[b, :length], np.asarray(out.tokens[b])])
    p = np.asarray(jax.nn.softmax(_forward(model=target, tokens=jnp.asarray(sequence[None]))[0]))
    previous = sequence[length:length + 6]  # the token before each continuation token
    q = np.exp(bigram)[previous]
    expected = np.minimum(p[length:length + 6], q).sum(-1)
    assert_close(betas[b], expected, ulps=64)
  self_betas = alpha_lib.betas(target, target, batch, out.tokens, sampling)
  assert_close(self_betas, np.ones((3, 6)), ulps=64)


def test_greedy_with_a_table_draft_equals_baseline():
  target = _model(TARGET, 10, 2.0)
  rng = np.random.default_rng(1)
  table = drafts.TableDraft.dense(np.log(rng.dirichlet(np.ones(64), 64)))
  prompts, lengths = np.array([[3, 4], [6, 0]]), np.array([2, 0])
  kwargs = dict(max_decode_len=8, eos_id=EOS)
  baseline = models.generate(target, prompts, 0, lengths=lengths, **kwargs)
  out = models.speculative_generate(target, table, prompts, 0, lengths=lengths, gamma=3,
                                    **kwargs)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)


def test_gin_configs_of_the_bundled_language_models():
  import gin  # pylint: disable=g-import-not-at-top
  from spec_decode import data  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  gin.parse_config_file(str(data.repository_dir('gin') / 'models' / 'lm' / 'bundled.gin'))
  fields = ('vocab_size', 'emb_dim', 'num_heads', 'num_layers', 'head_dim', 'mlp_dim')
  for name in ('lm_target', 'lm_draft'):
    configured = {f: gin.query_parameter(f'{name}/decoder_only.DecoderOnlyConfig.{f}')
                  for f in fields}
    assert configured == {f: getattr(decoder_only.bundled_config(name), f) for f in fields}
  gin.clear_config()


def test_the_quickstart_of_docs_runs_as_written(tmp_path):
  import pathlib, re, subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-import
  page = (pathlib.Path(__file__).resolve().parent.parent / 'docs' / 'decoder_only.md').read_text()
  section = page.split('\n## Quickstart: the bundled pair\n', 1)[1].split('\n## ', 1)[0]
  [code] = re.findall(r'```python\n(.*?)```', section, re.S)
  done = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.strip().splitlines()
  assert [line.split(' -> ')[0] for line in lines[:3]] == ['A man in a', 'Two dogs',
                                                           'This package provides']
  assert re.fullmatch(r'\d+\.\d\d tokens per target call', lines[-1]), done.stdout
