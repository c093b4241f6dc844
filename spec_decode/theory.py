"""The paper's cost model: tokens per target call, walltime and operations.

Section 3 of Leviathan et al. (2023) models acceptance as i.i.d. with rate
`alpha`: each of the `gamma` draft tokens is accepted with probability `alpha`
until the first rejection. A target call then yields `n + 1` tokens, `n` the
accepted drafts plus one token from the target (the residual sample or the
bonus). `c` is the time of a draft step over a target step and `c_hat` the
ratio of their arithmetic operations.

All functions take numpy arrays (or scalars), broadcast their arguments and
return float64 arrays. `gamma` must hold integers >= 1.
"""

from typing import Callable, Optional, Sequence, Union

import numpy as np

ArrayLike = Union[float, int, np.ndarray]
# Cost of one target pass over K = gamma + 1 positions, in single-step units:
# a callable K -> cost, or a 1-D array whose entry K - 1 is that cost.
VerifyCost = Union[Callable[[np.ndarray], ArrayLike], np.ndarray]

# (alpha, gamma) rows of Table 1, which assumes c = c_hat = 0.
TABLE1_ROWS = ((0.6, 2), (0.7, 3), (0.8, 2), (0.8, 5), (0.9, 2), (0.9, 10))


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
  alpha = np.asarray(alpha, dtype=np.float64)
  if not np.all((alpha >= 0) & (alpha <= 1)):  # Also rejects NaN.
    raise ValueError(f'alpha must lie in [0, 1], got {alpha}.')
  return alpha


def _check_gamma(gamma: ArrayLike) -> np.ndarray:
  gamma = np.asarray(gamma)
  if (gamma.dtype == bool or not np.issubdtype(gamma.dtype, np.number)
      or not np.all(np.isfinite(gamma) & (gamma >= 1) & (gamma == np.round(gamma)))):
    raise ValueError(f'gamma must be an integer >= 1, got {gamma}.')
  return gamma.astype(np.int64)


def _check_cost(value: ArrayLike, name: str) -> np.ndarray:
  value = np.asarray(value, dtype=np.float64)
  if not np.all(np.isfinite(value) & (value >= 0)):
    raise ValueError(f'{name} must be finite and >= 0, got {value}.')
  return value


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike) -> np.ndarray:
  """Eq. (1): expected tokens per target call, (1 - alpha^(gamma+1)) / (1 - alpha).

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: draft length(s), integers >= 1.

  Returns:
    The broadcast array of expected tokens; gamma + 1 where alpha == 1.
  """
  alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
  # expm1/log keep the ratio accurate for alpha close to 1.
  with np.errstate(divide='ignore', invalid='ignore'):
    log_alpha = np.log(alpha)
    ratio = np.expm1((gamma + 1) * log_alpha) / np.expm1(log_alpha)
  return np.where(alpha == 1, gamma + 1.0, ratio)


def tokens_per_call_distribution(alpha: ArrayLike, gamma: int) -> np.ndarray:
  """P(a target call yields k tokens), k = 1 .. gamma + 1 (truncated geometric).

  P(k) = alpha^(k-1) (1 - alpha) for k <= gamma, and P(gamma + 1) = alpha^gamma
  (all drafts accepted, plus the bonus token). Its mean is eq. (1).

  Args:
    alpha: acceptance rate(s) in [0, 1], any shape S.
    gamma: the draft length, a single integer >= 1.

  Returns:
    [*S, gamma + 1] probabilities; entry k - 1 is P(k tokens).
  """
  alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
  if gamma.ndim:
    raise ValueError(f'gamma must be a single integer here, got {gamma}.')
  k = np.arange(1, gamma + 2)
  a = alpha[..., None]
  # [*S, 1] ** [gamma + 1] -> [*S, gamma + 1]
  probs = a ** (k - 1) * (1 - a)
  probs[..., -1] = alpha**gamma
  return probs


