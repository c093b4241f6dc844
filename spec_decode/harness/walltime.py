"""Walltime (Table 2): every input decoded alone by each decoder, timed.

Every input is decoded at batch 1 by the baseline and by speculative decoding
(or T5X's own `temperature_sample` over our step function), each input cut to
its own length bucket, one compiled function per decoder and bucket,
interleaved, the median over repeats per input. `summarize` compares the measured speedup with eq. (5)
and splits an iteration's time into draft steps, the verify pass, the
per-input fixed cost and the rest of the loop.
"""

import dataclasses
from typing import Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from spec_decode import decoding
from spec_decode.harness import loading
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import theory
from spec_decode.models import protocol


DecodeFn = Callable[[jax.Array, jax.Array], decoding.DecodeOutput]


@dataclasses.dataclass(frozen=True)
class Decoded:
  """N inputs decoded one by one (batch 1), timed.

  Attributes:
    seconds: [N] median seconds per input over the repeats.
    tokens: N output id lists (EOS included when emitted).
    iterations: [N] loop iterations, i.e. target calls.
    draft_calls: [N] draft calls (0 for the baseline).
    accept_histogram: [gamma + 1] how often 0..gamma drafts were accepted,
      over all inputs (the baseline: [target calls]).
    draft_histogram: [gamma + 1] how often 0..gamma drafts were proposed,
      over all inputs; None where the decoder does not count them.
    input_lengths: [N] the encoder input length each input was decoded at
      (its bucket); None: all alike.
  """

  seconds: np.ndarray
  tokens: list[list[int]]
  iterations: np.ndarray
  draft_calls: np.ndarray
  accept_histogram: np.ndarray
  draft_histogram: np.ndarray | None = None
  input_lengths: np.ndarray | None = None

  @property
  def total_s(self) -> float:
    return float(np.sum(self.seconds))

  @property
  def generated(self) -> int:
    """Generated tokens over all inputs."""
    return sum(map(len, self.tokens))

  @property
  def tokens_per_call(self) -> float:
    """Generated tokens per target call (eq. (1) measured)."""
    return self.generated / max(int(np.sum(self.iterations)), 1)

  def fixed_s(self) -> float:
    """Seconds per input that do not grow with the loop's iterations.

    The least-squares fit seconds = fixed(S) + iterations * per_iteration,
    one fixed cost per encoder input length S (the encoders' cost grows with
    it, and longer inputs give longer outputs) and one per_iteration, then
    fixed(S) averaged over the inputs: encoder passes, cache set-up and the
    call's dispatch, which eq. (5) does not model. 0 when the iterations do
    not vary within any length (no slope to fit); each fixed(S) clipped to
    [0, the shortest seconds of its inputs].
    """
    groups = (np.zeros(len(self.seconds), int) if self.input_lengths is None
              else np.unique(self.input_lengths, return_inverse=True)[1])
    design = np.concatenate([np.eye(groups.max() + 1)[groups],
                             self.iterations.astype(float)[:, None]], axis=1)
    if np.linalg.matrix_rank(design) < design.shape[1]:
      return 0.0
    fixed = np.linalg.lstsq(design, self.seconds, rcond=None)[0][:-1]
    fixed = [np.clip(f, 0.0, np.min(self.seconds[groups == g])) for g, f in enumerate(fixed)]
    return float(np.mean(np.asarray(fixed)[groups]))


def decode_speedup(tokens: Sequence[int], calls: Sequence[float], iteration_cost: float,
                   baseline_fixed: Sequence[float], speculative_fixed: Sequence[float]) -> float:
  """Whole decodes' speedup from parts: each input's fixed cost, then its loop.

  Eq. (5) models the loops alone; a decode also pays, once per input, what
  does not grow with its output (the encoder passes, cross-attention keys and
  values, a fresh cache): the baseline the target's, speculative decoding
  both models'. Over N inputs, in target steps,

    speedup = sum_i (baseline_fixed_i + tokens_i)
              / sum_i (speculative_fixed_i + calls_i * iteration_cost),

  which tends to eq. (5) as the outputs grow and to baseline_fixed /
  speculative_fixed as they shrink.

  Args:
    tokens: [N] output lengths: the baseline's target calls.
    calls: [N] speculative decoding's expected target calls for them
      (`theory.expected_calls_along` or `theory.expected_calls`).
    iteration_cost: one iteration in target steps (summed parts or i(gamma)).
    baseline_fixed: [N] the baseline's fixed cost per input, in target steps.
    speculative_fixed: [N] speculative decoding's, in target steps.
  """
  return float((np.sum(baseline_fixed) + np.sum(tokens))
               / (np.sum(speculative_fixed) + iteration_cost * np.sum(calls)))


