"""End-to-end tests of spec_decode.models with tiny random T5 models (fp32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.t5 import t5_1_1

VOCAB, ENCODER_LEN, MAX_DECODE_LEN, GAMMA = 64, 10, 24, 3


@pytest.fixture(scope='module')
def pair():
  """A tiny target and a smaller draft with the same vocabulary."""
  target = models.T5Model.random(t5_1_1('tiny', vocab_size=VOCAB), jax.random.key(0))
  draft = models.T5Model.random(t5_1_1('nano', vocab_size=VOCAB), jax.random.key(1))
  return target, draft


def _inputs(seed: int, batch: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, VOCAB, (batch, ENCODER_LEN)).astype(np.int32)
  tokens[:, rng.integers(4, ENCODER_LEN + 1):] = 0  # some padding
  return tokens


def _noisy_copy(model: models.T5Model, scale: float, seed: int) -> models.T5Model:
  """The same network with perturbed weights: a draft that is often right."""
  leaves, treedef = jax.tree.flatten(model.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return model.replace(params=jax.tree.unflatten(treedef, noisy))


def _assert_same_output(a, b):
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.lengths, b.lengths)


@pytest.mark.parametrize('batch, verification', [(1, 'token'), (4, 'token'), (4, 'block')])
def test_greedy_speculative_equals_greedy_baseline(pair, batch, verification):
  target, draft = pair
  for seed in range(3):
    inputs, rng = _inputs(seed, batch), jax.random.key(seed)
    baseline = models.generate(target, inputs, rng, max_decode_len=MAX_DECODE_LEN)
    speculative = models.speculative_generate(target, draft, inputs, rng, gamma=GAMMA,
                                              max_decode_len=MAX_DECODE_LEN,
                                              verification=verification)
    _assert_same_output(speculative, baseline)
    assert int(jnp.sum(baseline.lengths)) > batch  # decoding got past the first token


def test_partially_accepted_drafts_rewind_correctly(pair):
  """A noisy copy of the target is accepted sometimes: rewinds happen mid-row."""
  target, _ = pair
  draft = _noisy_copy(target, 0.1, seed=0)
  histogram = 0
  for seed in range(3):
    inputs, rng = _inputs(seed, 4), jax.random.key(seed)
    baseline = models.generate(target, inputs, rng, max_decode_len=MAX_DECODE_LEN)
    speculative = models.speculative_generate(target, draft, inputs, rng, gamma=GAMMA,
                                              max_decode_len=MAX_DECODE_LEN)
    _assert_same_output(speculative, baseline)
    histogram = histogram + np.asarray(speculative.accept_histogram)
  assert np.all(histogram > 0), histogram  # every count 0..gamma of accepted drafts occurs


def test_batch_rows_equal_batch_one_runs(pair):
  target, draft = pair
  inputs = _inputs(5, 4)
  keys = jax.random.split(jax.random.key(0), 4)
  batched = models.speculative_generate(target, draft, inputs, keys, gamma=GAMMA,
                                        max_decode_len=MAX_DECODE_LEN)
  for b in range(4):
    single = models.generate(target, inputs[b:b + 1], keys[b:b + 1],
                             max_decode_len=MAX_DECODE_LEN)
    np.testing.assert_array_equal(batched.tokens[b], single.tokens[0])


def test_draft_equal_to_target_accepts_everything(pair):
  target, _ = pair
  out = models.speculative_generate(target, target, _inputs(0, 4), jax.random.key(0),
                                    gamma=GAMMA, max_decode_len=MAX_DECODE_LEN)
  histogram = np.asarray(out.accept_histogram)
  assert histogram[:GAMMA].sum() == 0 and histogram[GAMMA] > 0, histogram


def test_sampling_values_do_not_recompile(pair):
  target, draft = pair
  inputs = _inputs(0, 4)
  models.speculative_generate(target, draft, inputs, jax.random.key(0), gamma=GAMMA,
                              max_decode_len=MAX_DECODE_LEN)
  compiled = models.front_ends._decode._cache_size()
  for temperature, top_k, top_p in ((0.7, 0, 1.0), (1.0, 5, 0.9)):
    sampling = sampling_lib.SamplingParams.create(temperature, top_k, top_p)
    out = models.speculative_generate(target, draft, inputs, jax.random.key(1), gamma=GAMMA,
                                      max_decode_len=MAX_DECODE_LEN, sampling=sampling,
                                      lenience=0.5)
    assert out.tokens.shape == (4, MAX_DECODE_LEN)
    assert bool(jnp.all((out.tokens >= 0) & (out.tokens < VOCAB)))
  # The knobs are one pytree of the same structure whatever their values: no new trace.
  assert models.front_ends._decode._cache_size() == compiled


def test_rejects_mismatched_vocabularies_and_bad_inputs(pair):
  target, _ = pair
  other = models.T5Model(t5_1_1('nano', vocab_size=VOCAB + 1), params=None)
  with pytest.raises(ValueError, match='vocab'):
    models.speculative_generate(target, other, _inputs(0, 1), jax.random.key(0), gamma=GAMMA,
                                max_decode_len=MAX_DECODE_LEN)
  with pytest.raises(ValueError, match=r'\[B, S\]'):
    models.generate(target, _inputs(0, 1)[0], jax.random.key(0), max_decode_len=MAX_DECODE_LEN)
  with pytest.raises(ValueError, match='lenience'):
    models.speculative_generate(target, target, _inputs(0, 1), jax.random.key(0), gamma=GAMMA,
                                max_decode_len=MAX_DECODE_LEN, lenience=0.0)
  with pytest.raises(ValueError, match="verification must be one of .*, got 'Block'"):
    models.speculative_generate(target, target, _inputs(0, 1), jax.random.key(0), gamma=GAMMA,
                                max_decode_len=MAX_DECODE_LEN, verification='Block')
  with pytest.raises(ValueError, match='prompt'):
    models.generate(target, _inputs(0, 1), jax.random.key(0), max_decode_len=4,
                    prompt=jnp.ones((1, 4), jnp.int32))
  with pytest.raises(ValueError, match=r'encoder_input_tokens holds ids 0..9000, outside the '
                     r'vocabulary \[0, 64\)'):
    models.generate(target, np.where(np.arange(ENCODER_LEN) == 0, 9000, _inputs(0, 1)),
                    jax.random.key(0), max_decode_len=MAX_DECODE_LEN)
  with pytest.raises(ValueError, match=r'prompt holds ids 5..64, outside the vocabulary'):
    models.generate(target, _inputs(0, 1), jax.random.key(0), max_decode_len=MAX_DECODE_LEN,
                    prompt=np.array([[5, 64]], np.int32))
  with pytest.raises(ValueError, match="prompt row 1 holds 0 before a token: 0 is padding"):
    models.speculative_generate(target, target, _inputs(0, 2), jax.random.key(0), gamma=GAMMA,
                                max_decode_len=MAX_DECODE_LEN,
                                prompt=np.array([[5, 7, 0], [5, 0, 7]], np.int32))
  with pytest.raises(ValueError, match=r'prompt must be integer token ids \[B, P\], got float32'):
    models.generate(target, _inputs(0, 1), jax.random.key(0), max_decode_len=MAX_DECODE_LEN,
                    prompt=np.array([[5.0, 7.5]], np.float32))
  for name, value in (('gamma', 2.0), ('max_decode_len', 8.0), ('gamma', 0)):
    kwargs = {'gamma': GAMMA, 'max_decode_len': MAX_DECODE_LEN, name: value}
    with pytest.raises(ValueError, match=rf'{name} must be an integer >= 1 and <= 2147483647 '
                       rf'\(int32\), got {value}'):
      models.speculative_generate(target, target, _inputs(0, 1), jax.random.key(0), **kwargs)
  for lenience in (np.float32(2.0), jnp.asarray(5.0)):
    with pytest.raises(ValueError, match=r'lenience must be a number in \(0, 1\]'):
      models.speculative_generate(target, target, _inputs(0, 1), jax.random.key(0), gamma=GAMMA,
                                  max_decode_len=MAX_DECODE_LEN, lenience=lenience)