def expected_calls(alpha: ArrayLike, gamma: int, length: ArrayLike) -> np.ndarray:
  """Expected target calls for an output of `length` tokens, under eq. (1)'s model.

  Eq. (1) is the mean of a call that can run its course. An output of L tokens
  (EOS included) ends mid-call: its last call yields at most the tokens left,
  so a short output takes more calls than L / eq. (1). With E(0) = 0,
    E(L) = 1 + sum_k P(k) E(max(L - k, 0)),
  P(k) the truncated geometric law of `tokens_per_call_distribution`. As L
  grows, L / E(L) tends to eq. (1).

  Args:
    alpha: acceptance rate(s) in [0, 1], any shape S.
    gamma: the draft length, a single integer >= 1.
    length: output length(s), integers >= 0, any shape broadcastable with S.

  Returns:
    The broadcast array of expected calls (float64).
  """
  alpha = _check_alpha(alpha)
  length = np.asarray(length)
  if (length.dtype == bool or not np.issubdtype(length.dtype, np.number)
      or not np.all(np.isfinite(length) & (length >= 0) & (length == np.round(length)))):
    raise ValueError(f'length must hold integers >= 0, got {length}.')
  length = length.astype(np.int64)
  probs = tokens_per_call_distribution(alpha, gamma)  # [*S, gamma + 1]
  most = int(np.max(length, initial=0))
  calls = np.zeros(alpha.shape + (most + 1,))  # [*S, most + 1]: E(0 .. most)
  for n in range(1, most + 1):
    left = np.maximum(n - np.arange(1, probs.shape[-1] + 1), 0)  # [gamma + 1]
    calls[..., n] = 1 + np.sum(probs * calls[..., left], axis=-1)
  alpha, length = np.broadcast_arrays(alpha, length)
  calls = np.broadcast_to(calls, alpha.shape + (most + 1,))
  return np.take_along_axis(calls, length[..., None], axis=-1)[..., 0]


def finite_tokens_per_call(alpha: ArrayLike, gamma: int, lengths: ArrayLike) -> np.ndarray:
  """Tokens per call over outputs of [N] `lengths` (sum > 0): sum(lengths) / sum(E(L)).

  Below eq. (1) at the same alpha (shape S): an output ends mid-call.
  """
  lengths = np.asarray(lengths)
  if lengths.ndim != 1 or not np.sum(lengths) > 0:
    raise ValueError(f'lengths must be a 1-D array of output lengths with a positive sum, '
                     f'got {lengths}.')
  alpha = _check_alpha(alpha)
  return np.sum(lengths) / np.sum(expected_calls(alpha[..., None], gamma, lengths), axis=-1)


def expected_calls_along(betas: ArrayLike, gamma: int) -> float:
  """Expected target calls for one output, acceptance per position.

  Eq. (1) and `expected_calls` give every draft the same acceptance
  probability alpha. Along a real output it changes from position to position
  (`alpha_lib.betas`: 0 or 1 at temperature 0): an iteration that starts in
  a hard stretch ends early, so hard positions start more iterations than
  their share of tokens and the tokens per call fall below eq. (1) at their
  mean. Here the draft for position t is accepted with probability betas[t]
  once all drafts before it in its iteration were (1-based positions as the
  output's tokens; the draft of the position past the end is never accepted).
  With E(L) = 0 and j tokens known,
    E(j) = 1 + sum_m P_j(m) E(min(j + m + 1, L)),
    P_j(m) = betas[j] ... betas[j + m - 1] (1 - betas[j + m]) for m < gamma,
    P_j(gamma) = betas[j] ... betas[j + gamma - 1].
  With every beta equal to alpha this is `expected_calls(alpha, gamma, L)`.

  Args:
    betas: [L] acceptance probabilities in [0, 1] of the output's L tokens
      (EOS included): betas[t] for token t + 1.
    gamma: the draft length, a single integer >= 1.

  Returns:
    The expected target calls.
  """
  betas = _check_alpha(betas)
  gamma = int(_check_gamma(gamma))
  if betas.ndim != 1:
    raise ValueError(f'betas must be 1-D (one output), got shape {betas.shape}.')
  length = betas.shape[0]
  padded = np.concatenate([betas, np.zeros(gamma)])  # nothing is accepted past the end
  calls = np.zeros(length + 1)
  for j in range(length - 1, -1, -1):
    reach = np.cumprod(np.concatenate([[1.0], padded[j:j + gamma]]))  # P(>= m accepted)
    probs = reach - np.append(reach[1:], 0.0)  # P(m accepted), m = 0 .. gamma
    calls[j] = 1 + probs @ calls[np.minimum(j + np.arange(gamma + 1) + 1, length)]
  return float(calls[0])


def finite_walltime_improvement(
    alpha: ArrayLike,
    gamma: int,
    c: ArrayLike,
    lengths: ArrayLike,
    verify_cost: Optional[VerifyCost] = None,
    c_first: Optional[ArrayLike] = None,
) -> np.ndarray:
  """Eq. (5) over outputs of the given lengths.

  `walltime_improvement` with the tokens per call that short outputs show,
  `finite_tokens_per_call`'s, not eq. (1)'s (an output ends mid-call).

  Args:
    alpha: acceptance rate(s) in [0, 1], any shape S.
    gamma: the draft length, a single integer >= 1.
    c: draft step time over target step time, >= 0.
    lengths: [N] output lengths, integers >= 0 with a positive sum.
    verify_cost: as in `walltime_improvement`.
    c_first: as in `walltime_improvement`.

  Returns:
    The expected speedup, of shape S broadcast with c and c_first.
  """
  tokens = finite_tokens_per_call(alpha, gamma, lengths)
  return tokens / _iteration_cost(gamma, c, verify_cost, c_first)[2]


