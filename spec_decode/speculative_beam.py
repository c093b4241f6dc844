"""Speculative beam search: T5X's beam search of the target, fewer target calls.

Appendix A.4 of Leviathan et al. sketches it; this is an exact, compiled form.
One iteration, for W live beams per batch row:
  1. Draft: from each live beam, the draft's m (`draft_width`) most likely
     next tokens, each continued greedily to gamma tokens: R = W * m paths
     per batch row, path r extending live beam r // m. (On the bundled pair
     this covered more of the target's steps than the draft's own beam
     search of width m per live beam, whose final paths often share their
     first token, or than branching at the second token too: the target's
     next step is the one most often covered.)
  2. Verify: one target call over [B * R, gamma + 1] positions (each path's
     live beam's last token, then the path) gives the target's log-probabilities
     after every prefix of every path.
  3. Replay: `beam_search.beam_step`, the plain loop's own step, runs on those
     log-probabilities for as long as every beam it selects is a drafted
     prefix (so its log-probabilities are known), at most gamma + 1 steps and
     at least one (the live beams' own next-token log-probabilities are always
     known), stopping where the plain loop would stop.
  4. Both caches are reordered so each new live beam's rows hold the path
     whose prefix it is.
The steps are the plain loop's steps on the same log-probabilities, so the
result is plain beam search's for ANY draft; the draft only decides how many
steps one target call covers. Batch rows advance in lockstep (T5X's loop
condition is over the whole batch), so an iteration replays as many steps as
its worst row allows.
"""

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import beam_search as beam_lib
from spec_decode import cache as cache_lib
from spec_decode import checks


@flax.struct.dataclass
class _Replay:
  """The replay's carry.

  Attributes:
    state: the beams after `steps` replayed steps.
    path: [B, W] int32 a drafted path whose prefix each live beam is.
    known: [B, W, R] bool, path r has each live beam as a prefix.
    source: [B, W] int32 a path holding each live beam's prefix but its last
      token (the cache rows the beam continues from).
    steps: [] int32 steps replayed.
    go: [] bool, the next step's log-probabilities are known and the loop
      goes on.
  """

  state: beam_lib.BeamState
  path: jax.Array
  known: jax.Array
  source: jax.Array
  steps: jax.Array
  go: jax.Array


def _draft_paths(draft_step_fn, draft_cache, last, *, gamma, draft_width):
  """The draft's m most likely next tokens after each live beam, each continued greedily.

  Args:
    draft_step_fn: the draft's step function over B * W * m rows.
    draft_cache: its cache, rows (b, i, 0..m-1) holding live beam i's prefix.
    last: [B, W] int32 each live beam's last token.
    gamma: static path length.
    draft_width: static m <= V.

  Returns:
    paths [B, W, m, gamma] int32 (path (b, i, j) starts with the draft's
    j-th most likely token after live beam i) and the draft cache, row
    (b, i, j) holding path (b, i, j) but its last token.
  """
  batch, width = last.shape
  rows = batch * width * draft_width
  # Step 1: one distribution per live beam (its m rows are copies): its top m.
  tokens = jnp.repeat(last.reshape(-1, 1), draft_width, axis=0)  # [B * W * m, 1]
  logits, draft_cache = draft_step_fn(tokens, draft_cache)
  per_beam = logits[::draft_width, 0]  # [B * W, V]
  tokens = jax.lax.top_k(per_beam, draft_width)[1].reshape(rows, 1)

  def greedy(carry, _):
    cache, tokens = carry
    logits, cache = draft_step_fn(tokens, cache)
    tokens = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
    return (cache, tokens), tokens[:, 0]

  (draft_cache, _), rest = jax.lax.scan(greedy, (draft_cache, tokens), None, length=gamma - 1)
  paths = jnp.concatenate([tokens, rest.T], axis=1)  # [B * W * m, gamma]
  return paths.reshape(batch, width, draft_width, gamma), draft_cache


