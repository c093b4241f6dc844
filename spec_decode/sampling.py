"""Logits -> the adjusted distribution the paper samples from.

Speculative sampling is exact for any distribution, so the usual decoding knobs
(temperature, top-k, top-p, argmax) are applied the same way to the target's
logits (giving p) and to the draft's (giving q), and the accept/reject test then
runs on the adjusted p and q (paper, Section 2.3). Temperature 0 is argmax,
written as a one-hot distribution, which makes greedy decoding a special case of
sampling with no separate code path.

The knob values are traced: changing them does not recompile a decoding loop.
All probability arithmetic is float32, whatever the model's dtype.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class SamplingParams:
  """Traced decoding knobs (scalars, or [B] for one value per row).

  Attributes:
    temperature: 0 means argmax (greedy); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (ties at the k-th value are kept);
      0 disables.
    top_p: keep the smallest set of most likely tokens whose mass reaches
      top_p (nucleus; ties at the boundary are kept); 1 disables.
  """

  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array

  @classmethod
  def create(cls, temperature=0.0, top_k=0, top_p=1.0) -> 'SamplingParams':
    """Builds parameters from host values, raising ValueError on nonsense.

    Inside a traced function construct `SamplingParams(...)` directly instead.
    """
    temperature, top_k, top_p = (np.asarray(v) for v in (temperature, top_k, top_p))
    if np.any(temperature < 0) or not np.all(np.isfinite(temperature)):
      raise ValueError(f'temperature must be finite and >= 0, got {temperature}')
    if np.any(top_k < 0) or not np.issubdtype(top_k.dtype, np.integer):
      raise ValueError(f'top_k must be an integer >= 0 (0 disables), got {top_k}')
    if np.any(top_p <= 0) or np.any(top_p > 1):
      raise ValueError(f'top_p must be in (0, 1] (1 disables), got {top_p}')
    return cls(
        temperature=jnp.asarray(temperature, jnp.float32),
        top_k=jnp.asarray(top_k, jnp.int32),
        top_p=jnp.asarray(top_p, jnp.float32))


def _per_row(value: jax.Array, ndim: int) -> jax.Array:
  """[] or [B] -> broadcastable against [B, ..., V] with `ndim` dims."""
  value = jnp.asarray(value)
  return value.reshape(value.shape + (1,) * (ndim - value.ndim))


def _top_k_mask(logits: jax.Array, top_k: jax.Array) -> jax.Array:
  """[..., V] logits -> [..., V] logits outside the top k set to -inf."""
  k = jnp.clip(top_k, 1, logits.shape[-1])
  ranked = jnp.sort(logits, axis=-1)[..., ::-1]  # [..., V] descending
  kth = jnp.take_along_axis(ranked, jnp.broadcast_to(k - 1, ranked.shape[:-1] + (1,)),
                            axis=-1)  # [..., 1]
  keep = (logits >= kth) | (top_k <= 0)
  return jnp.where(keep, logits, -jnp.inf)


def _top_p_mask(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """[..., V] probabilities -> [..., V] with mass outside the nucleus zeroed."""
  ranked = jnp.sort(probs, axis=-1)[..., ::-1]  # [..., V] descending
  mass_before = jnp.cumsum(ranked, axis=-1) - ranked
  # The smallest kept probability: the last rank whose preceding mass < top_p.
  in_nucleus = mass_before < top_p
  threshold = jnp.min(jnp.where(in_nucleus, ranked, jnp.inf), axis=-1, keepdims=True)
  keep = (probs >= threshold) | (top_p >= 1.0)
  return jnp.where(keep, probs, 0.0)


def argmax(x: jax.Array) -> jax.Array:
  """[..., V] -> [...] int32 index of the largest entry, the first one on ties.

  As `jnp.argmax` for finite and -inf inputs, written as two plain
  reductions: XLA:CPU runs jnp.argmax's (value, index) reduction about 10x
  slower, which at V = 8k costs more per decoding step than all of sampling.
  """
  vocab = x.shape[-1]
  iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  top = jnp.max(x, axis=-1, keepdims=True)
  return jnp.minimum(jnp.min(jnp.where(x == top, iota, vocab), axis=-1), vocab - 1)


def adjust(logits: jax.Array, params: SamplingParams) -> jax.Array:
  """The distribution to sample from, after temperature, top-k and top-p.

  Args:
    logits: [B, ..., V] raw logits (any float dtype; -inf allowed).
    params: sampling knobs, scalars or [B].

  Returns:
    [B, ..., V] float32 probabilities summing to 1 along the last axis. At
    temperature 0 this is the one-hot of the argmax (first index on ties).
  """
  logits = logits.astype(jnp.float32)
  ndim = logits.ndim
  temperature = _per_row(params.temperature, ndim)
  top_k = _per_row(params.top_k, ndim)
  top_p = _per_row(params.top_p, ndim)

  greedy = jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)

  # Sorting V entries per position is the cost of top-k/top-p; skip it at run
  # time when the knob is off (the branch is chosen per call, not per trace).
  scaled = logits / jnp.where(temperature > 0, temperature, 1.0)
  scaled = jax.lax.cond(jnp.any(top_k > 0), _top_k_mask, lambda x, _: x, scaled, top_k)
  probs = jax.nn.softmax(scaled, axis=-1)
  probs = jax.lax.cond(jnp.any(top_p < 1.0), _top_p_mask, lambda x, _: x, probs, top_p)
  probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  return jnp.where(temperature > 0, probs, greedy)


# Inverse-CDF sampling scans the vocabulary in blocks of this many entries: a
# cumulative sum over 8k entries runs ~10x slower on XLA:CPU than block sums,
# a cumulative sum over the block totals and one over the chosen block.
_BLOCK = 128


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token per distribution.

  Args:
    key: one PRNG key, or [B] keys (one stream per row).
    probs: [B, ..., V] float32 probabilities.

  Returns:
    [B, ...] int32 token ids. A token of probability 0 is never drawn.
  """
  # Inverse CDF: one uniform per draw instead of V Gumbel variates, which on a
  # CPU cost more than a small draft model's step.
  if key.shape:
    u = jax.vmap(lambda k: jax.random.uniform(k, probs.shape[1:-1]))(key)
  else:
    u = jax.random.uniform(key, probs.shape[:-1])
  vocab = probs.shape[-1]
  blocks = -(-vocab // _BLOCK)
  padded = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, blocks * _BLOCK - vocab)])
  padded = padded.reshape(probs.shape[:-1] + (blocks, _BLOCK))  # [B, ..., blocks, BLOCK]
  block_cdf = jnp.cumsum(jnp.sum(padded, axis=-1), axis=-1)  # [B, ..., blocks]
  threshold = u * block_cdf[..., -1]  # [B, ...]
  # The block holding the first cdf value above the threshold (it has mass,
  # its cdf rising past the threshold, up to rounding: checked below).
  block = jnp.sum(block_cdf <= threshold[..., None], axis=-1)  # [B, ...] in 0..blocks
  inside = jnp.minimum(block, blocks - 1)
  base = jnp.where(inside > 0, jnp.take_along_axis(
      block_cdf, jnp.maximum(inside - 1, 0)[..., None], axis=-1)[..., 0], 0.0)
  chosen = jnp.take_along_axis(padded, inside[..., None, None], axis=-2)[..., 0, :]
  offset = jnp.sum(base[..., None] + jnp.cumsum(chosen, axis=-1) <= threshold[..., None], axis=-1)
  # Rounding can put the threshold at or past a block's (or the whole) total:
  # then take that block's (or the whole distribution's) last token of mass.
  last_in_block = _BLOCK - 1 - argmax(chosen[..., ::-1] > 0)
  token = inside * _BLOCK + jnp.minimum(offset, last_in_block)
  last = vocab - 1 - argmax(probs[..., ::-1] > 0)
  inside_mass = (block < blocks) & jnp.any(chosen > 0, axis=-1)
  return jnp.where(inside_mass, token, last).astype(jnp.int32)
