"""Tests for spec_decode.theory: the paper's numbers, limits and argument checks."""

import numpy as np
import pytest

from spec_decode import theory


@pytest.mark.parametrize('alpha, gamma, speed, ops', [
    (0.8, 2, 2.44, 1.23),
    (0.8, 5, 3.69, 1.63),
    (0.9, 10, 6.86, 1.60),
])
def test_quoted_numbers(alpha, gamma, speed, ops):
  assert round(float(theory.walltime_improvement(alpha, gamma, 0.0)), 2) == speed
  assert round(float(theory.operations_factor(alpha, gamma, 0.0)), 2) == ops


def test_table1_rows():
  rows = theory.table1()
  assert [(r['alpha'], r['gamma']) for r in rows] == list(theory.TABLE1_ROWS)
  printed = [(round(r['operations'], 2), round(r['speed'], 2)) for r in rows]
  assert printed == [(1.53, 1.96), (1.58, 2.53), (1.23, 2.44), (1.63, 3.69),
                     (1.11, 2.71), (1.60, 6.86)]


def test_expected_tokens_matches_geometric_sum():
  alpha = np.linspace(0, 1, 11)
  for gamma in (1, 3, 7):
    direct = sum(alpha**i for i in range(gamma + 1))
    np.testing.assert_allclose(theory.expected_tokens(alpha, gamma), direct)


def test_limits_at_alpha_one_and_zero():
  gamma = np.arange(1, 8)
  np.testing.assert_allclose(theory.expected_tokens(1.0, gamma), gamma + 1)
  np.testing.assert_allclose(
      theory.expected_tokens(1 - 1e-9, gamma), gamma + 1, rtol=1e-6)
  np.testing.assert_allclose(theory.expected_tokens(0.0, gamma), 1.0)
  # alpha = 1, c = 0: every call yields gamma + 1 tokens for gamma + 1 ops.
  np.testing.assert_allclose(theory.walltime_improvement(1.0, gamma, 0), gamma + 1)
  np.testing.assert_allclose(theory.operations_factor(1.0, gamma, 0), 1.0)


def test_gamma1_bound_of_corollary_3_9():
  alpha, c = np.meshgrid(np.linspace(0, 1, 21), np.linspace(0, 1, 21))
  bound = theory.gamma1_improvement(alpha, c)
  np.testing.assert_allclose(theory.walltime_improvement(alpha, 1, c), bound)
  _, best = theory.best_gamma(alpha, c)
  assert np.all(best >= bound - 1e-12)
  possible = theory.speedup_possible(alpha, c)
  np.testing.assert_array_equal(possible, alpha > c)
  assert np.all(best[possible] > 1)
  assert np.all(best[~possible] <= 1 + 1e-12)


def test_monotonicity():
  alpha = np.linspace(0, 1, 51)
  for gamma in (1, 4, 10):
    assert np.all(np.diff(theory.expected_tokens(alpha, gamma)) > 0)
    assert np.all(np.diff(theory.walltime_improvement(alpha, gamma, 0.1)) > 0)
    assert np.all(np.diff(theory.operations_factor(alpha, gamma, 0.1)) < 0)
  gamma = np.arange(1, 20)
  assert np.all(np.diff(theory.expected_tokens(0.7, gamma)) > 0)
  c = np.linspace(0, 2, 21)
  assert np.all(np.diff(theory.walltime_improvement(0.7, 3, c)) < 0)


def test_best_gamma_matches_brute_force():
  rng = np.random.default_rng(0)
  alpha, c = rng.uniform(0, 1, 200), rng.uniform(0, 0.5, 200)
  gamma, speed = theory.best_gamma(alpha, c, gamma_max=25)
  for a, cc, g, s in zip(alpha, c, gamma, speed):
    speeds = [float(theory.walltime_improvement(a, k, cc)) for k in range(1, 26)]
    assert g == 1 + int(np.argmax(speeds))
    assert s == pytest.approx(max(speeds))
  assert gamma.shape == speed.shape == (200,)


