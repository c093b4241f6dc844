"""Logits -> the adjusted distribution the paper samples from.

Speculative sampling is exact for any distribution, so the usual decoding knobs
(temperature, top-k, top-p, argmax) are applied the same way to the target's
logits (giving p) and to the draft's (giving q), and the accept/reject test then
runs on the adjusted p and q (paper, Section 2.3). Temperature 0 is argmax,
written as a one-hot distribution, which makes greedy decoding a special case of
sampling with no separate code path.

The knob values are traced: changing them does not recompile a decoding loop.
All probability arithmetic is float32, whatever the model's dtype.

Top-k and top-p avoid sorting the vocabulary, which is slow on XLA:CPU; their
masks and the pieces they are built from are public for the studies that time
them: `top_k_mask`, `top_p_mask`, their caps TOP_K_CAP and TOP_P_CAP,
`top_values`, `order_keys` and `bisect_threshold`.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import distributions as row_kernels


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

    Args:
      temperature: a number >= 0, or [B] numbers (one per row).
      top_k: an integer in [0, int32 max], or [B].
      top_p: a number in (0, 1], or [B].

    Raises:
      TypeError: a knob that is not numbers (e.g. the string '0.7').
      ValueError: a knob out of its range, of more than one dimension, or
        per-row knobs of different lengths.
    """
    knobs = {'temperature': temperature, 'top_k': top_k, 'top_p': top_p}
    for name, value in knobs.items():
      array = np.asarray(value)
      if array.dtype == bool or not np.issubdtype(array.dtype, np.number):
        raise TypeError(f'{name} must be a number or a sequence of numbers (one per row), got '
                        f'{value!r} ({type(value).__name__})')
      if array.ndim > 1:
        raise ValueError(f'{name} must be a scalar or [B] (one value per row), got shape '
                         f'{array.shape}')
    rows = {name: np.shape(value)[0] for name, value in knobs.items() if np.ndim(value)}
    if len(set(rows.values())) > 1:
      raise ValueError(f'per-row knobs must have one length (the batch size), got {rows}')
    temperature, top_k, top_p = (np.asarray(v) for v in (temperature, top_k, top_p))
    if np.any(temperature < 0) or not np.all(np.isfinite(temperature)):
      raise ValueError(f'temperature must be finite and >= 0, got {temperature}')
    if (not np.issubdtype(top_k.dtype, np.integer) or np.any(top_k < 0)
        or np.any(top_k > np.iinfo(np.int32).max)):
      raise ValueError(f'top_k must be an integer >= 0 and <= {np.iinfo(np.int32).max} (int32; '
                       f'0 disables), got {top_k}')
    if not np.all((top_p > 0) & (top_p <= 1)):  # NaN fails too
      raise ValueError(f'top_p must be in (0, 1] (1 disables), got {top_p}')
    return cls(
        temperature=jnp.asarray(temperature, jnp.float32),
        top_k=jnp.asarray(top_k, jnp.int32),
        top_p=jnp.asarray(top_p, jnp.float32))

  def untruncated(self) -> 'SamplingParams':
    """The same temperature with top-k and top-p off (e.g. a draft's knobs: any q is exact)."""
    return self.replace(top_k=jnp.zeros_like(self.top_k), top_p=jnp.ones_like(self.top_p))


def check_batch(params: SamplingParams, batch: int, name: str = 'sampling') -> None:
  """Raises ValueError unless each knob is a scalar or [batch] (one value per row).

  Args:
    params: the knobs.
    batch: the decoded batch size B.
    name: the argument's name, for the message.
  """
  for knob in ('temperature', 'top_k', 'top_p'):
    shape = jnp.shape(getattr(params, knob))
    if shape and shape != (batch,):
      raise ValueError(f'{name}.{knob} has shape {shape}, but the inputs have {batch} rows: '
                       f'give one value, or one per row ({batch},)')


def all_greedy(params: SamplingParams) -> jax.Array:
  """[] bool: every row decodes at temperature 0 (traced: decided per call, not per trace)."""
  return jnp.all(params.temperature == 0)


def _per_row(value: jax.Array, ndim: int) -> jax.Array:
  """[] or [B] -> broadcastable against [B, ..., V] with `ndim` dims."""
  value = jnp.asarray(value)
  return value.reshape(value.shape + (1,) * (ndim - value.ndim))


