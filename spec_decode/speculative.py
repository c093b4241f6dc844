"""The accept/reject rule of speculative sampling (Algorithm 1, steps 3-4).

Pure array math on fixed shapes, batched over rows. Given gamma tokens
x_1..x_gamma drawn from the draft's distributions q_1..q_gamma and the target's
distributions p_1..p_{gamma+1} at the same positions (one verify pass):

  accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), stop at the first
  rejection; n = the length of the accepted prefix;
  if n < gamma, draw the target's own token from norm(max(0, p_{n+1} - q_{n+1}));
  if n = gamma (a clean sweep), draw the bonus token from p_{gamma+1}.

The emitted tokens x_1..x_n, y are distributed exactly as the target's own
samples (Leviathan et al. 2023, Theorem 3.5 / Appendix A.1). With lenience
l < 1 (Appendix A.5) q is multiplied by l in the test and in the residual: more
drafts are accepted and the output is no longer exactly p.
"""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import sampling

# Residual mass below this is rounding noise: p and q agree, and the
# (numerically possible) rejection falls back to p itself.
_TINY = 1e-20


def check_lenience(lenience: float | jax.Array) -> None:
  """Raises ValueError unless lenience is a scalar in (0, 1]; a traced one passes unchecked."""
  if isinstance(lenience, jax.core.Tracer):
    return
  value = np.asarray(lenience)
  if value.shape or not np.issubdtype(value.dtype, np.number) or not 0 < value <= 1:
    raise ValueError(f'lenience must be a number in (0, 1], got {lenience!r}')


def accept_reject(key: jax.Array, drafts: jax.Array, q: jax.Array, p: jax.Array,
                  lenience: float | jax.Array = 1.0) -> tuple[jax.Array, jax.Array]:
  """Verifies gamma drafted tokens per row against the target.

  Args:
    key: [B] PRNG keys, one stream per row.
    drafts: [B, gamma] int32 tokens x_i drawn from q.
    q: [B, gamma, V] float32 draft distributions q_i.
    p: [B, gamma + 1, V] float32 target distributions p_i (the last one is the
      bonus distribution after a clean sweep).
    lenience: l in (0, 1]; 1 is exact speculative sampling.

  Returns:
    n: [B] int32 number of accepted drafts, in 0..gamma.
    next_token: [B] int32 the target's own token at position n + 1 (residual
      sample after a rejection, bonus sample after a clean sweep).

  Raises:
    ValueError: shapes that do not fit together, a lenience outside (0, 1],
      or (when not traced) draft ids outside the vocabulary.
  """
  _check_shapes(drafts, q, p)
  check_lenience(lenience)
  batch, gamma, vocab = q.shape
  accept_key, residual_key = jnp.moveaxis(jax.vmap(jax.random.split)(key), 1, 0)

  # [B, gamma, V] -> [B, gamma]: the probability of the drafted token.
  p_x = jnp.take_along_axis(p[:, :gamma], drafts[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0] * lenience
  # q(x) = 0 cannot happen for a token drawn from q; if a draft proposes one
  # anyway, accept exactly when the target could have produced it.
  ratio = jnp.where(q_x > 0, p_x / jnp.where(q_x > 0, q_x, 1.0),
                    jnp.where(p_x > 0, 1.0, 0.0))
  u = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(accept_key)  # [B, gamma] in [0, 1)
  accepted = jnp.cumprod(u < ratio, axis=-1)  # first rejection zeroes the rest
  n = jnp.sum(accepted, axis=-1).astype(jnp.int32)  # [B]

  # Distribution of the target's own token at position n + 1. Padding q with a
  # zero row makes the clean-sweep case (n = gamma) the bonus distribution p.
  q_padded = jnp.concatenate([q, jnp.zeros((batch, 1, vocab), q.dtype)], axis=1)
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [B, V]
  q_n = jnp.take_along_axis(q_padded, n[:, None, None], axis=1)[:, 0]  # [B, V]
  residual = jnp.maximum(p_n - lenience * q_n, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  residual = jnp.where(mass > _TINY, residual / jnp.where(mass > _TINY, mass, 1.0), p_n)
  next_token = sampling.sample(residual_key, residual)
  return n, next_token


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
