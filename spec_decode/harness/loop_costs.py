"""What a decoding loop costs per input and per iteration, measured whole.

`step_costs` times each model call alone (c, c_first, r(K)) and predicts the
speedup from those parts (eq. (5) extended). This module times the loops as
they run, so that every interaction the parts leave out (the two models
evicting each other's weights from the CPU cache, sampling, bookkeeping,
dispatch) is in the figures:

  seconds(input, L) = fixed + iterations(input, L) * per_iteration

Each input is decoded to exactly L tokens (no EOS can end it) for two values of
L; the least-squares line through (iterations, seconds) over all inputs and
both L gives the per-input fixed cost (its intercept: encoder passes, cache
set-up, dispatch) and what one iteration of the loop costs (its slope). For the
baseline an iteration is one token; for speculative decoding it is gamma
draft steps, one verify call and the accept step, however many tokens it
keeps, so the walltime at an acceptance rate alpha is predicted by

  speedup = E[tokens per iteration](alpha, gamma) * baseline / speculative
            (per-iteration costs; eq. (1) gives the expectation).

`start_times` times the fixed cost's main piece: each model's encoder pass and
cross-attention keys/values with a fresh cache, alone and both in one program.

`loop_work_time` times the loops' own work alone, with model calls that cost
nothing.
"""

import dataclasses
import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import theory


def loop_work_time(*, gamma: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
                   logit_scale: float = 2.0, vocab_size: int = 8192, max_decode_len: int = 64,
                   repeats: int = 9) -> float:
  """Seconds per iteration of a decoding loop whose model calls cost nothing.

  The step functions return fixed random logits (different ones for draft and
  target), so what is timed is the loop itself: adjusting and sampling over
  the vocabulary, the accept test, writing tokens, rewinding caches. Batch 1,
  compile excluded, median over repeats.

  Args:
    gamma: draft length; 0 times the baseline loop (one target call a token).
    temperature: sampling temperature (0: greedy).
    top_k: top-k knob (0: off).
    top_p: top-p knob (1: off).
    logit_scale: the logits' standard deviation: 2 spreads top-p 0.9's nucleus past
      `lax.top_k`'s cap (its bisection runs every call), 8 keeps it among a few tokens.
    vocab_size: V of the logits.
    max_decode_len: tokens per decode (no EOS is ever drawn).
    repeats: timed decodes.
  """
  rng = np.random.default_rng(0)
  p_logits, q_logits = (jnp.asarray(logit_scale * rng.standard_normal(vocab_size), jnp.float32)
                        for _ in range(2))

  def free_step(logits):
    def step_fn(tokens, cache):
      # Depends on the tokens, so XLA cannot hoist the sampling out of the loop.
      out = logits + 0.0 * tokens[..., None].astype(jnp.float32)  # [B, K, V]
      return out, cache.replace(index=cache.index + tokens.shape[1])
    return step_fn

  capacity = decoding.cache_length(max_decode_len, gamma)
  cache = cache_lib.Cache(index=jnp.zeros((1,), jnp.int32),
                          layers=jnp.zeros((1, capacity), jnp.int32), capacity=capacity)
  # Traced knobs, as the decoders pass them.
  sampling = sampling_lib.SamplingParams.create(temperature, top_k, top_p)
  common = dict(max_decode_len=max_decode_len, eos_id=-1)
  if gamma:
    decode = jax.jit(lambda key, sampling: decoding.speculative_decode(
        free_step(p_logits), cache, free_step(q_logits), cache, gamma=gamma, rng=key,
        sampling=sampling, **common))
  else:
    decode = jax.jit(lambda key, sampling: decoding.autoregressive_decode(
        free_step(p_logits), cache, rng=key, sampling=sampling, **common))
  jax.block_until_ready(decode(jax.random.key(0), sampling))  # compile
  seconds, out = timing.median_time(lambda: decode(jax.random.key(0), sampling), repeats)
  return seconds / int(out.loop_target_calls)


LengthDecodeFn = Callable[[jax.Array, jax.Array, int], decoding.DecodeOutput]


NO_EOS = -1  # an eos_id no token equals: every row runs to max_decode_len


@dataclasses.dataclass(frozen=True)
class LoopCost:
  """A decoder's cost line, seconds = fixed_s + iterations * iteration_s.

  Attributes:
    fixed_s: seconds per input that do not grow with the output.
    iteration_s: seconds per loop iteration (one target call).
    tokens_per_iteration: generated tokens per iteration over the runs.
  """

  fixed_s: float
  iteration_s: float
  tokens_per_iteration: float

  def row(self) -> dict[str, float]:
    return dict(fixed_ms=1e3 * self.fixed_s, iteration_ms=1e3 * self.iteration_s,
                tokens_per_iteration=self.tokens_per_iteration)


def baseline(target: models.T5Model, sampling: sampling_lib.SamplingParams) -> LengthDecodeFn:
  """The target alone, never stopped by EOS."""
  return lambda inputs, keys, length: models.generate(
      target, inputs, keys, max_decode_len=length, sampling=sampling, eos_id=NO_EOS)


