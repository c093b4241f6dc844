"""The two decoding loops: the autoregressive baseline and speculative decoding.

Each loop is one `lax.while_loop` over fixed shapes, driven by step functions

  step_fn(tokens: int32[B, K], cache: Cache) -> (logits: float[B, K, V], Cache)

that write K positions at each row's `cache.index` and return the cache with
the index advanced by K. The loops never see a model (as t5x/decoding.py takes
`tokens_to_logits`); `spec_decode.models` builds step functions for T5 and the
tests drive the loops with stubs.

Token layout. `tokens[b, 0]` is the decoder start token (id 0, T5's BOS);
generated token j of row b sits at `tokens[b, j]`. `index[b]` is the position
of row b's last known token, and the target's cache holds keys/values for
positions 0 .. index[b] - 1 (the draft's up to index[b] - 2 after a clean
sweep): the next model call feeds `tokens[b, index[b]]`.

One speculative iteration (Algorithm 1 of Leviathan et al. 2023):
  1. `steps` draft calls propose x_1..x_steps from q_1..q_steps: the first
     over the row's last two tokens (K = 2, `draft_phase.first_call`), the others
     K = 1; steps = gamma, or with a confidence_threshold up to gamma, row b
     proposing its first lengths[b] (spec_decode.draft_phase);
  2. one target call over K = gamma + 1 positions (or the smallest of
     `verify_lengths` >= steps + 1) gives p_1..p_{steps+1};
  3. `speculative.accept` (token or block verification) keeps n drafts and
     draws the target's own token;
  4. each row advances by its own count and both caches are rewound per row.
A row that kept all `steps` drafts leaves the draft one token behind
(x_steps unseen): the next iteration's first draft call feeds it, with y.

These functions are meant to be traced inside a `jax.jit` built by the caller,
with model parameters as traced arguments captured by the step functions.
The static options (gamma, max_decode_len, verification, verify_lengths,
eos_id, check_finite) travel together as one frozen, hashable `LoopOptions`,
the traced ones (sampling, draft_sampling, lenience, confidence_threshold) as
one `Knobs` pytree (spec_decode.options), each checked once where it is built.
"""

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import checks
from spec_decode import draft_phase
from spec_decode import loop_utils
from spec_decode.loop_utils import cache_length  # noqa: F401 (public here too)
from spec_decode.options import Knobs, LoopOptions
from spec_decode import sampling as sampling_lib
from spec_decode import speculative

StepFn = Callable[[jax.Array, cache_lib.Cache], tuple[jax.Array, cache_lib.Cache]]

BOS_ID = 0  # the decoder start token at loop position 0 (T5's, spec_decode.text)


@flax.struct.dataclass
class DecodeOutput:
  """Decoded tokens and the loop's statistics.

  Attributes:
    tokens: [B, max_decode_len] int32: an encoder-decoder model's forced
      decoder `prompt` (if any) then the generated tokens (EOS included);
      for a decoder-only model the generated tokens alone (its prompt is
      the input, not output). 0-padded after `lengths`.
    lengths: [B] int32 number of valid tokens per row.
    generated: [B] int32 tokens the loop produced per row (prompt excluded).
    target_calls: [B] int32 target calls made while the row was unfinished.
    draft_calls: [B] int32 draft calls made while the row was unfinished:
      each iteration's batched draft steps (the first over two positions:
      draft_phase.first_call).
    accept_histogram: [gamma + 1] int32 how often 0..gamma drafts were accepted
      (over unfinished rows and iterations); the baseline is gamma = 0.
    draft_histogram: [gamma + 1] int32 how often 0..gamma drafts were proposed
      (all at gamma unless the draft length is adaptive; [0] in the baseline).
    loop_target_calls: [] int32 batched target calls of the whole loop.
    loop_draft_calls: [] int32 batched draft calls of the whole loop.
    nonfinite: [B] bool, a model returned a NaN or +inf logit for the row, or
      -inf for every token at a position (-inf alone is a mask and passes;
      loop_utils.nonfinite_rows); the row then stopped and its tokens are
      garbage. None when decoded with check_finite=False.
  """

  tokens: jax.Array
  lengths: jax.Array
  generated: jax.Array
  target_calls: jax.Array
  draft_calls: jax.Array
  accept_histogram: jax.Array
  loop_target_calls: jax.Array
  loop_draft_calls: jax.Array
  nonfinite: jax.Array | None = None
  draft_histogram: jax.Array | None = None

  @property
  def tokens_per_target_call(self) -> jax.Array:
    """[] generated tokens per target call over all rows (eq. (1) measured)."""
    return jnp.sum(self.generated) / jnp.maximum(jnp.sum(self.target_calls), 1)