def _starts_per_input(decoded: Decoded, times: step_costs.StepTimes
                      ) -> tuple[list[float], list[float]] | None:
  """([N] the target's start, [N] both models' start) at each input's length, seconds.

  None where the inputs' lengths are unknown or some length's starts were not
  timed (`StepCostRounds.add_starts`).
  """
  if decoded.input_lengths is None or not all(
      n in times.target_start_s and n in times.both_start_s for n in decoded.input_lengths):
    return None
  return ([times.target_start_s[n] for n in decoded.input_lengths],
          [times.both_start_s[n] for n in decoded.input_lengths])


def alpha_from_histogram(accept_histogram: Sequence[int]) -> float:
  """alpha estimated from the loop's accept histogram.

  An iteration that accepted n of gamma drafts tested min(n + 1, gamma) of
  them (those after the first rejection never reach the test) and accepted n.
  Under eq. (1)'s i.i.d. model each tested draft is accepted with probability
  alpha, so accepted / tested is its maximum-likelihood estimate (accepted /
  proposed would count the untested drafts as rejections and is biased low).

  Args:
    accept_histogram: [gamma + 1] counts of iterations that accepted 0..gamma.
  """
  histogram = np.asarray(accept_histogram, np.float64)
  n = np.arange(len(histogram))
  tested = np.sum(histogram * np.minimum(n + 1, len(histogram) - 1))
  return float(np.sum(histogram * n) / tested) if tested else float('nan')


def baseline_decoder(target: models.T5Model, *, max_decode_len: int,
                     sampling: sampling_lib.SamplingParams) -> DecodeFn:
  """The target alone, `models.generate`, as a DecodeFn."""
  return lambda inputs, keys: models.generate(target, inputs, keys, max_decode_len=max_decode_len,
                                              sampling=sampling, eos_id=loading.EOS_ID)


def t5x_baseline_decoder(target: models.T5Model, *, max_decode_len: int,
                         sampling: sampling_lib.SamplingParams,
                         eos_id: int = loading.EOS_ID) -> DecodeFn:
  """T5X's own `decoding.temperature_sample` on the same network, as a DecodeFn.

  Needs `t5x` (not on PyPI; researchers with TPUs have it). Its
  `tokens_to_logits` is our step function over our explicit cache, so the
  comparison isolates the decoding loop. The target's weights are arguments
  of the compiled program, as in `models.generate` (closed over, they would be
  constants, which XLA:CPU treats differently). top-k is not supported (T5X's
  is static); top-p is passed through.

  Raises:
    ImportError: t5x is not importable.
    ValueError: sampling.top_k is set.
  """
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

  if np.any(np.asarray(sampling.top_k) > 0):
    raise ValueError('the T5X baseline takes no top_k here; use top_p or plain sampling')
  top_p = float(np.asarray(sampling.top_p))

  @jax.jit
  def decode(target, inputs: jax.Array, keys: jax.Array) -> decoding.DecodeOutput:
    step_fn, cache = target.start(protocol.Batch.of(target, inputs),
                                  decoding.cache_length(max_decode_len))

    def tokens_to_logits(state):
      logits, new_cache = step_fn(state.cur_token, state.cache)
      return logits[:, 0], new_cache

    decodes, _ = t5x_decoding.temperature_sample(
        jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32), cache, tokens_to_logits,
        eos_id=eos_id, decode_rng=jax.random.key_data(keys[0]), num_decodes=1,
        temperature=sampling.temperature, topk=0, topp=top_p if top_p < 1 else 0.0)
    tokens = decodes[:, 0]  # [B, max_decode_len], 0 after EOS
    is_eos = tokens == eos_id
    lengths = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1,
                        max_decode_len).astype(jnp.int32)
    calls = jnp.max(lengths)  # T5X steps every row until the last one ends
    return decoding.DecodeOutput(
        tokens=tokens, lengths=lengths, generated=lengths, target_calls=lengths,
        draft_calls=jnp.zeros_like(lengths), accept_histogram=jnp.sum(lengths)[None],
        loop_target_calls=calls, loop_draft_calls=jnp.zeros((), jnp.int32))

  return lambda inputs, keys: decode(target, inputs, keys)


