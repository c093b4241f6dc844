"""Beam search in one `lax.while_loop`, equal to T5X's `decoding.beam_search`.

The loop drives the step-function contract of `spec_decode.decoding` over
B * beam_size rows (each batch row's beams side by side) and keeps T5X's
semantics to the operation:
  - live and finished sets of beam_size sequences each; a step takes the top
    2 * beam_size of the beam_size * V extensions, keeps the best beam_size
    that did not end in EOS as live, and merges the ones that did into the
    finished set, scored log P / brevity_penalty(alpha, length) with
    brevity_penalty = ((5 + length) / 6) ** alpha;
  - NEG_INF = -1e7 masks (added, not -inf), `lax.top_k` ties (lower index
    first) and T5X's ascending beam order: the best beam is the LAST one;
  - the loop stops when, in every batch row, all beam_size finished slots are
    filled and no live beam can still beat the worst of them; at
    max_decode_len; or when no live beam is above T5X's min_log_prob (-1e7,
    its default). Rows without a finished sequence return their live beams
    and live log-probabilities. The condition is over the whole batch, so
    with alpha < 0 (where a live beam's bound is not an upper bound) a row's
    result can depend on the other rows, as in T5X.
Decoder prompts (T5X's initial_index) are not supported.

`beam_step` is the one step on given next-token log-probabilities; the
speculative version (spec_decode.speculative_beam) replays it on the target's
log-probabilities of drafted paths, so both loops share every decision.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import checks
from spec_decode import loop_utils

NEG_INF = -1.0e7  # T5X's NEG_INF: a large finite mask, as T5X adds it.
MIN_LOG_PROB = -1.0e7  # T5X's default min_log_prob.


@flax.struct.dataclass
class BeamState:
  """The beam search state (T5X's BeamState), one set of beams per batch row.

  Attributes:
    index: [] int32 position of the live beams' last token (T5X's cur_index):
      steps taken so far.
    live_seqs: [B, W, max_decode_len + 1] int32, position 0 the decoder start
      token 0, then the beam's tokens; 0 after `index`.
    live_logprobs: [B, W] float32 log P of each live beam, ascending.
    finished_seqs: [B, W, max_decode_len + 1] int32 sequences ending in EOS.
    finished_scores: [B, W] float32 length-normalised scores, ascending
      (NEG_INF in empty slots).
    finished_flags: [B, W] bool, the slot holds a finished sequence.
  """

  index: jax.Array
  live_seqs: jax.Array
  live_logprobs: jax.Array
  finished_seqs: jax.Array
  finished_scores: jax.Array
  finished_flags: jax.Array

  @classmethod
  def create(cls, batch: int, beam_size: int, max_decode_len: int) -> 'BeamState':
    """The start: one live beam (log P 0) and beam_size - 1 NEG_INF fillers."""
    logprobs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam_size - 1), jnp.float32), (batch, 1))
    seqs = jnp.zeros((batch, beam_size, max_decode_len + 1), jnp.int32)
    return cls(index=jnp.zeros((), jnp.int32), live_seqs=seqs, live_logprobs=logprobs,
               finished_seqs=seqs, finished_scores=jnp.full((batch, beam_size), NEG_INF),
               finished_flags=jnp.zeros((batch, beam_size), bool))


@flax.struct.dataclass
class BeamOutput:
  """Beam search results, in T5X's order (ascending score: the best is last).

  Attributes:
    tokens: [B, W, max_decode_len] int32 sequences (EOS included), 0-padded.
    scores: [B, W] float32 their scores: log P / brevity_penalty for
      finished sequences; log P of live ones in rows where none finished.
    steps: [] int32 beam steps taken (positions decoded).
    target_calls: [] int32 batched target calls (equal to steps without a draft).
    draft_calls: [] int32 batched draft calls (0 without a draft).
    nonfinite: [B] bool, the target returned non-finite logits
      (loop_utils.nonfinite_rows) for one of the row's beams (its beams and
      scores are garbage); None when searched with check_finite=False.
  """

  tokens: jax.Array
  scores: jax.Array
  steps: jax.Array
  target_calls: jax.Array
  draft_calls: jax.Array
  nonfinite: jax.Array | None = None

  @property
  def best(self) -> jax.Array:
    """[B, max_decode_len] the highest-scoring sequence of each row."""
    return self.tokens[:, -1]


def brevity_penalty(alpha: float | jax.Array, length) -> jax.Array:
  """T5X's ((5 + length) / 6) ** alpha, float32."""
  return jnp.power((5.0 + length) / 6.0, jnp.asarray(alpha, jnp.float32))