# Top-k and top-p cut the vocabulary at a threshold: the k-th largest logit, or
# the smallest probability whose larger entries hold less than top_p. Sorting
# the vocabulary to find it costs more than a target step on XLA:CPU, so the
# threshold comes from the cap largest entries (`top_values`) whenever it
# lies among them (always for k <= the cap), and otherwise from an exact
# bisection over the entries' float32 bit patterns (`bisect_threshold`). On a
# CPU with the kernels every row's threshold is instead one call of
# `kernels.distributions.top_k_threshold` / `top_p_threshold`, the same
# bisection (a top-p mask at V = 8k 13-28 us a row against XLA's 34-112 us,
# top-k 40 0.52-0.89 of XLA's TopK; EPYC, `scripts/studies/truncation_cost.py`). All give the sorted
# definition's threshold, ties at the boundary kept. TopK costs more as the cap
# grows, the bisection several TopKs; `scripts/studies/nucleus_mass.py` weighs the two
# for top-p 0.9 on the bundled models at T = 1 (EPYC, two runs, before the
# two-level TopK and the per-row bisection: 128 beat 64 by 0.05-0.1 ms per
# gamma-4 speculative iteration; 256 and more lost).
TOP_K_CAP = 64  # `top_k_mask` takes the k-th largest logit from this many largest ones
TOP_P_CAP = 128  # `top_p_mask` looks for the nucleus's end among this many largest entries
# TopK's cost grows with the vocabulary; over many blocks it runs in two small
# steps instead (`top_values`). Blocks of 16 and the switch at 8 x cap blocks
# were fastest on the EPYC: at V = 32k 2-3x faster than one TopK over V, at
# 8k for cap 64 1.3x, for cap 128 no faster (so not used there).
_TOP_BLOCK = 16
_TOP_MIN_BLOCKS_PER_CAP = 8


def top_values_uses_blocks(vocab: int, cap: int) -> bool:
  """Whether `top_values` over V = vocab entries takes two small TopKs instead of one."""
  return -(-vocab // _TOP_BLOCK) >= _TOP_MIN_BLOCKS_PER_CAP * cap


def top_values(x: jax.Array, cap: int) -> jax.Array:
  """[..., V] -> [..., cap] the cap largest entries, descending: `lax.top_k(x, cap)[0]`.

  Where `top_values_uses_blocks(V, cap)`, over blocks of 16 entries, from two
  small TopKs: the cap blocks with the largest maxima, then the cap largest of
  their entries. They are
  the same values. Let v be the cap-th largest value: fewer than cap blocks
  hold an entry above v, so every such block is chosen, with all entries above
  v; and either every block whose maximum is v is chosen too, or every chosen
  block has a maximum of at least v, each adding one entry v or more. Either
  way the chosen blocks hold at least cap entries >= v. Ties included.

  Args:
    x: [..., V] float values (-inf allowed), V >= cap.
    cap: static number of values.
  """
  vocab = x.shape[-1]
  if not top_values_uses_blocks(vocab, cap):
    return jax.lax.top_k(x, cap)[0]
  blocks = -(-vocab // _TOP_BLOCK)
  padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, blocks * _TOP_BLOCK - vocab)],
                   constant_values=-jnp.inf).reshape(x.shape[:-1] + (blocks, _TOP_BLOCK))
  chosen = jax.lax.top_k(jnp.max(padded, axis=-1), cap)[1]  # [..., cap] block indices
  entries = jnp.take_along_axis(padded, chosen[..., None], axis=-2)  # [..., cap, _TOP_BLOCK]
  return jax.lax.top_k(entries.reshape(x.shape[:-1] + (cap * _TOP_BLOCK,)), cap)[0]


def order_keys(x: jax.Array) -> jax.Array:
  """float32 [..., V] -> int32 [..., V] in the same order (-0.0 and 0.0 equal).

  The keys `bisect_threshold` halves: 32 halvings find any float32 threshold exactly.
  """
  bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x).astype(jnp.float32), jnp.int32)
  return jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def bisect_threshold(keys: jax.Array, weights: jax.Array, bound: jax.Array) -> jax.Array:
  """The smallest t with sum(weights[keys > t]) < bound, per row.

  With unit weights and bound k, keys >= t keeps the k largest (ties kept);
  with probabilities and bound top_p, the nucleus. The exact path of
  `top_k_mask` and `top_p_mask` where the threshold lies past their cap.

  Args:
    keys: [..., V] int32 order keys (`order_keys`).
    weights: [..., V] non-negative.
    bound: broadcastable to [..., 1]; sum(weights) >= bound > 0.

  Returns:
    [..., 1] int32: an entry's key (the sum only changes at entries' keys).
  """
  lo = jnp.full(keys.shape[:-1] + (1,), jnp.iinfo(jnp.int32).min, jnp.int32)  # predicate false
  hi = jnp.full_like(lo, jnp.iinfo(jnp.int32).max)  # predicate true

  def halve(_, bounds):
    lo, hi = bounds
    mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without overflow
    below = jnp.sum(jnp.where(keys > mid, weights, 0), axis=-1, keepdims=True) < bound
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  return jax.lax.fori_loop(0, 32, halve, (lo, hi))[1]  # 32 halvings of a 2^32 range