def speculative_decoder(target: models.T5Model, draft: loading.Draft, *, gamma: int,
                        max_decode_len: int, sampling: sampling_lib.SamplingParams,
                        lenience: float = 1.0, verification: str = 'token',
                        confidence_threshold: float | None = None,
                        verify_lengths: tuple[int, ...] | None = None,
                        draft_sampling: sampling_lib.SamplingParams | None = None) -> DecodeFn:
  """`models.speculative_generate` with its settings fixed, as a DecodeFn."""
  return lambda inputs, keys: models.speculative_generate(
      target, draft, inputs, keys, gamma=gamma, max_decode_len=max_decode_len, sampling=sampling,
      draft_sampling=draft_sampling,
      lenience=lenience, verification=verification, confidence_threshold=confidence_threshold,
      verify_lengths=verify_lengths, eos_id=loading.EOS_ID)


def time_decoding(decoders: dict[Hashable, DecodeFn], encoder_input_tokens: np.ndarray,
                  rng: jax.Array, *, repeats: int = 3, progress: bool = False,
                  smallest_bucket: int = loading.INPUT_BUCKET,
                  between: Callable[[int], object] | None = None) -> dict[Hashable, Decoded]:
  """Decodes each input alone with every decoder, interleaved, timed.

  Input i is decoded with key fold_in(rng, i) by every decoder and in every
  repeat, cut to the smallest length bucket that holds it (as a batch-1
  server buckets its inputs: the encoders then do not run over another
  input's padding). Each decoder compiles once per padded length, before any
  timing.

  Args:
    decoders: name -> `decode(inputs [1, S], keys [1]) -> DecodeOutput`.
    encoder_input_tokens: [N, S] int32, 0-padded.
    rng: one PRNG key.
    repeats: timed runs per input and decoder; the median is kept.
    progress: show a progress bar.
    smallest_bucket: the buckets are 1, 2, 4, ... times this many tokens
      (`loading.trim_padding`).
    between: called with i after every decoder has timed input i: other
      timings there meet the machine the loops meet (e.g. a round of
      `step_costs.StepCostRounds`).

  Returns:
    name -> Decoded.
  """
  inputs = [jnp.asarray(loading.trim_padding(row, smallest_bucket)[None])
            for row in encoder_input_tokens]
  keys = [jax.random.fold_in(rng, i)[None] for i in range(len(inputs))]
  first_of_shape = {}  # shape -> the first input of that shape, to compile on
  for x, key in zip(inputs, keys):
    first_of_shape.setdefault(x.shape, (x, key))
  for decode in decoders.values():
    for x, key in first_of_shape.values():
      jax.block_until_ready(decode(x, key))
  records = {name: [] for name in decoders}
  for i, (x, key) in enumerate(zip(tqdm.tqdm(inputs, desc='walltime', disable=not progress),
                                   keys)):
    for name, decode in decoders.items():
      seconds, out = timing.median_time(lambda: decode(x, key), repeats)
      records[name].append((seconds, jax.device_get(out)))
    if between is not None:
      between(i)
  return {name: Decoded(
      seconds=np.asarray([s for s, _ in outs]),
      tokens=[o.tokens[0, :o.lengths[0]].tolist() for _, o in outs],
      iterations=np.asarray([int(o.loop_target_calls) for _, o in outs]),
      draft_calls=np.asarray([int(o.loop_draft_calls) for _, o in outs]),
      accept_histogram=np.sum([o.accept_histogram for _, o in outs], axis=0),
      draft_histogram=None if outs[0][1].draft_histogram is None else np.sum(
          [o.draft_histogram for _, o in outs], axis=0),
      input_lengths=np.asarray([x.shape[1] for x in inputs]))
          for name, outs in records.items()}