@flax.struct.dataclass
class _LoopState:
  """The while-loop carry.

  Attributes:
    tokens: [B, max_decode_len + gamma + 2] int32, see the module docstring.
    index: [B] int32 position of each row's last known token.
    done: [B] bool, row finished (EOS emitted or max_decode_len reached).
    target_cache: the target's Cache, `index` equal to `index` above.
    draft_cache: the draft's Cache (None in the baseline).
    rng: [B] PRNG keys, one stream per row.
    target_calls: [B] int32.
    draft_calls: [B] int32.
    accept_histogram: [gamma + 1] int32.
    draft_histogram: [gamma + 1] int32.
    loop_target_calls: [] int32.
    loop_draft_calls: [] int32.
    nonfinite: [B] bool, or None without check_finite.
  """

  tokens: jax.Array
  index: jax.Array
  done: jax.Array
  target_cache: cache_lib.Cache
  draft_cache: cache_lib.Cache
  rng: jax.Array
  target_calls: jax.Array
  draft_calls: jax.Array
  accept_histogram: jax.Array
  draft_histogram: jax.Array
  loop_target_calls: jax.Array
  loop_draft_calls: jax.Array
  nonfinite: jax.Array | None


def autoregressive_decode(step_fn: StepFn, cache: cache_lib.Cache, *, max_decode_len: int,
                          rng: jax.Array, sampling: sampling_lib.SamplingParams | None = None,
                          prompt: jax.Array | None = None, eos_id: int = 1,
                          check_finite: bool = True) -> DecodeOutput:
  """The baseline: one target call per token (T5X's `temperature_sample`).

  Args:
    step_fn: the target's step function.
    cache: the target's fresh Cache, capacity >= cache_length(max_decode_len).
    max_decode_len: static maximum number of output tokens per row.
    rng: one PRNG key, or [B] keys (one stream per row: row b decodes as a
      batch-1 run given rng[b:b + 1], not the one key rng[b], which a run
      splits), or an int seed in the int64 range.
    sampling: temperature/top-k/top-p; greedy when None.
    prompt: optional [B, P] int32 forced decoder tokens, left-aligned and
      0-padded (as T5X's decoder prompts); they are part of the output.
    eos_id: the token that ends a row.
    check_finite: static, on by default; stop a row whose logits are not
      finite and flag it in DecodeOutput.nonfinite. False saves two
      reductions per step, and a non-finite logit then silently decodes as
      token V - 1.

  Returns:
    DecodeOutput with gamma = 0 (accept_histogram [1] counts target calls).
  """
  options = LoopOptions(max_decode_len, eos_id=eos_id, check_finite=check_finite)
  return decode_loop(step_fn, cache, None, None, options, Knobs.create(sampling), rng=rng,
                     prompt=prompt)