def positional_walltime_improvement(
    betas: Sequence[ArrayLike],
    gamma: int,
    c: ArrayLike,
    verify_cost: Optional[VerifyCost] = None,
    c_first: Optional[ArrayLike] = None,
    iteration_cost: Optional[float] = None,
) -> float:
  """`finite_walltime_improvement` with each output's acceptance per position.

  The calls are those of `expected_calls_along` over the outputs' measured
  betas, instead of those of one alpha at every position.

  Args:
    betas: one [L_i] array per output: the acceptance probability of each of
      its tokens (`alpha_lib.AlphaStats.betas`); the lengths sum to > 0.
    gamma: the draft length, a single integer >= 1.
    c: draft step time over target step time, >= 0 (a scalar).
    verify_cost: as in `walltime_improvement`.
    c_first: as in `walltime_improvement`.
    iteration_cost: as in `walltime_improvement`.

  Returns:
    The expected speedup.
  """
  tokens = sum(np.size(b) for b in betas)
  if not tokens:
    raise ValueError('betas must hold at least one position.')
  calls = sum(expected_calls_along(b, gamma) for b in betas)
  return float(tokens / calls / _iteration_cost(gamma, c, verify_cost, c_first,
                                                iteration_cost)[2])


def best_gamma_along(betas: Sequence[ArrayLike], c: float, gamma_max: int = 8,
                     verify_cost: Optional[VerifyCost] = None,
                     c_first: Optional[float] = None) -> tuple[int, np.ndarray]:
  """`best_gamma` by `positional_walltime_improvement`, ties to the smaller gamma.

  Where acceptance varies along the outputs, long drafts pay less than eq. (5)
  at their mean promises (a hard stretch ends them early), so this gamma is
  often the smaller one.

  Returns:
    (gamma, [gamma_max] the predicted speedup of each gamma = 1 .. gamma_max).
  """
  speedups = np.array([positional_walltime_improvement(betas, g, c, verify_cost, c_first)
                       for g in range(1, int(_check_gamma(gamma_max)) + 1)])
  return 1 + int(np.argmax(speedups)), speedups