def _replay(state, log_probs, paths, *, alpha, eos_id, max_decode_len, gamma):
  """Plain beam steps on the target's log-probabilities of the drafted paths.

  Args:
    state: the beams at the iteration's start (index t).
    log_probs: [B, R, gamma + 1, V] the target's log-probabilities after each
      prefix of each path (position 0: after the live beam alone).
    paths: [B, R, gamma] drafted tokens; path r extends live beam r // m.
    alpha, eos_id, max_decode_len: as beam_search.beam_search.
    gamma: static draft length.

  Returns:
    The final _Replay (steps >= 1).
  """
  batch, rows = paths.shape[:2]
  width = state.live_seqs.shape[1]
  m = rows // width
  # A column that matches no token: nothing is drafted after gamma tokens.
  paths = jnp.pad(paths, ((0, 0), (0, 0), (0, 1)), constant_values=-1)
  # Live beam i is a prefix of every path drafted from a beam with its tokens.
  same = jnp.all(state.live_seqs[:, :, None] == state.live_seqs[:, None], axis=-1)  # [B, W, W]
  known = jnp.repeat(same, m, axis=2)  # [B, W, R]
  start = _Replay(state=state, path=jnp.argmax(known, axis=-1).astype(jnp.int32), known=known,
                  source=jnp.zeros((batch, width), jnp.int32), steps=jnp.zeros((), jnp.int32),
                  go=jnp.ones((), bool))

  def body(r: _Replay) -> _Replay:
    at_step = jax.lax.dynamic_index_in_dim(log_probs, r.steps, axis=2, keepdims=False)
    step_log_probs = jnp.take_along_axis(at_step, r.path[:, :, None], axis=1)  # [B, W, V]
    state, parents = beam_lib.beam_step(r.state, step_log_probs, alpha, eos_id)
    tokens = jax.lax.dynamic_index_in_dim(state.live_seqs, state.index, axis=2, keepdims=False)
    drafted = jax.lax.dynamic_index_in_dim(paths, r.steps, axis=2, keepdims=False)  # [B, R]
    known = (jnp.take_along_axis(r.known, parents[:, :, None], axis=1)
             & (drafted[:, None, :] == tokens[:, :, None]))  # [B, W, R]
    return _Replay(state=state, path=jnp.argmax(known, axis=-1).astype(jnp.int32), known=known,
                   source=jnp.take_along_axis(r.path, parents, axis=1), steps=r.steps + 1,
                   go=(jnp.all(jnp.any(known, axis=-1))
                       & beam_lib.should_continue(state, alpha, max_decode_len)))

  return jax.lax.while_loop(lambda r: r.go, body, start)