def test_best_gamma_with_verify_cost():
  # The array and callable forms agree; a costlier verify pass favours smaller
  # gamma; r(K) = 1 recovers eq. (5).
  def cost(k):
    return 1 + 0.1 * (k - 1)
  table = cost(np.arange(1, 32))
  alpha, c = np.array([0.6, 0.8, 0.95]), 0.05
  g_callable, s_callable = theory.best_gamma(alpha, c, verify_cost=cost)
  g_table, s_table = theory.best_gamma(alpha, c, verify_cost=table)
  np.testing.assert_array_equal(g_callable, g_table)
  np.testing.assert_allclose(s_callable, s_table)
  g_free, s_free = theory.best_gamma(alpha, c)
  assert np.all(g_callable <= g_free) and np.all(s_callable < s_free)
  np.testing.assert_allclose(
      theory.walltime_improvement(alpha, 3, c, verify_cost=np.ones(4)),
      theory.walltime_improvement(alpha, 3, c))
  np.testing.assert_allclose(
      theory.walltime_improvement(0.8, 3, 0.1, verify_cost=cost),
      theory.expected_tokens(0.8, 3) / (3 * 0.1 + 1.3))


def test_first_draft_step_cost():
  # c_first = c is eq. (5); a costlier first step is paid once per iteration,
  # so it lowers the speedup and favours longer drafts.
  alpha, c = np.array([0.6, 0.75, 0.9]), 0.1
  np.testing.assert_allclose(theory.walltime_improvement(alpha, 4, c, c_first=c),
                             theory.walltime_improvement(alpha, 4, c))
  np.testing.assert_allclose(
      theory.walltime_improvement(0.8, 3, 0.1, verify_cost=np.full(4, 1.5), c_first=0.4),
      theory.expected_tokens(0.8, 3) / (0.4 + 2 * 0.1 + 1.5))
  g_same, s_same = theory.best_gamma(alpha, c)
  g_first, s_first = theory.best_gamma(alpha, c, c_first=0.5)
  assert np.all(g_first >= g_same) and np.any(g_first > g_same) and np.all(s_first < s_same)
  gamma, speed = theory.best_gamma(0.8, np.array([0.05, 0.1]), c_first=np.array([[0.2], [0.4]]))
  assert gamma.shape == speed.shape == (2, 2)


def test_tokens_per_call_distribution():
  alpha = np.array([0.0, 0.3, 0.8, 1.0])
  for gamma in (1, 4, 9):
    probs = theory.tokens_per_call_distribution(alpha, gamma)
    assert probs.shape == (4, gamma + 1)
    assert np.all(probs >= 0)
    np.testing.assert_allclose(probs.sum(-1), 1.0)
    mean = probs @ np.arange(1, gamma + 2)
    np.testing.assert_allclose(mean, theory.expected_tokens(alpha, gamma))
  np.testing.assert_allclose(
      theory.tokens_per_call_distribution(0.5, 2), [0.5, 0.25, 0.25])


def test_expected_calls_by_hand_and_limits():
  # alpha 0.5, gamma 1: a call yields 1 or 2 tokens, each with probability 1/2.
  np.testing.assert_allclose(theory.expected_calls(0.5, 1, [0, 1, 2, 3]), [0, 1, 1.5, 2.25])
  lengths = np.arange(0, 30)
  np.testing.assert_allclose(theory.expected_calls(0.0, 4, lengths), lengths)  # one token a call
  np.testing.assert_allclose(theory.expected_calls(1.0, 4, lengths), np.ceil(lengths / 5))
  # Long outputs: tokens per call tends to eq. (1); short ones fall below it.
  alpha = np.array([0.3, 0.7, 0.9])
  np.testing.assert_allclose(2000 / theory.expected_calls(alpha, 4, 2000),
                             theory.expected_tokens(alpha, 4), rtol=2e-3)
  assert np.all(16 / theory.expected_calls(alpha, 4, 16) < theory.expected_tokens(alpha, 4))
  assert theory.expected_calls(alpha[:, None], 3, [5, 9]).shape == (3, 2)


def test_expected_calls_matches_simulation():
  # 20,000 simulated outputs per length; the mean is within 4.5 standard
  # errors of the exact value (false-positive rate ~1e-5 per length, 3 lengths).
  rng = np.random.default_rng(0)
  alpha, gamma, trials = 0.7, 4, 20_000
  for length in (1, 7, 16):
    calls = np.zeros(trials)
    left = np.full(trials, length)
    while np.any(left > 0):
      accepted = np.minimum(rng.geometric(1 - alpha, trials) - 1, gamma)  # drafts kept
      calls += left > 0
      left = np.maximum(left - accepted - 1, 0)
    exact = theory.expected_calls(alpha, gamma, length)
    assert abs(calls.mean() - exact) < 4.5 * calls.std() / np.sqrt(trials) + 1e-9