def speculative_decode(target_step_fn: StepFn, target_cache: cache_lib.Cache,
                       draft_step_fn: StepFn, draft_cache: cache_lib.Cache, *, gamma: int,
                       max_decode_len: int, rng: jax.Array,
                       sampling: sampling_lib.SamplingParams | None = None,
                       draft_sampling: sampling_lib.SamplingParams | None = None,
                       lenience: float | jax.Array = 1.0, verification: str = 'token',
                       confidence_threshold: float | jax.Array | None = None,
                       verify_lengths: tuple[int, ...] | None = None,
                       prompt: jax.Array | None = None, eos_id: int = 1,
                       check_finite: bool = True) -> DecodeOutput:
  """Speculative decoding: samples exactly from the target, fewer target calls.

  Args:
    target_step_fn: step function of the target model M_p.
    target_cache: its fresh Cache, capacity >= cache_length(max_decode_len, gamma).
    draft_step_fn: step function of the draft model M_q (same vocabulary).
    draft_cache: its fresh Cache, same batch and capacity bound.
    gamma: static number of drafted tokens per iteration, >= 1.
    max_decode_len: static maximum number of output tokens per row.
    rng: one PRNG key, or [B] keys (one stream per row: row b then decodes
      exactly as a batch-1 run given the [1] keys rng[b:b + 1]; given the one
      key rng[b] instead, a run splits it and draws another stream), or an
      int seed in the int64 range.
    sampling: temperature/top-k/top-p of the target's p (what the output
      follows); greedy when None.
    draft_sampling: the knobs that turn the draft's logits into q; None uses
      `sampling`'s. The output is exactly p's for any q, so e.g.
      `sampling.untruncated()` skips the draft's top-k/top-p work (a TopK per
      draft step) for a little alpha_lib.
    lenience: l of Appendix A.5. 1 (the default) is exact; l < 1 accepts more
      drafts and no longer samples exactly from the target.
    verification: static; 'token' (Algorithm 1) or 'block' (Sun et al. 2025:
      the drafted block judged jointly; exact, never fewer accepted drafts in
      expectation). See speculative.accept_reject.
    confidence_threshold: None drafts gamma tokens per iteration. A number in
      [0, 1] (traced) makes gamma a maximum: a row stops drafting after a
      token its draft gave probability below it (spec_decode.draft_phase); exact
      either way.
    verify_lengths: static; None verifies gamma + 1 positions per iteration.
      Otherwise K values in 2..gamma + 1 (gamma + 1 is added): each iteration
      calls the target over the smallest K that holds its drafts (worth it
      where a call's cost grows with K, as on CPUs; see draft_phase.verify).
    prompt: optional [B, P] int32 forced decoder tokens, left-aligned, 0-padded.
    eos_id: the token that ends a row.
    check_finite: static, on by default; stop a row whose target or draft
      logits are not finite and flag it in DecodeOutput.nonfinite.
      False saves two reductions per model call, and a non-finite logit then
      silently decodes as token V - 1.

  Returns:
    DecodeOutput.
  """
  options = LoopOptions(max_decode_len, checks.check_size('gamma', gamma), verification,
                        verify_lengths, eos_id, check_finite)
  knobs = Knobs.create(sampling, draft_sampling, lenience, confidence_threshold)
  return decode_loop(target_step_fn, target_cache, draft_step_fn, draft_cache, options, knobs,
                     rng=rng, prompt=prompt)