def _gather(x: jax.Array, indices: jax.Array) -> jax.Array:
  """x [B, N, ...], indices [B, M] -> [B, M, ...] (T5X's gather_beams)."""
  return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def beam_step(state: BeamState, log_probs: jax.Array, alpha: float | jax.Array,
              eos_id: int) -> tuple[BeamState, jax.Array]:
  """One step of T5X's beam search on given next-token log-probabilities.

  Args:
    state: the beams before the step.
    log_probs: [B, W, V] float32 log_softmax of each live beam's next-token
      logits.
    alpha: brevity penalty exponent.
    eos_id: the token that finishes a beam.

  Returns:
    The state after the step, and [B, W] int32 parents: new live beam j
    extends old live beam parents[:, j] (its cache is that beam's).
  """
  batch, width, vocab = log_probs.shape
  t = state.index
  candidates = (log_probs + state.live_logprobs[:, :, None]).reshape(batch, width * vocab)
  # The top 2W extensions, so that W stay live even if W of them end in EOS.
  top_logprobs, top_indices = jax.lax.top_k(candidates, 2 * width)  # [B, 2W]
  top_ids, top_beams = top_indices % vocab, top_indices // vocab
  top_seqs = jax.lax.dynamic_update_slice(_gather(state.live_seqs, top_beams),
                                          top_ids[:, :, None], (0, 0, t + 1))  # [B, 2W, L + 1]
  newly_finished = top_ids == eos_id

  # Live: the best W that did not just finish, ascending as T5X's flip.
  live_logprobs = top_logprobs + newly_finished * jnp.float32(NEG_INF)
  alive = jnp.flip(jax.lax.top_k(live_logprobs, width)[1], axis=1)  # [B, W]

  # Finished: the best W of the old finished and the newly finished.
  scores = top_logprobs / brevity_penalty(alpha, jnp.full_like(top_ids, t + 1))
  scores += (~newly_finished) * jnp.float32(NEG_INF)
  all_seqs = jnp.concatenate([state.finished_seqs, top_seqs], axis=1)  # [B, 3W, L + 1]
  all_scores = jnp.concatenate([state.finished_scores, scores], axis=1)
  all_flags = jnp.concatenate([state.finished_flags, newly_finished], axis=1)
  best = jnp.flip(jax.lax.top_k(all_scores, width)[1], axis=1)

  new = BeamState(
      index=t + 1, live_seqs=_gather(top_seqs, alive), live_logprobs=_gather(live_logprobs, alive),
      finished_seqs=_gather(all_seqs, best), finished_scores=_gather(all_scores, best),
      finished_flags=_gather(all_flags, best))
  return new, _gather(top_beams, alive)


def should_continue(state: BeamState, alpha: float | jax.Array, max_decode_len: int) -> jax.Array:
  """[] bool, T5X's loop condition (over the whole batch)."""
  not_at_end = state.index < max_decode_len
  # The best any live beam could still score: its log P (which only falls)
  # under the longest length's penalty.
  min_penalty = brevity_penalty(alpha, float(max_decode_len + 1))
  best_live = state.live_logprobs[:, -1:] / min_penalty  # [B, 1]
  worst_finished = jnp.min(state.finished_scores, axis=1, keepdims=True)
  worst_finished = jnp.where(state.finished_flags, worst_finished, NEG_INF)  # [B, W]
  terminated = jnp.all(worst_finished > best_live)
  none_pass = jnp.all(best_live < MIN_LOG_PROB / min_penalty) & (state.index > 0)
  return not_at_end & ~terminated & ~none_pass


def log_softmax(logits: jax.Array) -> jax.Array:
  """float32 log-probabilities of logits [..., V] (T5X's jax.nn.log_softmax)."""
  return jax.nn.log_softmax(logits.astype(jnp.float32))


def expand_rows(cache: cache_lib.Cache, copies: int) -> cache_lib.Cache:
  """Repeats every row of a batch-major cache: [B, ...] -> [B * copies, ...]."""
  return jax.tree.map(lambda x: jnp.repeat(x, copies, axis=0), cache)


def gather_rows(cache: cache_lib.Cache, rows: jax.Array, index: jax.Array) -> cache_lib.Cache:
  """Row r of the result is row rows[r] of `cache` (every leaf), write index `index`.

  Args:
    cache: a batch-major cache of N rows.
    rows: [M] int32 source rows.
    index: [] or [M] int32 the new write position.
  """
  layers = jax.tree.map(lambda x: jnp.take(x, rows, axis=0), cache.layers)
  return cache.replace(layers=layers, index=jnp.broadcast_to(index, rows.shape).astype(jnp.int32))


