"""Tests for spec_decode.sampling: the adjusted distributions p and q."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode import sampling
from spec_decode.kernels import distributions
from tests import stubs

# Every statistical test in this suite rejects at this p-value: its false
# positive rate (seeds are fixed, so a given run is deterministic).
FALSE_POSITIVE_RATE = 1e-4


@pytest.fixture(params=['xla', 'kernel'])
def threshold_path(request, monkeypatch):
  """Top-k's and top-p's thresholds beyond the TopK cap: XLA's bisection, or the CPU kernel."""
  if request.param == 'xla':
    monkeypatch.setattr(distributions, 'thresholds_apply', lambda x: False)
  else:
    assert kernels.in_use(), 'the kernels did not build on this machine'
  return request.param


def _adjust(logits, **kwargs):
  return np.asarray(sampling.adjust(jnp.asarray(logits, jnp.float32),
                                    sampling.SamplingParams.create(**kwargs)))


def test_greedy_is_one_hot_of_argmax():
  logits = np.array([[0.1, 3.0, -1.0, 3.0], [-np.inf, -2.0, -np.inf, -5.0]])
  np.testing.assert_array_equal(_adjust(logits, temperature=0.0), [[0, 1, 0, 0], [0, 1, 0, 0]])


def test_temperature_scales_logits():
  logits = np.random.default_rng(0).standard_normal((3, 7))
  for t in (0.5, 1.0, 2.0):
    expected = np.asarray(jax.nn.softmax(logits / t, axis=-1))
    np.testing.assert_allclose(_adjust(logits, temperature=t), expected, rtol=1e-5)


def test_top_k_keeps_k_most_likely():
  logits = np.array([[1.0, 4.0, 2.0, 3.0, 0.0]])
  probs = _adjust(logits, temperature=1.0, top_k=2)
  np.testing.assert_array_equal(probs > 0, [[False, True, False, True, False]])
  np.testing.assert_allclose(probs[0, [1, 3]], jax.nn.softmax(jnp.array([4.0, 3.0])), rtol=1e-6)


def test_top_p_keeps_smallest_nucleus():
  probs_in = np.array([[0.5, 0.05, 0.3, 0.15]])
  logits = np.log(probs_in)
  # 0.5 < 0.7 so the nucleus needs 0.5 + 0.3; 0.8 >= 0.7 stops there.
  np.testing.assert_allclose(_adjust(logits, temperature=1.0, top_p=0.7),
                             [[0.5 / 0.8, 0, 0.3 / 0.8, 0]], rtol=1e-5)
  # A nucleus smaller than the top token keeps the top token alone.
  np.testing.assert_allclose(_adjust(logits, temperature=1.0, top_p=0.1), [[1, 0, 0, 0]])
  np.testing.assert_allclose(_adjust(logits, temperature=1.0, top_p=1.0), probs_in, rtol=1e-5)


def test_top_k_and_top_p_compose_with_neg_inf_logits():
  logits = np.array([[-np.inf, 2.0, 1.0, -np.inf, 0.5, 0.4]])
  probs = _adjust(logits, temperature=1.0, top_k=3, top_p=0.9)
  assert np.isclose(probs.sum(), 1.0)
  assert probs[0, 0] == 0 and probs[0, 3] == 0 and probs[0, 5] == 0


def _sorted_top_k_mask(logits, k):
  """The definition by a full sort: keep logits >= the k-th largest (ties kept)."""
  kth = -np.sort(-logits, axis=-1)[..., k - 1:k]
  return logits >= kth


def _sorted_top_p_mask(probs, top_p):
  """The definition by a full sort: the ranks whose preceding mass < top_p, ties kept.

  The mass is summed in float64: a float32 running sum over 32k entries is
  itself off by a few ulps near 1 and moves the boundary (seen at top_p 0.999).
  """
  ranked = -np.sort(-probs, axis=-1)
  mass_before = np.cumsum(ranked, axis=-1, dtype=np.float64) - ranked
  threshold = np.min(np.where(mass_before < top_p, ranked, np.inf), axis=-1, keepdims=True)
  return probs >= threshold