def top_k_mask(logits: jax.Array, top_k: jax.Array) -> jax.Array:
  """[..., V] logits -> [..., V] logits outside the top k set to -inf (0 disables).

  The k-th largest logit is the threshold, ties with it kept: as sorting the
  vocabulary gives it, without the sort (one CPU kernel call for every row
  where the kernels apply, else `top_values` for k <= TOP_K_CAP and
  `bisect_threshold` beyond).

  Args:
    logits: [..., V] float32 logits (-inf allowed).
    top_k: int32 broadcastable to [..., 1]; 0 keeps every logit.
  """
  vocab = logits.shape[-1]
  k = jnp.broadcast_to(jnp.clip(top_k, 1, vocab), logits.shape[:-1] + (1,))
  cap = min(TOP_K_CAP, vocab)

  def from_top_values(logits):
    values = top_values(logits, cap)  # [..., cap] descending
    # The k-th largest as the least of the first k: picking it with a gather
    # makes XLA:CPU sort the whole vocabulary inside a loop instead of calling
    # its TopK kernel (1.4 ms against 0.03 ms at V = 8k).
    ranks = jax.lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
    kth = jnp.min(jnp.where(ranks < k, values, jnp.inf), axis=-1, keepdims=True)
    return logits >= kth

  def by_bisection(logits):
    keys = order_keys(logits)
    return keys >= bisect_threshold(keys, jnp.ones_like(keys), k)

  if row_kernels.thresholds_apply(logits):  # every row's threshold in one CPU kernel call
    keep = logits >= row_kernels.top_k_threshold(logits, k)
  else:
    keep = jax.lax.cond(jnp.all(k <= cap), from_top_values, by_bisection, logits)
  return jnp.where(keep | (top_k <= 0), logits, -jnp.inf)


