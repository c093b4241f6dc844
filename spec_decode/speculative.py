"""The accept/reject rule of speculative sampling (Algorithm 1, steps 3-4).

Pure array math on fixed shapes, batched over rows. Given gamma tokens
x_1..x_gamma drawn from the draft's distributions q_1..q_gamma and the target's
distributions p_1..p_{gamma+1} at the same positions (one verify pass), two
rules keep a prefix x_1..x_n and draw the target's own token y after it.

Token verification (Leviathan et al. 2023, Algorithm 1):
  accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), stop at the first
  rejection; n = the length of the accepted prefix;
  if n < gamma, draw y from norm(max(0, p_{n+1} - q_{n+1}));
  if n = gamma (a clean sweep), draw the bonus token y from p_{gamma+1}.

Block verification (Sun et al. 2025, "Block Verification Accelerates
Speculative Decoding", Algorithm 2) judges the block jointly. With w_0 = 1,
  w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)),
  r_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x)),
  h_i = r_i / (r_i + 1 - w_i) for i < gamma (0 where r_i + 1 - w_i = 0),
  h_gamma = w_gamma,
n is the largest i with eta_i < h_i (eta_i uniform; 0 if none), and y is drawn
from norm(max(0, w_n p_{n+1} - q_{n+1})) (p_{gamma+1} after a clean sweep).
Sun et al. prove it exact, never worse than token verification in expected
accepted drafts, and optimal among verifiers that see the same p and q.

Either way x_1..x_n, y are distributed exactly as the target's own samples
(Leviathan et al., Theorem 3.5 / Appendix A.1, and Sun et al.). With lenience
l < 1 (Appendix A.5) q is multiplied by l in the tests and in the residual:
more drafts are accepted and the output is no longer exactly p. Block
verification with l < 1 (l q in place of q in w, r and the residual) is this
project's extension, inexact like token verification's.
"""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checks
from spec_decode import sampling

# Residual mass below this is rounding noise: p and q agree, and the
# (numerically possible) rejection falls back to p itself.
_TINY = 1e-20

VERIFICATIONS = checks.VERIFICATIONS  # the rules accept_reject knows