def test_finite_walltime_improvement():
  r = np.array([1.0, 1.3, 1.4, 1.5, 1.6])
  lengths = np.array([3, 16, 16, 40])
  tokens = lengths.sum() / theory.expected_calls(0.7, 4, lengths).sum()
  np.testing.assert_allclose(
      theory.finite_walltime_improvement(0.7, 4, 0.08, lengths, r, c_first=0.25),
      tokens / (0.25 + 3 * 0.08 + 1.6))
  # One very long output: eq. (5).
  long = theory.finite_walltime_improvement(0.7, 4, 0.08, [4000], r, c_first=0.25)
  np.testing.assert_allclose(long, theory.walltime_improvement(0.7, 4, 0.08, r, c_first=0.25),
                             rtol=2e-3)
  assert theory.finite_walltime_improvement(np.array([0.6, 0.8]), 3, 0.1, [10]).shape == (2,)
  np.testing.assert_allclose(theory.finite_tokens_per_call(0.7, 4, lengths), tokens)
  # alpha = 1: outputs of 5 and 8 tokens take 2 + 2 calls of up to 4 (gamma 3).
  np.testing.assert_allclose(theory.finite_tokens_per_call([1.0, 0.0], 3, [5, 8]), [13 / 4, 1.0])
  for bad in ([0, 0], [[5]]):
    with pytest.raises(ValueError, match='lengths must be a 1-D array'):
      theory.finite_tokens_per_call(0.7, 3, bad)


def test_expected_calls_along_by_hand_and_at_constant_beta():
  # gamma 4 over 1 1 0 | 1 1 1 1 | 1 0 | 1: keep 2 (3 tokens), sweep (5), keep 0 (1), and
  # the last token's draft kept (the draft past the end never is).
  assert theory.expected_calls_along([1, 1, 0, 1, 1, 1, 1, 1, 0, 1], 4) == 4.0
  assert theory.expected_calls_along([0, 0, 0], 2) == 3.0
  assert theory.expected_calls_along([], 3) == 0.0
  for alpha in (0.0, 0.3, 0.7, 1.0):
    for length in (1, 2, 7, 30):
      for gamma in (1, 3, 4):
        np.testing.assert_allclose(theory.expected_calls_along(np.full(length, alpha), gamma),
                                   theory.expected_calls(alpha, gamma, length))


def test_expected_calls_along_matches_simulation():
  # 20,000 simulated decodings of one output whose acceptance varies by
  # position; calls within 4.5 standard errors of the exact value (false-positive
  # rate ~1e-5).
  rng = np.random.default_rng(1)
  betas = rng.uniform(size=23) ** 0.5
  gamma, trials = 4, 20_000
  known = np.zeros(trials, int)
  calls = np.zeros(trials)
  padded = np.append(betas, np.zeros(gamma))
  while np.any(known < len(betas)):
    active = known < len(betas)
    kept = np.zeros(trials, int)
    going = active.copy()
    for i in range(gamma):
      going &= rng.uniform(size=trials) < padded[np.minimum(known + i, len(padded) - 1)]
      kept += going
    calls += active
    known = np.where(active, np.minimum(known + kept + 1, len(betas)), known)
  exact_calls = theory.expected_calls_along(betas, gamma)
  assert abs(calls.mean() - exact_calls) < 4.5 * calls.std() / np.sqrt(trials)


def test_positional_walltime_improvement():
  r = np.array([1.0, 1.3, 1.4, 1.5, 1.6])
  lengths = [3, 16, 40]
  constant = [np.full(n, 0.7) for n in lengths]
  # The same calls at a constant beta.
  np.testing.assert_allclose(
      theory.positional_walltime_improvement(constant, 4, 0.1, r, c_first=0.25),
      theory.finite_walltime_improvement(0.7, 4, 0.1, lengths, r, c_first=0.25))
  betas = [np.array([1, 1, 1, 1, 1, 0, 1.0])]  # one sweep (5 tokens), then 0 and 1 kept
  np.testing.assert_allclose(theory.positional_walltime_improvement(betas, 4, 0.1, r, 0.2),
                             7 / 3 / (0.2 + 3 * 0.1 + 1.6))