def flag_nonfinite(nonfinite: jax.Array | None, logits: jax.Array) -> jax.Array | None:
  """[B] flags (None: unchecked) | loop_utils.nonfinite_rows of the logits [B * ..., V]."""
  if nonfinite is None:
    return None
  return nonfinite | loop_utils.nonfinite_rows(
      logits.reshape(nonfinite.shape[0], -1, logits.shape[-1]))


def finish(state: BeamState, target_calls, draft_calls, nonfinite=None) -> BeamOutput:
  """T5X's output: finished beams, or the live ones in rows where none finished."""
  any_finished = jnp.any(state.finished_flags, axis=1)  # [B]
  seqs = jnp.where(any_finished[:, None, None], state.finished_seqs, state.live_seqs)
  scores = jnp.where(any_finished[:, None], state.finished_scores, state.live_logprobs)
  return BeamOutput(tokens=seqs[:, :, 1:], scores=scores, steps=state.index,
                    target_calls=jnp.asarray(target_calls, jnp.int32),
                    draft_calls=jnp.asarray(draft_calls, jnp.int32), nonfinite=nonfinite)


def check_args(cache: cache_lib.Cache, *, beam_size: int, max_decode_len: int,
               alpha: float | jax.Array, vocab_size: int, gamma: int = 0) -> tuple[int, int]:
  """Raises ValueError for a bad beam size, length, alpha or cache; returns the sizes.

  The checks are `checks.check_beam_settings` and `checks.check_alpha`.
  """
  beam_size, _ = checks.check_beam_settings(beam_size, batch=cache.batch_size,
                                                vocab_size=vocab_size)
  max_decode_len = checks.check_size('max_decode_len', max_decode_len)
  checks.check_alpha(alpha, max_decode_len)
  needed = loop_utils.cache_length(max_decode_len, gamma)
  if cache.capacity < needed:
    raise ValueError(f'the cache holds {cache.capacity} positions but max_decode_len='
                     f'{max_decode_len} with gamma={gamma} needs {needed}: allocate it with '
                     f'cache_length(max_decode_len, gamma)')
  return beam_size, max_decode_len


def beam_search(step_fn, cache: cache_lib.Cache, *, beam_size: int, max_decode_len: int,
                alpha: float | jax.Array = 0.6, eos_id: int = 1,
                check_finite: bool = True) -> BeamOutput:
  """T5X's beam search over a step function: one target call per step.

  Args:
    step_fn: the model's step function (spec_decode.decoding.StepFn).
    cache: its fresh cache for the B batch rows (batch-major leaves),
      capacity >= cache_length(max_decode_len); expanded here to B * beam_size
      rows.
    beam_size: static number of beams W (T5X's num_decodes).
    max_decode_len: static most tokens per sequence.
    alpha: brevity penalty exponent (T5X's beam_search alpha; traced), a
      finite number in [0, 10] (checks.check_alpha: past 10 the scores
      round to 0 and lose their order).
    eos_id: the token that finishes a beam.
    check_finite: static, on by default; flag in BeamOutput.nonfinite the
      batch rows for which the model returned non-finite logits.

  Returns:
    BeamOutput, beams ascending by score (T5X's order; `best` is the last).

  Raises:
    ValueError: a beam_size that is not an integer >= 1 or whose rows or
      candidates overflow int32, a bad max_decode_len or cache, an alpha
      outside [0, 10] (when not traced).
  """
  vocab = jax.eval_shape(step_fn, jnp.zeros((cache.batch_size, 1), jnp.int32), cache)[0].shape[-1]
  width, max_decode_len = check_args(cache, beam_size=beam_size, max_decode_len=max_decode_len,
                                     alpha=alpha, vocab_size=vocab)
  batch = cache.batch_size
  offsets = (jnp.arange(batch) * width)[:, None]  # [B, 1] first row of each batch row

  def body(carry):
    state, cache, nonfinite = carry
    tokens = jax.lax.dynamic_slice_in_dim(state.live_seqs, state.index, 1, axis=2)  # [B, W, 1]
    logits, cache = step_fn(tokens.reshape(batch * width, 1), cache)
    state, parents = beam_step(state, log_softmax(logits).reshape(batch, width, -1), alpha,
                               eos_id)
    return (state, gather_rows(cache, (offsets + parents).reshape(-1), state.index),
            flag_nonfinite(nonfinite, logits))

  state = BeamState.create(batch, width, max_decode_len)
  state, _, nonfinite = jax.lax.while_loop(
      lambda c: should_continue(c[0], alpha, max_decode_len), body,
      (state, expand_rows(cache, width), jnp.zeros((batch,), bool) if check_finite else None))
  return finish(state, target_calls=state.index, draft_calls=0, nonfinite=nonfinite)