def speculative_beam_search(target_step_fn, target_cache: cache_lib.Cache, draft_step_fn,
                            draft_cache: cache_lib.Cache, *, beam_size: int, draft_width: int,
                            gamma: int, max_decode_len: int, alpha: float | jax.Array = 0.6,
                            eos_id: int = 1, check_finite: bool = True) -> beam_lib.BeamOutput:
  """Beam search of the target with drafted paths verified in one call.

  Returns exactly `beam_search.beam_search(target_step_fn, ...)`'s beams and
  scores, for any draft (up to the target's numerics over K positions).

  Args:
    target_step_fn: the target's step function.
    target_cache: its fresh cache for B batch rows (batch-major leaves),
      capacity >= cache_length(max_decode_len, gamma); expanded to
      B * beam_size * draft_width rows.
    draft_step_fn: the draft's step function (same vocabulary).
    draft_cache: its fresh cache, same rows and capacity bound.
    beam_size: static number of beams W.
    draft_width: static m, paths the draft proposes from each live beam.
    gamma: static draft steps per iteration; an iteration covers 1 to
      gamma + 1 beam steps.
    max_decode_len: static most tokens per sequence.
    alpha: brevity penalty exponent (traced), a finite number in [0, 10]
      (checks.check_alpha).
    eos_id: the token that finishes a beam.
    check_finite: static, on by default; flag in BeamOutput.nonfinite the
      batch rows whose target logits were not finite (the draft's
      only change how many steps a call covers).

  Returns:
    BeamOutput, beams ascending by score (the best is last).

  Raises:
    ValueError: as beam_search.beam_search, and for a draft_width outside
      1..V, rows B * W * m beyond int32, a bad gamma, a draft cache of
      another batch or vocabulary size.
  """
  batch = target_cache.batch_size
  if draft_cache.batch_size != batch:
    raise ValueError(f'draft cache batch {draft_cache.batch_size} != target cache batch {batch}')
  probe = jnp.zeros((batch, 1), jnp.int32)
  v_p = jax.eval_shape(target_step_fn, probe, target_cache)[0].shape[-1]
  v_q = jax.eval_shape(draft_step_fn, probe, draft_cache)[0].shape[-1]
  if v_p != v_q:
    raise ValueError(f'draft vocabulary size {v_q} != target vocabulary size {v_p}')
  gamma = checks.check_size('gamma', gamma)
  width, max_decode_len = beam_lib.check_args(target_cache, beam_size=beam_size,
                                              max_decode_len=max_decode_len, alpha=alpha,
                                              vocab_size=v_p, gamma=gamma)
  beam_lib.check_args(draft_cache, beam_size=beam_size, max_decode_len=max_decode_len,
                      alpha=alpha, vocab_size=v_q, gamma=gamma)
  _, m = checks.check_beam_settings(width, batch=batch, vocab_size=v_q,
                                        draft_width=draft_width)
  rows = width * m
  offsets = (jnp.arange(batch) * rows)[:, None]  # [B, 1]

  def body(carry):
    state, target_cache, draft_cache, target_calls, draft_calls, nonfinite = carry
    t = state.index
    last = jax.lax.dynamic_index_in_dim(state.live_seqs, t, axis=2, keepdims=False)  # [B, W]
    paths, draft_cache = _draft_paths(draft_step_fn, draft_cache, last, gamma=gamma,
                                      draft_width=m)
    verify = jnp.concatenate([jnp.repeat(last[:, :, None, None], m, axis=2), paths], axis=-1)
    logits, target_cache = target_step_fn(verify.reshape(batch * rows, gamma + 1), target_cache)
    log_probs = beam_lib.log_softmax(logits).reshape(batch, rows, gamma + 1, -1)
    r = _replay(state, log_probs, paths.reshape(batch, rows, gamma), alpha=alpha,
                eos_id=eos_id, max_decode_len=max_decode_len, gamma=gamma)
    # After all gamma + 1 steps the beams' caches need the draft's last token.
    sweep = r.steps == gamma + 1
    draft_cache = jax.lax.cond(
        sweep, lambda c: draft_step_fn(paths.reshape(batch * rows, gamma)[:, -1:], c)[1],
        lambda c: c, draft_cache)
    # Row (b, i, j) continues live beam i from the rows of path source[b, i].
    source = jnp.repeat(offsets + r.source, m, axis=1).reshape(-1)
    return (r.state, beam_lib.gather_rows(target_cache, source, r.state.index),
            beam_lib.gather_rows(draft_cache, source, r.state.index), target_calls + 1,
            draft_calls + gamma + sweep, beam_lib.flag_nonfinite(nonfinite, logits))

  start = (beam_lib.BeamState.create(batch, width, max_decode_len),
           beam_lib.expand_rows(target_cache, rows), beam_lib.expand_rows(draft_cache, rows),
           jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
           jnp.zeros((batch,), bool) if check_finite else None)
  state, _, _, target_calls, draft_calls, nonfinite = jax.lax.while_loop(
      lambda c: beam_lib.should_continue(c[0], alpha, max_decode_len), body, start)
  return beam_lib.finish(state, target_calls=target_calls, draft_calls=draft_calls,
                         nonfinite=nonfinite)