def speculative(target: models.T5Model, draft, gamma: int,
                sampling: sampling_lib.SamplingParams,
                draft_sampling: sampling_lib.SamplingParams | None = None) -> LengthDecodeFn:
  """Speculative decoding with `gamma` (q's knobs: draft_sampling), never stopped by EOS."""
  return lambda inputs, keys, length: models.speculative_generate(
      target, draft, inputs, keys, gamma=gamma, max_decode_len=length, sampling=sampling,
      draft_sampling=draft_sampling, eos_id=NO_EOS)


def measure_loop_costs(decoders: dict[str, LengthDecodeFn], encoder_input_tokens: np.ndarray,
                       rng: jax.Array, *, lengths: Sequence[int] = (1, 40),
                       repeats: int = 3) -> dict[str, LoopCost]:
  """Fits each decoder's cost line, all decoders interleaved per run.

  Args:
    decoders: name -> decoder (see `baseline`, `speculative`).
    encoder_input_tokens: [N, S] int32 inputs, decoded one at a time.
    rng: input i uses key fold_in(rng, i).
    lengths: the output lengths L (two or more, distinct). L = 1 is exactly
      one iteration, which pins the intercept; tokens per iteration come from
      the longest L.
    repeats: timed runs per (input, L, decoder); the median is kept.

  Returns:
    name -> LoopCost.
  """
  if len(set(lengths)) < 2:
    raise ValueError(f'lengths must hold two or more distinct values, got {lengths}')
  inputs = [jnp.asarray(encoder_input_tokens[i:i + 1]) for i in range(len(encoder_input_tokens))]
  keys = [jax.random.fold_in(rng, i)[None] for i in range(len(inputs))]
  for decode in decoders.values():  # compile every (decoder, L) before timing any
    for length in lengths:
      jax.block_until_ready(decode(inputs[0], keys[0], length))
  points = {name: [] for name in decoders}  # (iterations, seconds, tokens)
  for x, key in zip(inputs, keys):
    for length in lengths:
      for _ in range(repeats):
        for name, decode in decoders.items():
          start = time.perf_counter()
          out = jax.block_until_ready(decode(x, key, length))
          points[name].append((int(out.loop_target_calls), time.perf_counter() - start,
                               int(out.generated[0])))
  longest = np.tile(np.repeat(np.asarray(lengths) == max(lengths), repeats), len(inputs))
  return {name: _fit(np.asarray(p, np.float64), longest, repeats) for name, p in points.items()}


def _fit(points: np.ndarray, longest: np.ndarray, repeats: int) -> LoopCost:
  """[runs, 3] (iterations, seconds, tokens) -> the line through the per-run medians."""
  medians = np.median(points.reshape(-1, repeats, 3), axis=1)  # [inputs * lengths, 3]
  slope, intercept = np.polyfit(medians[:, 0], medians[:, 1], 1)
  at_longest = medians[longest[::repeats]]
  return LoopCost(fixed_s=float(intercept), iteration_s=float(slope),
                  tokens_per_iteration=float(np.sum(at_longest[:, 2]) / np.sum(at_longest[:, 0])))


def iteration_speedup(alpha: float, gamma: int, baseline_cost: LoopCost,
                      speculative_cost: LoopCost) -> float:
  """The loops' speedup at acceptance rate alpha: eq. (1) over whole-iteration costs."""
  return float(theory.expected_tokens(alpha, gamma) * baseline_cost.iteration_s
               / speculative_cost.iteration_s)


def start_times(target, draft, encoder_input_tokens: np.ndarray, *, capacity: int,
                repeats: int = 9) -> dict[str, float]:
  """Seconds per input of `start` (encoder pass, cross K/V, fresh cache), batch 1.

  Three programs, interleaved per input: the target's start, the draft's, and
  both in one program as the speculative decoder runs them. Each call alone
  also pays a dispatch and a wait that a decoder pays once for both models,
  so what the draft's start adds to a decoder is `draft_in_program`, both
  minus the target's.

  Args:
    target: M_p.
    draft: M_q.
    encoder_input_tokens: [N, S] inputs, each started alone.
    capacity: the caches' positions.
    repeats: timed rounds per input (median), averaged over the inputs.

  Returns:
    'target', 'draft', 'both' and 'draft_in_program' seconds.
  """
  runs = {'target': (target,), 'draft': (draft,), 'both': (target, draft)}
  inputs = [jnp.asarray(encoder_input_tokens[i:i + 1]) for i in range(len(encoder_input_tokens))]
  seconds = {name: [] for name in runs}
  for x in inputs:
    rounds = timing.round_robin(
        {name: functools.partial(step_costs.start_program, models_, x, capacity)
         for name, models_ in runs.items()},
        repeats)
    for name, times in rounds.items():
      seconds[name].append(np.median(times))
  out = {name: float(np.mean(s)) for name, s in seconds.items()}
  return dict(out, draft_in_program=out['both'] - out['target'])
