"""The draft phase of a speculative iteration: gamma tokens, or fewer where the draft doubts.

Fixed length (Algorithm 1): gamma draft calls, one `lax.scan`.

The first call of an iteration feeds the draft the row's last two tokens (a
K = 2 call): the one before `last` is x_gamma after a clean sweep, which the
draft has not seen, and a token it has seen (written again, the same entry)
otherwise. A sweep then costs no draft call of its own, and an iteration
makes exactly gamma draft calls, as eq. (5) counts them.

Adaptive length: a `lax.while_loop` of at most gamma draft calls. Row b stops
drafting after x_t when the draft's own probability of x_t, softmax of its raw
logits (temperature 1, no truncation), is below `confidence_threshold`
(Hugging Face's `assistant_confidence_threshold`, 0.4 by default there); the
loop ends when every unfinished row has stopped. Rows keep stepping, batched,
after they stop; what they draft then is never proposed (`lengths`).

The verify call then covers gamma + 1 positions (flat: what accelerators
want, where a call over K positions costs about one step for any small K), or,
with `verify_lengths`, the smallest of those static K that holds every row's
drafts, one `lax.switch` branch per K (CPUs, where a call's cost grows with K).

The stop depends only on the draft's own path, so verification stays exact:
it is a draft that proposes a token the target never produces once the rule
fires, which `speculative.accept_reject(lengths=...)` verifies as such (q and
the acceptance ratio 0 beyond a row's length).
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import loop_utils
from spec_decode import sampling as sampling_lib


def verify(target_step_fn, tokens: jax.Array, cache: cache_lib.Cache, steps: jax.Array,
           verify_lengths: tuple[int, ...] | None):
  """The target's call over [last, x_1..x_steps] (and up to K - 1 more positions).

  Args:
    target_step_fn: the target's step function.
    tokens: [B, gamma + 1] int32 each row's last token and its drafts.
    cache: the target's Cache.
    steps: [] int32 draft calls made this iteration.
    verify_lengths: None calls over all gamma + 1 positions; else the static
      K values (from `checks.check_verify_lengths`): the smallest K >= steps + 1.

  Returns:
    logits: [B, gamma + 1, V], zero beyond the K positions called.
    cache: the target's Cache, advanced by K.
  """
  if verify_lengths is None:
    return target_step_fn(tokens, cache)
  width = tokens.shape[1]

  def call(k):
    def branch(cache):
      logits, cache = target_step_fn(tokens[:, :k], cache)
      return jnp.pad(logits, ((0, 0), (0, width - k), (0, 0))), cache
    return branch

  branch = jnp.searchsorted(jnp.asarray(verify_lengths), steps + 1)
  return jax.lax.switch(branch, [call(k) for k in verify_lengths], cache)


def first_call(draft_step_fn, cache: cache_lib.Cache, tokens: jax.Array):
  """The draft's first call of an iteration, over each row's last two tokens.

  Args:
    draft_step_fn: the draft's step function.
    cache: its Cache at each row's position of `last` (index; every position
      before index - 1 written).
    tokens: [B, T] int32 the loop's tokens, `last` at `cache.index`.

  Returns:
    logits: [B, V] the draft's logits after `last`.
    cache: the Cache at index + 1 (index - 1 and index written; at index 0,
      the one token and a stale entry at 1, rewritten by the next call).
  """
  index = cache.index
  begin = jnp.maximum(index - 1, 0)  # [B]
  pair = jax.vmap(lambda row, b: jax.lax.dynamic_slice_in_dim(row, b, 2))(tokens, begin)
  logits, cache = draft_step_fn(pair, cache_lib.rewind(cache, begin))  # [B, 2, V]
  logits = jnp.take_along_axis(logits, (index - begin)[:, None, None], axis=1)[:, 0]
  return logits, cache_lib.rewind(cache, index + 1)


@flax.struct.dataclass
class _AdaptiveCarry:
  """The adaptive draft loop's carry.

  Attributes:
    t: [] int32 draft calls made.
    cache: the draft's Cache.
    token: [B] int32 the last drafted token, fed to the next call.
    x: [B, gamma] int32 drafted tokens so far (0 after t).
    q: [B, gamma, V] their distributions.
    stopped: [B] bool rows that stopped drafting.
    lengths: [B] int32 tokens each row proposes (gamma until it stops).
    bad: [B] bool rows with a non-finite draft logit, or None (unchecked).
  """

  t: jax.Array
  cache: cache_lib.Cache
  token: jax.Array
  x: jax.Array
  q: jax.Array
  stopped: jax.Array
  lengths: jax.Array
  bad: jax.Array | None


def draft_block(draft_step_fn, cache: cache_lib.Cache, tokens: jax.Array, keys: jax.Array, *,
                gamma: int, sampling: sampling_lib.SamplingParams, active: jax.Array,
                confidence_threshold: float | jax.Array | None, check_finite: bool):
  """Drafts up to gamma tokens per row.

  Args:
    draft_step_fn: the draft's step function.
    cache: its Cache at each row's position of its last known token.
    tokens: [B, T] int32 the loop's tokens, each row's last known one at
      `cache.index` (`first_call`).
    keys: [gamma, B] PRNG keys, one per draft step and row.
    gamma: static most tokens drafted per row.
    sampling: the knobs that turn logits into q.
    active: [B] bool unfinished rows (only they keep an adaptive loop going).
    confidence_threshold: None drafts gamma tokens; a (traced) number stops a
      row after a token its draft gave probability below it.
    check_finite: also return which rows saw non-finite logits
      (loop_utils.nonfinite_rows).

  Returns:
    cache: the draft's Cache, advanced by `steps`.
    x: [B, gamma] int32 drafted tokens (0 after `steps`).
    q: [B, gamma, V] float32 their distributions (0 after `steps`).
    lengths: [B] int32 tokens proposed per row, in 1..steps for unfinished
      rows (a finished row may show gamma: it is never read).
    steps: [] int32 draft calls made, max(lengths) over active rows (gamma
      when fixed).
    bad: [B] bool rows with a non-finite draft logit, or None.
  """
  def draw(logits, key):  # logits [B, V]
    q_t, x_t = sampling_lib.draw(key, logits, sampling)
    return q_t, x_t, loop_utils.nonfinite_rows(logits[:, None]) if check_finite else None

  logits, cache = first_call(draft_step_fn, cache, tokens)
  q_1, x_1, bad = draw(logits, keys[0])
  if confidence_threshold is None:
    return _fixed(draft_step_fn, cache, x_1, q_1, bad, keys, draw)
  batch = x_1.shape[0]

  def stops(logits, x_t):
    log_confidence = (jnp.take_along_axis(logits, x_t[:, None], axis=-1)[:, 0]
                      - jax.nn.logsumexp(logits, axis=-1))
    return log_confidence < jnp.log(confidence_threshold)

  def cond(c: _AdaptiveCarry):
    return (c.t < gamma) & jnp.any(active & ~c.stopped)

  def body(c: _AdaptiveCarry) -> _AdaptiveCarry:
    logits, cache = draft_step_fn(c.token[:, None], c.cache)
    q_t, x_t, bad_t = draw(logits[:, 0], keys[c.t])
    stop = ~c.stopped & stops(logits[:, 0], x_t)
    return _AdaptiveCarry(
        t=c.t + 1, cache=cache, token=x_t, x=c.x.at[:, c.t].set(x_t), q=c.q.at[:, c.t].set(q_t),
        stopped=c.stopped | stop, lengths=jnp.where(stop, c.t + 1, c.lengths),
        bad=None if c.bad is None else c.bad | (~c.stopped & bad_t))

  stopped = stops(logits, x_1)
  c = jax.lax.while_loop(cond, body, _AdaptiveCarry(
      t=jnp.ones((), jnp.int32), cache=cache, token=x_1,
      x=jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(x_1),
      q=jnp.zeros((batch, gamma) + q_1.shape[1:], q_1.dtype).at[:, 0].set(q_1), stopped=stopped,
      lengths=jnp.where(stopped, 1, gamma).astype(jnp.int32), bad=bad))
  return c.cache, c.x, c.q, c.lengths, c.t, c.bad


def _fixed(draft_step_fn, cache, x_1, q_1, bad_1, keys, draw):
  """The other gamma - 1 draft calls in one scan; see draft_block."""

  def draft_one(carry, key):
    cache, token = carry
    logits, cache = draft_step_fn(token[:, None], cache)
    q_t, x_t, bad_t = draw(logits[:, 0], key)  # [B, V], [B]
    return (cache, x_t), (x_t, q_t, bad_t)

  (cache, _), (x, q, bad) = jax.lax.scan(draft_one, (cache, x_1), keys[1:])  # bad [gamma-1, B]
  gamma, batch = keys.shape[:2]
  x = jnp.concatenate([x_1[:, None], jnp.swapaxes(x, 0, 1)], axis=1)
  q = jnp.concatenate([q_1[:, None], jnp.swapaxes(q, 0, 1)], axis=1)
  if bad_1 is not None:
    bad_1 = bad_1 | jnp.any(bad, axis=0)
  return cache, x, q, jnp.full((batch,), gamma, jnp.int32), jnp.asarray(gamma, jnp.int32), bad_1