def _iteration_cost(gamma: ArrayLike, c: ArrayLike, verify_cost: Optional[VerifyCost],
                    c_first: Optional[ArrayLike], iteration_cost: Optional[ArrayLike] = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(gamma, c, one iteration in target steps: `iteration_cost`, else summed), checked."""
  gamma, c = _check_gamma(gamma), _check_cost(c, 'c')
  if iteration_cost is not None:
    cost = _check_cost(iteration_cost, 'iteration_cost')
    if np.any(cost <= 0):
      raise ValueError(f'iteration_cost must be > 0, got {iteration_cost}.')
    return gamma, c, cost
  c_first = c if c_first is None else _check_cost(c_first, 'c_first')
  return gamma, c, c_first + (gamma - 1) * c + _verify_cost(verify_cost, gamma + 1)


def summed_iteration_cost(gamma: ArrayLike, c: ArrayLike, verify_cost: Optional[VerifyCost] = None,
                          c_first: Optional[ArrayLike] = None) -> np.ndarray:
  """One iteration's model calls from parts timed apart: c_first + (gamma - 1) c + r(gamma + 1)."""
  return _iteration_cost(gamma, c, verify_cost, c_first)[2]


def _verify_cost(verify_cost: Optional[VerifyCost], k: np.ndarray) -> np.ndarray:
  """Cost r(k) of one target pass over k positions; r = 1 if None."""
  if verify_cost is None:
    return np.ones(k.shape)
  if callable(verify_cost):
    cost = np.broadcast_to(np.asarray(verify_cost(k), np.float64), k.shape)
  else:
    table = np.asarray(verify_cost, dtype=np.float64)
    if table.ndim != 1 or table.shape[0] < np.max(k):
      raise ValueError(
          f'verify_cost array needs one entry per K = 1 .. {np.max(k)}, '
          f'got shape {table.shape}.')
    cost = table[k - 1]
  if not np.all(np.isfinite(cost) & (cost > 0)):
    raise ValueError(f'verify_cost must be finite and > 0, got {cost}.')
  return cost


def walltime_improvement(
    alpha: ArrayLike,
    gamma: ArrayLike,
    c: ArrayLike,
    verify_cost: Optional[VerifyCost] = None,
    c_first: Optional[ArrayLike] = None,
    iteration_cost: Optional[ArrayLike] = None,
) -> np.ndarray:
  """Eq. (5): expected walltime speedup over plain decoding.

  (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)). The paper assumes the
  target pass over gamma + 1 positions costs one step and every draft step
  costs c. Where they do not, two measured costs refine it: `verify_cost`
  gives the target pass's cost r(gamma + 1) in target steps (a CPU, a large
  batch), and `c_first` the cost of the first draft step after a target call
  (on a CPU the target call evicts the draft's weights from the cache, which
  that step reads back). The speedup is then E[tokens] / summed_iteration_cost.

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: draft length(s), integers >= 1.
    c: draft step time over target step time, >= 0.
    verify_cost: None (r = 1), a callable K -> r(K), or an array with
      verify_cost[K - 1] = r(K).
    c_first: None (= c), or the first draft step's time after a target call
      over a target step, >= 0.
    iteration_cost: None, or an iteration's model calls timed whole in one
      loop, in target steps, > 0, in place of `summed_iteration_cost`: it
      counts what the two models cost each other beyond c_first (each evicts
      the other's weights from a CPU's cache).

  Returns:
    The broadcast array of expected speedups.
  """
  return expected_tokens(alpha, gamma) / _iteration_cost(gamma, c, verify_cost, c_first,
                                                         iteration_cost)[2]


def operations_factor(
    alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike
) -> np.ndarray:
  """Eq. (6): expected arithmetic operations relative to plain decoding.

  (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)), i.e. the
  operations of one iteration (gamma draft steps, a target pass over gamma + 1
  positions) divided by the tokens it yields.

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: draft length(s), integers >= 1.
    c_hat: draft operations per token over target operations per token, >= 0.

  Returns:
    The broadcast array of operation factors (>= 1 when c_hat >= 0).
  """
  tokens = expected_tokens(alpha, gamma)
  gamma, c_hat = _check_gamma(gamma), _check_cost(c_hat, 'c_hat')
  return (gamma * c_hat + gamma + 1) / tokens


def best_gamma(
    alpha: ArrayLike,
    c: ArrayLike,
    gamma_max: int = 30,
    verify_cost: Optional[VerifyCost] = None,
    c_first: Optional[ArrayLike] = None,
) -> tuple[np.ndarray, np.ndarray]:
  """The gamma in 1 .. gamma_max that maximises eq. (5), by exhaustive search.

  Ties go to the smaller gamma. When alpha <= c no gamma gives a speedup
  (Corollary 3.9) and the returned speedup is < 1: decode without a draft.

  Args:
    alpha: acceptance rate(s) in [0, 1].
    c: draft step time over target step time, >= 0.
    gamma_max: the largest gamma considered.
    verify_cost: as in `walltime_improvement`.
    c_first: as in `walltime_improvement`.

  Returns:
    (gamma, speedup), both of the broadcast shape of alpha, c and c_first.
  """
  alpha, c = _check_alpha(alpha), _check_cost(c, 'c')
  c_first = c if c_first is None else _check_cost(c_first, 'c_first')
  alpha, c, c_first = np.broadcast_arrays(alpha, c, c_first)
  gamma_max = int(_check_gamma(gamma_max))
  gammas = np.arange(1, gamma_max + 1)
  # [*S, 1] x [gamma_max] -> [*S, gamma_max]
  speedups = walltime_improvement(
      alpha[..., None], gammas, c[..., None], verify_cost, c_first[..., None])
  best = np.argmax(speedups, axis=-1)
  return gammas[best], np.take_along_axis(speedups, best[..., None], -1)[..., 0]


def speedup_possible(alpha: ArrayLike, c: ArrayLike) -> np.ndarray:
  """Corollary 3.9: some gamma improves walltime iff alpha > c."""
  return _check_alpha(alpha) > _check_cost(c, 'c')


def gamma1_improvement(alpha: ArrayLike, c: ArrayLike) -> np.ndarray:
  """(1 + alpha) / (1 + c): eq. (5) at gamma = 1, the bound of Corollary 3.9."""
  return (1 + _check_alpha(alpha)) / (1 + _check_cost(c, 'c'))


def table1() -> list[dict[str, float]]:
  """Table 1: operations and speed for the paper's (alpha, gamma), c = c_hat = 0.

  Returns:
    One dict per row with keys alpha, gamma, operations, speed.
  """
  return [
      dict(alpha=alpha, gamma=gamma,
           operations=float(operations_factor(alpha, gamma, 0.0)),
           speed=float(walltime_improvement(alpha, gamma, 0.0)))
      for alpha, gamma in TABLE1_ROWS
  ]