def accept_reject(key: jax.Array, drafts: jax.Array, q: jax.Array, p: jax.Array,
                  lenience: float | jax.Array = 1.0,
                  verification: str = 'token',
                  lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Verifies gamma drafted tokens per row against the target.

  Args:
    key: [B] PRNG keys, one stream per row.
    drafts: [B, gamma] int32 tokens x_i drawn from q.
    q: [B, gamma, V] float32 draft distributions q_i.
    p: [B, gamma + 1, V] float32 target distributions p_i (the last one is the
      bonus distribution after a clean sweep).
    lenience: l in (0, 1]; 1 is exact speculative sampling.
    verification: static; 'token' (Algorithm 1) or 'block' (Sun et al.).
    lengths: optional [B] int32 in 1..gamma: row b proposed only its first
      lengths[b] drafts (adaptive draft length); the rest are never accepted
      and after all lengths[b] the bonus token comes from p_{lengths[b] + 1}.

  Returns:
    n: [B] int32 number of accepted drafts, in 0..gamma (0..lengths[b]).
    next_token: [B] int32 the target's own token at position n + 1 (residual
      sample after a rejection, bonus sample after a clean sweep).

  Raises:
    ValueError: shapes that do not fit together, a lenience outside (0, 1],
      an unknown verification, or (when not traced) draft ids outside the
      vocabulary.
  """
  _check_shapes(drafts, q, p)
  checks.check_lenience(lenience)
  checks.check_verification(verification)
  batch, gamma, vocab = q.shape
  accept_key, residual_key = jnp.moveaxis(jax.vmap(jax.random.split)(key), 1, 0)
  u = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(accept_key)  # [B, gamma] in [0, 1)
  ratio = acceptance_ratio(drafts, q, p, lenience)
  if lengths is not None:  # q = 0 beyond a row's length: a proposal p never makes
    proposed = jnp.arange(gamma)[None, :] < lengths[:, None]
    ratio = jnp.where(proposed, ratio, 0.0)
    q = jnp.where(proposed[..., None], q, 0.0)
  if verification == 'token':
    accepted = jnp.cumprod(u < ratio, axis=-1)  # first rejection zeroes the rest
    n = jnp.sum(accepted, axis=-1).astype(jnp.int32)  # [B]
    weight = jnp.ones((batch,), p.dtype)
  else:
    w, h = block_weights(ratio, q, p, lenience)
    slots = jnp.arange(1, gamma + 1)
    n = jnp.max(jnp.where(u < h, slots, 0), axis=-1).astype(jnp.int32)  # last stop, else 0
    weight = jnp.take_along_axis(w, n[:, None], axis=1)[:, 0]  # w_n [B]

  # Distribution of the target's own token at position n + 1. Padding q with a
  # zero row makes the clean-sweep case (n = gamma) the bonus distribution p.
  q_padded = jnp.concatenate([q, jnp.zeros((batch, 1, vocab), q.dtype)], axis=1)
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [B, V]
  q_n = jnp.take_along_axis(q_padded, n[:, None, None], axis=1)[:, 0]  # [B, V]
  residual = jnp.maximum(weight[:, None] * p_n - lenience * q_n, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  residual = jnp.where(mass > _TINY, residual / jnp.where(mass > _TINY, mass, 1.0), p_n)
  next_token = sampling.sample(residual_key, residual)
  return n, next_token


def accept(key: jax.Array, drafts: jax.Array, q: jax.Array, target_logits: jax.Array,
           params: sampling.SamplingParams, lenience: float | jax.Array = 1.0,
           verification: str = 'token',
           lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Steps 3-4 from the target's logits: p = sampling.adjust, then accept_reject.

  Calls where every row is greedy take `accept_greedy` on the target's argmax
  instead: the same decision, without building p or the V-sized test.

  Args:
    key, drafts, q, lenience, verification, lengths: as for accept_reject.
    target_logits: [B, gamma + 1, V] the verify call's logits.
    params: the sampling knobs (p gets the same ones as q).

  Returns:
    n: [B] int32 accepted drafts; next_token: [B] int32.
  """
  return jax.lax.cond(
      sampling.all_greedy(params),
      lambda: accept_greedy(drafts, sampling.argmax(target_logits), lengths),
      lambda: accept_reject(key, drafts, q, sampling.adjust_sampled(target_logits, params),
                            lenience, verification, lengths))