def decode_loop(target_step_fn: StepFn, target_cache: cache_lib.Cache,
                draft_step_fn: StepFn | None, draft_cache: cache_lib.Cache | None,
                options: LoopOptions, knobs: Knobs, *, rng: jax.Array,
                prompt: jax.Array | None = None, feed=None) -> DecodeOutput:
  """Either loop by its LoopOptions: the baseline when options.gamma is 0.

  What `autoregressive_decode` and `speculative_decode` run, for front ends
  that hold the options and knobs already (spec_decode.models.front_ends).

  Args:
    target_step_fn, target_cache: the target M_p's step function and fresh
      Cache (capacity >= cache_length(options.max_decode_len, options.gamma)).
    draft_step_fn, draft_cache: the draft M_q's, or None for the baseline.
    options: the static options; gamma 0 exactly when there is no draft.
    knobs: the traced knobs (`Knobs.create`); the baseline reads `sampling`.
    rng, prompt: as `speculative_decode` takes them.
    feed: None, or `feed(draft_cache, target_cache, begin [B], width) ->
      draft_cache`, called after each verify call over loop positions
      begin .. begin + width - 1: a draft that reads what the target computed
      (models.feature_draft).

  Returns:
    DecodeOutput.
  """
  speculate = draft_step_fn is not None
  if speculate != (options.gamma > 0):
    raise ValueError(f'gamma {options.gamma} with {"a" if speculate else "no"} draft: '
                     'speculative decoding needs a draft and gamma >= 1, the baseline neither')
  gamma, max_decode_len = options.gamma, options.max_decode_len
  batch = target_cache.batch_size
  prompt = None if prompt is None else checks.as_array('prompt', prompt)
  loop_utils.check_static_args(target_step_fn, target_cache, draft_step_fn, draft_cache,
                               gamma=gamma, max_decode_len=max_decode_len, prompt=prompt)
  knobs.check_batch(batch)

  tokens = jnp.full((batch, max_decode_len + gamma + 2), BOS_ID, jnp.int32)
  index = jnp.zeros((batch,), jnp.int32)
  if prompt is not None and prompt.shape[1]:
    prompt = prompt.astype(jnp.int32)
    tokens = tokens.at[:, 1:prompt.shape[1] + 1].set(prompt)
    index = jnp.sum(prompt != 0, axis=-1).astype(jnp.int32)
    # Prefill: feed BOS and the prompt (positions 0..P-1) in one call per model.
    _, target_cache = target_step_fn(tokens[:, :prompt.shape[1]], target_cache)
    if speculate:
      _, draft_cache = draft_step_fn(tokens[:, :prompt.shape[1]], draft_cache)
  target_cache = cache_lib.rewind(target_cache, index)
  draft_cache = cache_lib.rewind(draft_cache, index) if speculate else None

  zeros = jnp.zeros((batch,), jnp.int32)
  state = _LoopState(
      tokens=tokens, index=index, done=jnp.zeros((batch,), bool), target_cache=target_cache,
      draft_cache=draft_cache, rng=loop_utils.row_keys(rng, batch), target_calls=zeros,
      draft_calls=zeros,
      accept_histogram=jnp.zeros((gamma + 1,), jnp.int32),
      draft_histogram=jnp.zeros((gamma + 1,), jnp.int32),
      loop_target_calls=jnp.zeros((), jnp.int32), loop_draft_calls=jnp.zeros((), jnp.int32),
      nonfinite=jnp.zeros((batch,), bool) if options.check_finite else None)

  if speculate:
    body = _speculative_body(target_step_fn, draft_step_fn, options, knobs, feed)
  else:
    body = _autoregressive_body(target_step_fn, options, knobs.sampling)
  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)

  positions = jnp.arange(1, max_decode_len + 1)
  out = jnp.where(positions[None, :] <= state.index[:, None],
                  state.tokens[:, 1:max_decode_len + 1], 0)
  return DecodeOutput(
      tokens=out, lengths=state.index, generated=state.index - index,
      target_calls=state.target_calls, draft_calls=state.draft_calls,
      accept_histogram=state.accept_histogram, loop_target_calls=state.loop_target_calls,
      loop_draft_calls=state.loop_draft_calls, nonfinite=state.nonfinite,
      draft_histogram=state.draft_histogram)


def _flag_nonfinite(s: _LoopState, done: jax.Array,
                    bad: Callable[[], jax.Array]) -> dict[str, jax.Array]:
  """The `done` (and with check_finite `nonfinite`) updates; `bad()` gives [B] bool."""
  if s.nonfinite is None:
    return {'done': done}
  nonfinite = s.nonfinite | (~s.done & bad())
  return {'done': done | nonfinite, 'nonfinite': nonfinite}


def _autoregressive_body(step_fn, options: LoopOptions, sampling: sampling_lib.SamplingParams):
  """One baseline iteration: one target call, one token per unfinished row."""
  max_decode_len, eos_id = options.max_decode_len, options.eos_id

  def body(s: _LoopState) -> _LoopState:
    rng, key = loop_utils.split_rows(s.rng, 2)
    last = jnp.take_along_axis(s.tokens, s.index[:, None], axis=1)  # [B, 1]
    logits, cache = step_fn(last, s.target_cache)
    _, token = sampling_lib.draw(key, logits[:, 0], sampling)  # [B]
    active = ~s.done
    tokens = cache_lib.write(s.tokens, token[:, None], s.index + 1)
    index = s.index + active
    done = s.done | (active & (token == eos_id)) | (index >= max_decode_len)
    return s.replace(
        tokens=tokens, index=index,
        **_flag_nonfinite(s, done, lambda: loop_utils.nonfinite_rows(logits)),
        target_cache=cache_lib.rewind(cache, index), rng=rng,
        target_calls=s.target_calls + active,
        accept_histogram=s.accept_histogram + jnp.sum(active),
        loop_target_calls=s.loop_target_calls + 1)

  return body