def top_p_mask(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """Zeroes the mass outside each row's nucleus.

  The nucleus: the most likely tokens down to the first rank whose preceding
  mass reaches top_p, and every token tied with the last one kept. On a CPU
  with the kernels its threshold is `kernels.distributions.top_p_threshold`'s (one call for
  all rows). Otherwise it comes from the TOP_P_CAP largest values where their
  mass reaches top_p (`top_values`); the rows where it does not are bisected
  (`bisect_threshold`) one by one, so a
  verify call whose gamma + 1 rows hold one flat distribution bisects that
  row alone.

  Args:
    probs: [..., V] probabilities.
    top_p: broadcastable to [..., 1] (a scalar, or one value per row with
      trailing 1s); 1 disables.

  Returns:
    [..., V] probs with the entries outside the nucleus set to 0.
  """
  top_p = jnp.broadcast_to(top_p, probs.shape[:-1] + (1,))
  if row_kernels.thresholds_apply(probs):  # every row's threshold in one CPU kernel call
    threshold = row_kernels.top_p_threshold(probs, jnp.where(top_p < 1.0, top_p, 0.0))
    return jnp.where(probs >= threshold, probs, 0.0)  # rows not cut: threshold -inf
  cap = min(TOP_P_CAP, probs.shape[-1])
  values = top_values(probs, cap)  # [..., cap] descending
  mass = jnp.cumsum(values, axis=-1)
  keep = probs >= jnp.min(jnp.where(mass - values < top_p, values, jnp.inf), axis=-1,
                          keepdims=True)
  # The nucleus ends among the top values when their mass reaches top_p (the
  # same cumulative sum that cut it, so the two agree to the last bit).
  inside = (mass[..., -1:] >= top_p) | (top_p >= 1.0)  # [..., 1]

  def bisect_rows(keep):
    rows = lambda x: x.reshape(-1, x.shape[-1])  # [..., n] -> [R, n]
    flat_probs, flat_top_p, flat_inside = rows(probs), rows(top_p), rows(inside)[:, 0]

    def row(r, keep):
      def bisect(keep):
        keys = order_keys(flat_probs[r])
        threshold = bisect_threshold(keys, flat_probs[r], flat_top_p[r])  # [1]
        return keep.at[r].set(keys >= threshold)
      return jax.lax.cond(flat_inside[r], lambda keep: keep, bisect, keep)

    return jax.lax.fori_loop(0, flat_probs.shape[0], row, rows(keep)).reshape(keep.shape)

  keep = jax.lax.cond(jnp.all(inside), lambda keep: keep, bisect_rows, keep)
  return jnp.where(keep | (top_p >= 1.0), probs, 0.0)


def argmax(x: jax.Array) -> jax.Array:
  """[..., V] -> [...] int32 index of the largest entry, the first one on ties.

  As `jnp.argmax` for finite and infinite inputs (a row with a NaN: the CPU
  kernel gives its first NaN's index as jnp.argmax does, XLA's reductions some
  index). On CPU with the kernels one pass over each row
  (kernels.distributions.argmax); elsewhere two plain reductions: XLA:CPU runs
  jnp.argmax's (value, index) reduction about 10x slower, which at V = 8k costs
  more per decoding step than all of sampling.
  """
  if row_kernels.argmax_applies(x):  # one pass over each row in a CPU kernel
    return row_kernels.argmax(x)
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
  # Branches are chosen per call, not per trace: all-greedy calls skip the softmax.
  return jax.lax.cond(all_greedy(params), lambda: _greedy(logits)[0],
                      lambda: adjust_sampled(logits, params))


def adjust_sampled(logits: jax.Array, params: SamplingParams) -> jax.Array:
  """`adjust` for a call where some row samples (temperature > 0).

  The branch of `adjust` that callers who already took the all-greedy branch
  themselves (`draw`, `speculative.accept`) call directly, so that a decoding
  step tests `all_greedy` once. Greedy rows among sampled ones still get their
  one-hot; in an all-greedy call the result is the same one-hots, after a
  softmax that `adjust` skips.

  Args, Returns: as `adjust`.
  """
  logits = logits.astype(jnp.float32)
  ndim = logits.ndim
  temperature = _per_row(params.temperature, ndim)
  top_k = _per_row(params.top_k, ndim)
  top_p = _per_row(params.top_p, ndim)

  def nucleus(probs):
    probs = top_p_mask(probs, top_p)
    return probs / jnp.sum(probs, axis=-1, keepdims=True)

  # Skip top-k, top-p and greedy rows at run time when no row needs them.
  scaled = logits / jnp.where(temperature > 0, temperature, 1.0)
  # A fresh function per trace: a module-level one's traced branch would be cached across
  # traces, whatever the kernels' switch says at the next.
  scaled = jax.lax.cond(jnp.any(top_k > 0), lambda x, k: top_k_mask(x, k), lambda x, _: x,
                        scaled, top_k)
  probs = (row_kernels.softmax(scaled) if row_kernels.softmax_applies(scaled)
           else jax.nn.softmax(scaled, axis=-1))
  probs = jax.lax.cond(jnp.any(top_p < 1.0), nucleus, lambda x: x, probs)
  return jax.lax.cond(jnp.any(temperature == 0),
                      lambda x: jnp.where(temperature > 0, x, _greedy(logits)[0]), lambda x: x,
                      probs)


def _greedy(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[..., V] logits -> (the one-hot of the argmax [..., V] float32, the argmax [...] int32)."""
  token = argmax(logits.astype(jnp.float32))
  return jax.nn.one_hot(token, logits.shape[-1], dtype=jnp.float32), token


def draw(key: jax.Array, logits: jax.Array,
         params: SamplingParams) -> tuple[jax.Array, jax.Array]:
  """`adjust` and `sample` in one: the distribution and a token drawn from it.

  Args:
    key: one PRNG key, or [B] keys (one stream per row).
    logits: [B, ..., V] raw logits.
    params: the sampling knobs.

  Returns:
    probs [B, ..., V] float32 (`adjust(logits, params)`) and tokens [B, ...]
    int32 (`sample(key, probs)`). Calls where every row is greedy skip the
    softmax and the sampler: the argmax is what `sample` draws from its one-hot.
  """

  def sampled():
    probs = adjust_sampled(logits, params)
    return probs, sample(key, probs)

  return jax.lax.cond(all_greedy(params), lambda: _greedy(logits), sampled)


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