def accept_greedy(drafts: jax.Array, target_tokens: jax.Array,
                  lengths: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """`accept_reject` at temperature 0, from token ids alone.

  With one-hot p and q the acceptance ratio p_i(x_i) / (l q_i(x_i)) is 0 or
  >= 1, so token verification keeps the drafts up to the first one that is not
  the target's argmax, and the residual max(0, p - l q) after it is the one-hot
  of the target's argmax. Block verification keeps the same prefix: w_i is 1
  while every draft matched and 0 after, so h_i is 0 past the matched prefix,
  and 1 at its end j (r_j = 1 where the next draft misses; h_gamma = w_gamma
  after a sweep), so the largest i with eta_i < h_i is j; there w_j = 1. So
  for any lenience and either rule this is accept_reject's (n, next_token) on
  the one-hot distributions, without their V-sized work; adaptive lengths
  (q and the ratio 0 past them) end the prefix the same way.

  Args:
    drafts: [B, gamma] int32 drafted tokens (the draft's argmaxes).
    target_tokens: [B, gamma + 1] int32 the target's argmax at each position.
    lengths: optional [B] int32 in 1..gamma: drafts proposed per row.

  Returns:
    n: [B] int32 accepted drafts; next_token: [B] int32 target_tokens[:, n].
  """
  gamma = drafts.shape[1]
  matched = drafts == target_tokens[:, :gamma]
  if lengths is not None:
    matched &= jnp.arange(gamma)[None, :] < lengths[:, None]
  n = jnp.sum(jnp.cumprod(matched, axis=-1), axis=-1).astype(jnp.int32)
  return n, jnp.take_along_axis(target_tokens, n[:, None], axis=1)[:, 0]


def block_weights(ratio: jax.Array, q: jax.Array, p: jax.Array,
                  lenience: float | jax.Array = 1.0) -> tuple[jax.Array, jax.Array]:
  """Block verification's weights w and stop probabilities h.

  Args:
    ratio: [B, gamma] p_i(x_i) / (l q_i(x_i)) for the drafted tokens.
    q: [B, gamma, V] draft distributions.
    p: [B, gamma + 1, V] target distributions.
    lenience: l in (0, 1]; 1 is exact.

  Returns:
    w: [B, gamma + 1] w_0 = 1, w_1..w_gamma.
    h: [B, gamma] h_1..h_gamma: the block stops at the last i with eta_i < h_i.
  """
  w = [jnp.ones(ratio.shape[:1], ratio.dtype)]
  for i in range(ratio.shape[1]):
    w.append(jnp.minimum(w[-1] * ratio[:, i], 1.0))
  w = jnp.stack(w, axis=1)
  inner = w[:, 1:-1]  # [B, gamma - 1] w_1..w_{gamma-1}
  r = jnp.sum(jnp.maximum(inner[..., None] * p[:, 1:-1] - lenience * q[:, 1:], 0.0), axis=-1)
  denominator = r + 1.0 - inner
  # Zero where w_i = 1 and p_{i+1} <= l q_{i+1}: nothing is left to draw there.
  h = jnp.where(denominator > 0, r / jnp.where(denominator > 0, denominator, 1.0), 0.0)
  return w, jnp.concatenate([h, w[:, -1:]], axis=1)


def acceptance_ratio(drafts: jax.Array, q: jax.Array, p: jax.Array,
                     lenience: float | jax.Array = 1.0) -> jax.Array:
  """[B, gamma]: p_i(x_i) / (l q_i(x_i)) for the drafted tokens [B, gamma].

  q: [B, gamma, V]; p: [B, gamma + 1, V] (the last row is not read). NaN where
  p_i(x_i) or q_i(x_i) is NaN: every test `u < ratio` then rejects.
  """
  p_x = jnp.take_along_axis(p[:, :q.shape[1]], drafts[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0] * lenience
  # q(x) = 0 cannot happen for a token drawn from q; if a draft proposes one
  # anyway, accept exactly when the target could have produced it. A NaN in
  # q(x) or p(x) gives a NaN ratio, which no uniform draw is below: rejected
  # (the residual, NaN too, then falls back to p in accept_reject).
  return jnp.where(q_x == 0, jnp.where(p_x > 0, 1.0, 0.0), p_x / jnp.where(q_x == 0, 1.0, q_x))


def _check_shapes(drafts: jax.Array, q: jax.Array, p: jax.Array) -> None:
  """Raises ValueError unless drafts [B, gamma], q [B, gamma, V], p [B, gamma + 1, V]."""
  if q.ndim != 3 or drafts.shape != q.shape[:2] or p.shape != (q.shape[0], q.shape[1] + 1,
                                                                  q.shape[2]):
    raise ValueError(f'accept_reject needs drafts [B, gamma], q [B, gamma, V] and p '
                     f'[B, gamma + 1, V] (the bonus row last); got drafts {drafts.shape}, '
                     f'q {q.shape}, p {p.shape}')
  if not jnp.issubdtype(drafts.dtype, jnp.integer):
    raise ValueError(f'drafts must be integer token ids, got {drafts.dtype}')
  if not isinstance(drafts, jax.core.Tracer) and drafts.size:
    ids = np.asarray(drafts)
    if ids.min() < 0 or ids.max() >= q.shape[2]:
      raise ValueError(f'draft ids must lie in [0, {q.shape[2]}), got {ids.min()}..{ids.max()}')