def _speculative_body(target_step_fn, draft_step_fn, options: LoopOptions, knobs: Knobs, feed):
  """One speculative iteration: up to gamma draft calls, one verify call, accept (and feed)."""
  gamma, max_decode_len, eos_id = options.gamma, options.max_decode_len, options.eos_id
  threshold = knobs.confidence_threshold

  def body(s: _LoopState) -> _LoopState:
    rng, draft_key, accept_key = loop_utils.split_rows(s.rng, 3)
    active = ~s.done
    last = jnp.take_along_axis(s.tokens, s.index[:, None], axis=1)[:, 0]  # [B]

    # 1. Draft: [gamma] keys per row -> x [B, gamma], q [B, gamma, V]; row b
    #    proposes its first lengths[b] (all gamma unless confidence_threshold).
    draft_keys = jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, gamma))(draft_key), 0, 1)
    draft_cache, x, q, lengths, steps, draft_bad = draft_phase.draft_block(
        draft_step_fn, s.draft_cache, s.tokens, draft_keys, gamma=gamma,
        sampling=knobs.draft_sampling, active=active, confidence_threshold=threshold,
        check_finite=options.check_finite)

    # 2. Verify: one target call over [last, x_1..x_gamma] (or its first K
    #    positions) -> the logits of p [B, gamma + 1, V].
    logits, target_cache = draft_phase.verify(target_step_fn,
                                              jnp.concatenate([last[:, None], x], axis=1),
                                              s.target_cache, steps, options.verify_lengths)
    # 3. Accept a prefix of n drafts; y is the target's own token after it.
    # (The draft has seen x_1..x_{steps-1}: after a clean sweep the next
    # iteration's first draft call feeds it x_steps with y.)
    n, y = speculative.accept(accept_key, x, q, logits, knobs.sampling, knobs.lenience,
                              options.verification, lengths=None if threshold is None else lengths)

    # 4. Emit x_1..x_n, y, cut at the first EOS and at max_decode_len.
    slots = jnp.arange(gamma + 1)
    candidates = jnp.where(slots[None, :] == n[:, None], y[:, None],
                           jnp.pad(x, ((0, 0), (0, 1))))  # [B, gamma + 1]
    emit = ((slots[None, :] <= n[:, None]) & active[:, None]
            & (s.index[:, None] + 1 + slots[None, :] <= max_decode_len))
    is_eos = emit & (candidates == eos_id)
    emit &= (jnp.cumsum(is_eos, axis=1) - is_eos) == 0  # nothing after the first EOS
    index = s.index + jnp.sum(emit, axis=1, dtype=jnp.int32)
    done = s.done | jnp.any(is_eos, axis=1) | (index >= max_decode_len)
    if feed is not None:
      draft_cache = feed(draft_cache, target_cache, s.index, gamma + 1)

    return s.replace(
        tokens=cache_lib.write(s.tokens, candidates, s.index + 1), index=index,
        **_flag_nonfinite(s, done, lambda: loop_utils.nonfinite_rows(logits) | draft_bad),
        target_cache=cache_lib.rewind(target_cache, index),
        draft_cache=cache_lib.rewind(draft_cache, index), rng=rng,
        target_calls=s.target_calls + active,
        draft_calls=s.draft_calls + active * steps,
        accept_histogram=s.accept_histogram + _histogram(n, active, gamma),
        draft_histogram=s.draft_histogram + _histogram(lengths, active, gamma),
        loop_target_calls=s.loop_target_calls + 1,
        loop_draft_calls=s.loop_draft_calls + steps)

  return body


def _histogram(values: jax.Array, active: jax.Array, gamma: int) -> jax.Array:
  """[gamma + 1] counts of values [B] in 0..gamma over the active rows."""
  return jnp.sum(jax.nn.one_hot(values, gamma + 1, dtype=jnp.int32) * active[:, None], axis=0)