def test_iteration_cost_replaces_the_summed_parts():
  r = np.array([1.0, 1.3, 1.4, 1.5, 1.6])
  # An iteration timed whole at 2.1 target steps, where c_first + 3 c + r(5) sums to 1.9.
  np.testing.assert_allclose(theory.walltime_improvement(0.7, 4, 0.1, r, 0.2, iteration_cost=2.1),
                             theory.expected_tokens(0.7, 4) / 2.1)
  betas = [np.array([1, 1, 1, 1, 1, 0, 1.0])]  # as above: 3 calls
  np.testing.assert_allclose(
      theory.positional_walltime_improvement(betas, 4, 0.1, r, 0.2, iteration_cost=2.1),
      7 / 3 / 2.1)
  with pytest.raises(ValueError, match='iteration_cost'):
    theory.walltime_improvement(0.7, 4, 0.1, iteration_cost=0.0)
  np.testing.assert_allclose(theory.summed_iteration_cost(4, 0.1, r, 0.2), 0.2 + 0.3 + 1.6)
  np.testing.assert_allclose(theory.summed_iteration_cost([1, 4], 0.1), [1.1, 1.4])  # r = 1


def test_best_gamma_along():
  r = np.array([1.0, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0])
  # Runs of four easy tokens, then a hard one: gamma 4 sweeps each run.
  betas = [np.tile([1.0, 1, 1, 1, 0], 8)]
  gamma, speedups = theory.best_gamma_along(betas, 0.05, 8, r, c_first=0.1)
  assert gamma == 4 and speedups.tolist() == [
      theory.positional_walltime_improvement(betas, g, 0.05, r, 0.1) for g in range(1, 9)]
  assert max(speedups) == speedups[3]
  # Constant acceptance over long outputs: eq. (5)'s choice.
  long = [np.full(3000, 0.8)]
  assert theory.best_gamma_along(long, 0.05, 8, r)[0] == int(
      theory.best_gamma(0.8, 0.05, 8, r)[0])


@pytest.mark.parametrize('call', [
    lambda: theory.expected_tokens(1.2, 3),
    lambda: theory.expected_tokens(-0.1, 3),
    lambda: theory.expected_tokens(np.nan, 3),
    lambda: theory.expected_tokens(0.5, 0),
    lambda: theory.expected_tokens(0.5, 2.5),
    lambda: theory.expected_tokens(0.5, True),
    lambda: theory.walltime_improvement(0.5, 3, -0.1),
    lambda: theory.operations_factor(0.5, 3, np.inf),
    lambda: theory.tokens_per_call_distribution(0.5, [2, 3]),
    lambda: theory.best_gamma(0.5, 0.1, gamma_max=0),
    lambda: theory.best_gamma(0.5, 0.1, gamma_max=10, verify_cost=np.ones(5)),
    lambda: theory.walltime_improvement(0.5, 3, 0.1, verify_cost=lambda k: 0 * k),
    lambda: theory.walltime_improvement(0.5, 3, 0.1, c_first=-1.0),
    lambda: theory.best_gamma(0.5, 0.1, c_first=np.nan),
    lambda: theory.expected_calls(0.5, 3, -1),
    lambda: theory.expected_calls(0.5, 3, 2.5),
    lambda: theory.expected_calls(0.5, 3, np.inf),
    lambda: theory.expected_calls(0.5, [2, 3], 4),
    lambda: theory.finite_walltime_improvement(0.5, 3, 0.1, []),
    lambda: theory.finite_walltime_improvement(0.5, 3, 0.1, [[4, 5]]),
    lambda: theory.expected_calls_along([0.5, 1.5], 3),
    lambda: theory.expected_calls_along([[0.5]], 3),
    lambda: theory.expected_calls_along([0.5], 0),
    lambda: theory.positional_walltime_improvement([], 3, 0.1),
    lambda: theory.best_gamma_along([[0.5]], 0.1, gamma_max=0),
])
def test_bad_inputs_raise(call):
  with pytest.raises(ValueError):
    call()