@pytest.mark.parametrize('vocab', [16400, 32100])  # both caps over blocks
@pytest.mark.parametrize('cap', [sampling.TOP_K_CAP, sampling.TOP_P_CAP])
def test_top_values_are_top_k_values(vocab, cap):
  rng = np.random.default_rng(vocab + cap)
  rows = {
      'random': rng.standard_normal(vocab),
      'tied': rng.integers(-3, 3, vocab),  # the cap-th value is shared by many blocks
      'packed': np.where(np.arange(vocab) < 3 * cap, 10.0 + np.arange(vocab) % 5, 0.0),
      'few finite': np.where(rng.random(vocab) < 10 / vocab, 1.0, -np.inf),  # < cap of them
      'last block': np.where(np.arange(vocab) >= vocab - 20, 5.0, rng.standard_normal(vocab)),
  }
  x = jnp.asarray(np.stack(list(rows.values())), jnp.float32)
  assert sampling.top_values_uses_blocks(vocab, cap)  # two TopKs
  got = np.asarray(jax.jit(sampling.top_values, static_argnums=1)(x, cap))
  np.testing.assert_array_equal(got, np.asarray(jax.lax.top_k(x, cap)[0]))


@pytest.mark.parametrize('vocab', [8192, 32128])
def test_top_k_mask_equals_sorted_definition(vocab, threshold_path):
  rng = np.random.default_rng(vocab)
  cap = sampling.TOP_K_CAP
  ks = np.array([1, 2, 40, cap, cap + 1, 3000, vocab - 1, vocab])  # both sides of the cap
  random = rng.standard_normal((len(ks), vocab)).astype(np.float32)
  tied = rng.integers(-4, 4, size=(len(ks), vocab)).astype(np.float32)  # ties at every k
  tied[:, :vocab // 2] = -np.inf
  tied[:, 0] = 0.0
  tied[:, 1] = -0.0
  mask = jax.jit(lambda x, k: sampling.top_k_mask(x, k))  # a fresh trace per path
  for logits in (random, tied):
    for k_rows in (ks, np.full_like(ks, 40)):  # the bisection path, and top_k's alone
      kept = np.asarray(mask(jnp.asarray(logits), jnp.asarray(k_rows)[:, None])) > -np.inf
      expected = np.stack([_sorted_top_k_mask(row, k) for row, k in zip(logits, k_rows)])
      np.testing.assert_array_equal(kept, expected & (logits > -np.inf))


@pytest.mark.parametrize('vocab', [8192, 32128])
def test_top_p_mask_equals_sorted_definition(vocab, threshold_path):
  rng = np.random.default_rng(vocab + 1)
  top_ps = np.array([0.05, 0.3, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0], np.float32)
  mask = jax.jit(lambda p, top_p: sampling.top_p_mask(p, top_p))  # a fresh trace per path
  paths = set()  # per call: which rows' nuclei end among the cap's largest entries
  for scale in (8.0, 1.0):  # peaked: nuclei inside the top_k cap; flat: bisection
    logits = scale * rng.standard_normal((len(top_ps), vocab))
    tied = np.round(logits / 2)  # many equal probabilities at the boundary
    for x in (logits, tied):
      probs = np.asarray(jax.nn.softmax(jnp.asarray(x, jnp.float32), axis=-1))
      cap_mass = np.sum(-np.sort(-probs, axis=-1)[:, :sampling.TOP_P_CAP], axis=-1)
      for p_rows in (top_ps, np.full_like(top_ps, 0.9)):
        paths.add(tuple(sorted(set(((cap_mass >= p_rows) | (p_rows >= 1)).tolist()))))
        expected = np.stack([_sorted_top_p_mask(row, p) | (p >= 1) for row, p in
                             zip(probs, p_rows)]) & (probs > 0)
        kept = np.asarray(mask(jnp.asarray(probs), jnp.asarray(p_rows)[:, None])) > 0
        np.testing.assert_array_equal(kept, expected)
        # [B, K, V] with one top_p per row b, as a verify call's p.
        batched = probs.reshape(2, len(top_ps) // 2, vocab)
        p_b = p_rows[::len(top_ps) // 2]
        expected = np.stack([_sorted_top_p_mask(row, p) | (p >= 1) for row, p in
                             zip(probs, np.repeat(p_b, len(top_ps) // 2))]) & (probs > 0)
        kept = np.asarray(mask(jnp.asarray(batched), jnp.asarray(p_b)[:, None, None])) > 0
        np.testing.assert_array_equal(kept.reshape(probs.shape), expected)
  # Calls with every row inside, every row bisected, and both in one call ran.
  assert paths == {(True,), (False,), (False, True)}


def test_top_p_bisects_only_the_rows_that_need_it(monkeypatch):
  # XLA's path (the kernel's takes every row's threshold in one call): a bisection that
  # keeps nothing, so the rows it touches come back empty.
  monkeypatch.setattr(distributions, 'thresholds_apply', lambda x: False)
  monkeypatch.setattr(sampling, 'bisect_threshold',
                      lambda keys, *_: jnp.full(keys.shape[:-1] + (1,), jnp.iinfo(jnp.int32).max))
  rng = np.random.default_rng(7)
  logits = np.stack([8.0 * rng.standard_normal(8192), 1.0 * rng.standard_normal(8192)] * 2)
  probs = jax.nn.softmax(jnp.asarray(logits.reshape(2, 2, 8192), jnp.float32), axis=-1)
  kept = np.asarray(jax.jit(lambda p: sampling.top_p_mask(p, 0.9))(probs)) > 0  # fresh trace
  flat = np.asarray(probs).reshape(4, 8192)
  np.testing.assert_array_equal(kept.reshape(4, 8192)[::2],
                                np.stack([_sorted_top_p_mask(row, 0.9) for row in flat[::2]]))
  assert not kept.reshape(4, 8192)[1::2].any()  # the flat rows went to the bisection


@pytest.mark.parametrize('kwargs', [dict(temperature=0.0), dict(temperature=1.0, top_k=5),
                                    dict(temperature=[0.0, 0.7, 1.0])])
def test_draw_is_adjust_then_sample(kwargs):
  logits = jnp.asarray(np.random.default_rng(4).standard_normal((3, 2, 50)), jnp.float32)
  params = sampling.SamplingParams.create(**kwargs)
  keys = jax.random.split(jax.random.key(5), 3)
  probs, tokens = jax.jit(sampling.draw)(keys, logits, params)
  expected = sampling.adjust(logits, params)
  np.testing.assert_allclose(probs, expected, rtol=1e-6)
  np.testing.assert_array_equal(tokens, sampling.sample(keys, expected))


@pytest.mark.parametrize('kwargs', [dict(temperature=0.0), dict(temperature=[0.0, 0.7, 1.0]),
                                    dict(temperature=1.0, top_k=5, top_p=0.8)])
def test_adjust_sampled_is_adjust(kwargs):
  """The branch draw and speculative.accept take without adjust's all-greedy test."""
  logits = jnp.asarray(np.random.default_rng(6).standard_normal((3, 2, 50)), jnp.float32)
  params = sampling.SamplingParams.create(**kwargs)
  np.testing.assert_array_equal(jax.jit(sampling.adjust_sampled)(logits, params),
                                jax.jit(sampling.adjust)(logits, params))


@pytest.mark.parametrize('knobs', ['traced', 'constant'])
def test_top_k_top_p_compile_without_a_sort(knobs, threshold_path):
  # Inside a loop, as the decoders call it. With knobs that XLA sees as
  # constants, picking the k-th of lax.top_k's values with a gather had made
  # XLA:CPU sort the whole vocabulary (1.4 ms a call at V = 8k, 50x TopK).
  params = sampling.SamplingParams.create(temperature=1.0, top_k=40, top_p=0.9)

  def loop(logits, params):
    body = lambda _, x: x + sampling.adjust(x, params)
    return jax.lax.fori_loop(0, 3, body, logits)

  logits = jnp.zeros((1, 8192))  # one row, as a batch-1 draft step
  if knobs == 'traced':
    compiled = jax.jit(loop).lower(logits, params).compile()
  else:
    compiled = jax.jit(lambda x: loop(x, params)).lower(logits).compile()
  hlo = compiled.as_text()
  assert not re.search(r'\ssort\(', hlo)
  if threshold_path == 'xla':
    assert 'TopK' in hlo
  else:  # every threshold from the kernels
    assert 'spec_decode_top_k_threshold' in hlo and 'TopK' not in hlo


def test_per_row_params():
  logits = np.random.default_rng(1).standard_normal((2, 3, 9))
  params = sampling.SamplingParams.create(temperature=[0.0, 1.0], top_k=[0, 2], top_p=[1.0, 1.0])
  probs = np.asarray(sampling.adjust(jnp.asarray(logits), params))
  np.testing.assert_array_equal(probs[0], _adjust(logits[0], temperature=0.0))
  np.testing.assert_allclose(probs[1], _adjust(logits[1], temperature=1.0, top_k=2), rtol=1e-6)


def test_bf16_logits_give_float32_probs():
  logits = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5)), jnp.bfloat16)
  probs = sampling.adjust(logits, sampling.SamplingParams.create(temperature=1.0))
  assert probs.dtype == jnp.float32


def test_changing_values_does_not_retrace():
  traces = []

  @jax.jit
  def f(logits, params):
    traces.append(1)
    return sampling.adjust(logits, params)

  logits = jnp.zeros((2, 5))
  for t, k, p in [(0.0, 0, 1.0), (1.0, 3, 0.9), (0.7, 0, 0.5), (2.0, 1, 1.0)]:
    f(logits, sampling.SamplingParams.create(temperature=t, top_k=k, top_p=p))
  assert len(traces) == 1


@pytest.mark.parametrize('kwargs, message', [
    (dict(temperature=-1.0), 'temperature'),
    (dict(top_k=-2), 'top_k'),
    (dict(top_k=1.5), 'top_k'),
    (dict(top_p=0.0), 'top_p'),
    (dict(top_p=1.5), 'top_p'),
    (dict(top_p=float('nan')), 'top_p'),
])
def test_bad_params_raise(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.SamplingParams.create(**kwargs)


def test_sample_matches_probs_and_never_draws_zero_mass():
  probs = np.array([0.4, 0.0, 0.25, 0.2, 0.1, 0.05, 0.0, 0.0], np.float32)
  n = 200_000
  keys = jax.random.split(jax.random.key(0), n)
  draws = np.asarray(sampling.sample(keys, jnp.broadcast_to(probs, (n, probs.size))))
  counts = np.bincount(draws, minlength=probs.size)
  assert counts[probs == 0].sum() == 0
  assert stubs.chi_square_pvalue(counts, probs) > FALSE_POSITIVE_RATE


def test_argmax_is_jnp_argmax_with_first_index_on_ties():
  rng = np.random.default_rng(0)
  x = rng.integers(-3, 3, size=(4, 3, 300)).astype(np.float32)  # many ties
  x[0, 0] = -np.inf
  x[1, 2, 7:] = -np.inf
  np.testing.assert_array_equal(sampling.argmax(jnp.asarray(x)), np.argmax(x, axis=-1))
  assert sampling.argmax(jnp.asarray([False, True, True])) == 1


def test_blocked_sample_over_many_blocks_matches_probs():
  # V = 1000: 8 blocks of 128, the last one partial; whole blocks and
  # scattered tokens without mass, mass in the very first and last tokens.
  rng = np.random.default_rng(1)
  probs = rng.random(1000) ** 4
  probs[128:384] = 0.0
  probs[rng.random(1000) < 0.3] = 0.0
  probs[0], probs[-1] = 0.5, 0.3
  probs = (probs / probs.sum()).astype(np.float32)
  n = 200_000
  keys = jax.random.split(jax.random.key(3), n)
  draws = np.asarray(jax.jit(sampling.sample)(keys, jnp.broadcast_to(probs, (n, probs.size))))
  counts = np.bincount(draws, minlength=probs.size)
  assert counts[probs == 0].sum() == 0
  assert stubs.chi_square_pvalue(counts, probs) > FALSE_POSITIVE_RATE


def test_sample_of_a_one_hot_is_its_token():
  for token in (0, 127, 128, 999):
    probs = jax.nn.one_hot(jnp.full((5, 2), token), 1000)
    np.testing.assert_array_equal(sampling.sample(jax.random.key(token), probs), token)