def summarize(baseline: Decoded, speculative: Decoded, *, gamma: int, alpha: float,
              times: step_costs.StepTimes,
              betas: Sequence[np.ndarray] | None = None) -> dict:
  """Measured against predicted speedup, and where an iteration's time goes.

  Args:
    baseline: the target alone.
    speculative: speculative decoding of the same inputs with `gamma`.
    gamma: its draft length; times must cover K = gamma + 1.
    alpha: the measured acceptance rate (e.g. `measure_alpha`).
    times: the measured step times.
    betas: optionally the per-position acceptance of the target's outputs
      that alpha averages (`AlphaStats.betas`), one array per input in order:
      then the record also holds
      the tokens per call and the speedup predicted at them
      (`theory.positional_walltime_improvement`), which at temperature 0,
      on the same inputs, are exactly the loop's tokens per call.

  Returns:
    A flat record: alpha as given and as the loop accepted its drafts
    (`alpha_from_histogram`), speedups (measured, per generated token:
    sampled, the two decoders draw outputs of different lengths, and a ratio
    of total times would credit either with the tokens it happened not to
    draw; eq. (5) with the measured r(gamma + 1) and c_first; the same at
    the lengths of the speculative outputs,
    `theory.finite_walltime_improvement`; the paper's eq. (5) with r = 1 and c
    alone), tokens per call (measured, eq. (1), at the outputs' lengths,
    `output_lengths`), the fraction of outputs identical to the baseline's,
    milliseconds per baseline token and per speculative iteration, split into
    draft steps, verify pass, the per-input fixed cost (`Decoded.fixed_s`)
    spread over the iterations, and the rest (the loop's own work: sampling,
    the accept test, cache bookkeeping), and the speedup of the loops alone
    (fixed costs removed), which is what eq. (5) predicts. The parts were
    timed minutes before the loops, and these machines drift: `slowdown` is
    the baseline's ms per iteration (fixed cost removed) over the target step
    as timed, and `scaled_other_ms` the rest with the parts scaled by it.
    Where `times` holds this gamma's whole iteration (`StepTimes.iteration_s`),
    also `iteration_cost` (in target steps) and the predictions with it in
    place of the summed parts: `predicted_iteration_speedup` (eq. (1)) and,
    with betas, `predicted_positional_iteration_speedup`. Where `times` holds
    the models' starts at every input's length (`StepTimes.target_start_s`),
    the whole decodes' speedup predicted from them and the loops' parts,
    `decode_speedup` (at each position's beta where betas are given, else at
    alpha and the outputs' lengths): `predicted_decode_speedup`, and
    `predicted_decode_iteration_speedup` with i(gamma).

  Raises:
    ValueError: either decoder generated no tokens, or betas for another
      number of inputs.
  """
  if not baseline.generated or not speculative.generated:
    raise ValueError(f'no tokens to time: {baseline.generated} baseline, '
                     f'{speculative.generated} speculative')
  if betas is not None and len(betas) != len(speculative.seconds):
    raise ValueError(f'betas must hold one array per input: {len(betas)} for '
                     f'{len(speculative.seconds)} inputs')
  iterations = int(np.sum(speculative.iterations))
  iteration_ms = 1e3 * speculative.total_s / iterations
  n = len(speculative.seconds)
  baseline_fixed_s, speculative_fixed_s = baseline.fixed_s(), speculative.fixed_s()
  fixed_ms = 1e3 * speculative_fixed_s * n / iterations
  length_ratio = speculative.generated / baseline.generated  # 1 when greedy
  loop_speedup = length_ratio * ((baseline.total_s - n * baseline_fixed_s)
                                 / (speculative.total_s - n * speculative_fixed_s))
  # One first draft step per iteration, the other draft calls in a run.
  draft_calls = int(np.sum(speculative.draft_calls))
  draft_ms = 1e3 * (times.draft_first_s * min(iterations, draft_calls)
                    + times.draft_s * max(draft_calls - iterations, 0)) / iterations
  verify_ms = 1e3 * float(times.verify_s[gamma])
  token_ms = 1e3 * baseline.total_s / int(np.sum(baseline.iterations))
  # The baseline loop is a target step and little else: its iteration over the separately
  # timed step is how much slower the machine ran here.
  baseline_iteration_ms = (1e3 * (baseline.total_s - n * baseline_fixed_s)
                           / int(np.sum(baseline.iterations)))
  slowdown = baseline_iteration_ms / (1e3 * times.target_s)
  lengths = np.asarray([len(t) for t in speculative.tokens])
  predictions = {}
  if betas is not None:
    tokens, calls = [len(b) for b in betas], [theory.expected_calls_along(b, gamma) for b in betas]
    predictions = dict(
        positional_tokens_per_call=sum(tokens) / sum(calls),
        predicted_positional_speedup=theory.positional_walltime_improvement(
            betas, gamma, times.c, times.r, times.c_first))
  else:
    tokens, calls = lengths, theory.expected_calls(alpha, gamma, lengths)
  cost = times.iteration_cost(gamma)
  starts = _starts_per_input(speculative, times)
  if starts is not None:  # whole decodes: each input's start, then its iterations
    fixed = [np.asarray(seconds) / times.target_s for seconds in starts]  # in target steps
    predictions['predicted_decode_speedup'] = decode_speedup(
        tokens, calls, theory.summed_iteration_cost(gamma, times.c, times.r, times.c_first),
        *fixed)
    if cost is not None:
      predictions['predicted_decode_iteration_speedup'] = decode_speedup(tokens, calls, cost,
                                                                         *fixed)
  if cost is not None:  # the iteration's model calls timed whole, in one loop
    predictions.update(iteration_cost=cost, predicted_iteration_speedup=float(
        theory.walltime_improvement(alpha, gamma, times.c, iteration_cost=cost)))
    if betas is not None:
      predictions['predicted_positional_iteration_speedup'] = (
          theory.positional_walltime_improvement(betas, gamma, times.c, iteration_cost=cost))
  return dict(
      gamma=gamma, alpha=alpha, c=times.c, c_first=times.c_first, r=float(times.r[gamma]),
      measured_speedup=length_ratio * baseline.total_s / speculative.total_s,
      loop_speedup=loop_speedup, baseline_fixed_ms=1e3 * baseline_fixed_s,
      speculative_fixed_ms=1e3 * speculative_fixed_s,
      predicted_speedup=float(theory.walltime_improvement(alpha, gamma, times.c, times.r,
                                                          times.c_first)),
      predicted_speedup_eq5=float(theory.walltime_improvement(alpha, gamma, times.c)),
      predicted_finite_speedup=float(theory.finite_walltime_improvement(
          alpha, gamma, times.c, lengths, times.r, times.c_first)),
      tokens_per_call=speculative.tokens_per_call,
      expected_tokens_per_call=float(theory.expected_tokens(alpha, gamma)),
      finite_tokens_per_call=float(theory.finite_tokens_per_call(alpha, gamma, lengths)),
      loop_alpha=alpha_from_histogram(speculative.accept_histogram),
      identical=float(np.mean([b == s for b, s in zip(baseline.tokens, speculative.tokens)])),
      baseline_s=baseline.total_s, speculative_s=speculative.total_s,
      baseline_token_ms=token_ms, target_step_ms=1e3 * times.target_s,
      iteration_ms=iteration_ms, draft_ms=draft_ms, verify_ms=verify_ms, fixed_ms=fixed_ms,
      other_ms=iteration_ms - draft_ms - verify_ms - fixed_ms,
      baseline_iteration_ms=baseline_iteration_ms, slowdown=slowdown,
      scaled_other_ms=iteration_ms - slowdown * (draft_ms + verify_ms) - fixed_ms,
      accept_histogram=speculative.accept_histogram.tolist(),
      output_lengths=lengths.tolist(), **predictions)
