"""c, c_first and r(K): model calls timed inside compiled loops.

Seconds per call of each model's step function inside a compiled
`lax.fori_loop` at batch 1, over a real cache, compile and warm-up excluded,
median over repeats (Section 3.3 and `theory.walltime_improvement`):

  c = draft step (K = 1) / target step (K = 1)
  c_first = the first draft step after a target call / target step
  r(K) = target call over K positions / target step (K = 1)
  i(gamma) = a whole iteration's model calls (gamma draft steps, then the
      verify call over gamma + 1 positions) in one loop / target step

and what every input pays once, whatever its output: each model's `start`
(encoder pass, cross-attention keys and values, a fresh cache), the target's
alone and both models' in one program, per encoder input length.

r(K) is used as the non-decreasing fit of the measured times
(`timing.nondecreasing_fit`): a call over more positions never costs less.
"""

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode.harness import loading
from spec_decode.harness import progress as progress_lib
from spec_decode.harness import timing
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.models import protocol


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds per model call inside a compiled loop (batch 1, compile excluded).

  Attributes:
    draft_s: one draft step (K = 1) in a run of draft steps (a loop of draft
      steps alone): the cost of draft steps 2 .. gamma of an iteration.
    draft_first_s: the first draft step after a target call (over two
      positions, as decoding's): what it adds to a loop of target steps
      (timed paired, see `StepCostRounds`). On a CPU it exceeds `draft_s` by
      the DRAM traffic of re-reading the draft weights that the target call
      evicted from the cache.
    verify_measured_s: [k_max] one target call over K = 1 .. k_max
      positions, as timed.
    iteration_s: gamma -> one whole iteration's model calls (gamma draft
      steps, then the verify call over gamma + 1 positions) timed in one
      loop, where each model evicts the other's weights as in decoding; empty
      unless timed (`StepCostRounds.add_iterations`).
    target_start_s: S -> the target's `start` over an input of S tokens, one
      compiled call (`start_program`): the baseline's per-input fixed cost;
      empty unless timed (`StepCostRounds.add_starts`).
    both_start_s: S -> both models' `start` in one compiled call, as
      speculative decoding runs them: its per-input fixed cost.
  """

  draft_s: float
  draft_first_s: float
  verify_measured_s: np.ndarray
  iteration_s: dict[int, float] = dataclasses.field(default_factory=dict)
  target_start_s: dict[int, float] = dataclasses.field(default_factory=dict)
  both_start_s: dict[int, float] = dataclasses.field(default_factory=dict)

  @property
  def verify_s(self) -> np.ndarray:
    """[k_max] the verify times as used: the non-decreasing fit of the measured ones."""
    return timing.nondecreasing_fit(self.verify_measured_s)

  @property
  def target_s(self) -> float:
    """One target step (K = 1)."""
    return float(self.verify_s[0])

  @property
  def c(self) -> float:
    """The paper's c: a draft step over a target step."""
    return self.draft_s / self.target_s

  @property
  def c_first(self) -> float:
    """The first draft step of an iteration over a target step."""
    return self.draft_first_s / self.target_s

  @property
  def r(self) -> np.ndarray:
    """[k_max] r(K) = verify_s[K - 1] / target_s, theory's `verify_cost`."""
    return self.verify_s / self.target_s

  def iteration_cost(self, gamma: int) -> float | None:
    """i(gamma): a whole iteration's model calls in target steps (None if not timed)."""
    seconds = self.iteration_s.get(gamma)
    return None if seconds is None else seconds / self.target_s

  def row(self) -> dict:
    return dict(target_step_ms=1e3 * self.target_s, draft_step_ms=1e3 * self.draft_s, c=self.c,
                draft_first_ms=1e3 * self.draft_first_s, c_first=self.c_first,
                verify_ms=(1e3 * self.verify_s).tolist(), r=self.r.tolist(),
                verify_measured_ms=(1e3 * np.asarray(self.verify_measured_s)).tolist(),
                iteration_cost={str(g): self.iteration_cost(g) for g in sorted(self.iteration_s)},
                **({'target_start_ms': {str(n): 1e3 * t for n, t in self.target_start_s.items()},
                    'both_start_ms': {str(n): 1e3 * t for n, t in self.both_start_s.items()}}
                   if self.target_start_s else {}))



@functools.partial(jax.jit, static_argnames=('capacity',))
def start_program(models_: tuple, encoder_input_tokens: jax.Array, capacity: int) -> tuple:
  """Each model's `start` in one compiled program: encoder pass, cross K/V, fresh cache.

  Args:
    models_: the models started together (the target; or the target and the
      draft, as speculative decoding starts them).
    encoder_input_tokens: [B, S] int32.
    capacity: the caches' positions.

  Returns:
    The models' fresh caches.
  """
  batch = protocol.Batch.of(models_[0], encoder_input_tokens)
  return tuple(model.start(batch, capacity)[1] for model in models_)


@functools.partial(jax.jit, static_argnames=('capacity',))
def _fresh_cache(model: loading.Draft, encoder_input_tokens: jax.Array, capacity: int):
  return model.start(protocol.Batch.of(model, encoder_input_tokens), capacity)[1]


@functools.partial(jax.jit, static_argnames=('k', 'num_steps'))
def _step_loop(model: loading.Draft, encoder_input_tokens: jax.Array, cache: cache_lib.Cache, *,
               k: int, num_steps: int) -> jax.Array:
  """num_steps calls over K positions, each fed the argmaxes of the last (serial)."""
  # XLA drops the unused encoder.
  step_fn, _ = model.start(protocol.Batch.of(model, encoder_input_tokens), cache.capacity)
  position = cache.index

  def body(_, carry):
    tokens, cache = carry
    logits, cache = step_fn(tokens, cache)
    return sampling_lib.argmax(logits).astype(jnp.int32), cache_lib.rewind(cache, position)

  tokens = jnp.full((cache.batch_size, k), loading.EOS_ID + 1, jnp.int32)
  return jax.lax.fori_loop(0, num_steps, body, (tokens, cache))[0]


@functools.partial(jax.jit, static_argnames=('gamma', 'verify_k', 'parts', 'num_steps'))
def _iteration_loop(target: models.T5Model, draft: loading.Draft, encoder_input_tokens: jax.Array,
                    caches: tuple[cache_lib.Cache, cache_lib.Cache], *, gamma: int,
                    verify_k: int, parts: tuple[str, ...], num_steps: int) -> jax.Array:
  """num_steps iterations of `parts`, each fed the argmaxes of the last.

  'drafts': gamma draft steps, the first over two positions as decoding's
  (`draft_phase.first_call`); 'verify': one target call over the last verify_k
  of [last token, x_1..x_gamma] (gamma + 1: a verify call; 1 after one draft
  step: the (draft step, target step) pair that times c_first).
  """
  (target_cache, draft_cache) = caches
  batch = protocol.Batch.of(target, encoder_input_tokens)
  target_step, _ = target.start(batch, target_cache.capacity)
  draft_step, _ = draft.start(batch, draft_cache.capacity)
  position = target_cache.index

  def body(_, carry):
    token, target_cache, draft_cache = carry
    tokens = [token]
    for i in range(gamma):
      if 'drafts' in parts and i == 0:
        logits, draft_cache = draft_step(jnp.stack([token, token], axis=1),
                                         cache_lib.rewind(draft_cache, position - 1))
        tokens.append(sampling_lib.argmax(logits[:, 1]).astype(jnp.int32))
      elif 'drafts' in parts:
        logits, draft_cache = draft_step(tokens[-1][:, None], draft_cache)
        tokens.append(sampling_lib.argmax(logits[:, 0]).astype(jnp.int32))
      else:
        tokens.append(token)
    if 'verify' in parts:
      logits, target_cache = target_step(jnp.stack(tokens[-verify_k:], axis=1), target_cache)
      token = sampling_lib.argmax(logits[:, -1]).astype(jnp.int32)
    else:
      token = tokens[-1]
    return (token, cache_lib.rewind(target_cache, position),
            cache_lib.rewind(draft_cache, position))

  token = jnp.full((target_cache.batch_size,), loading.EOS_ID + 1, jnp.int32)
  return jax.lax.fori_loop(0, num_steps, body, (token, target_cache, draft_cache))[0]


def _fresh_caches(models_: Sequence, encoder_input_tokens: jax.Array, capacity: int,
                  position: int) -> list[cache_lib.Cache]:
  """Each model's fresh cache, rewound to write at `position`."""
  return [cache_lib.rewind(c, jnp.full_like(c.index, position))
          for c in (_fresh_cache(m, encoder_input_tokens, capacity) for m in models_)]



def step_time(model: loading.Draft, encoder_input_tokens: jax.Array, *, k: int = 1, capacity: int,
              position: int, num_steps: int = 64, repeats: int = 5) -> float:
  """Seconds per call of a model's step function over K positions.

  Args:
    model: a T5Model or a draft provider.
    encoder_input_tokens: [B, S] int32 (batch 1 for the paper's setting).
    k: positions per call.
    capacity: the cache's positions, e.g. decoding.cache_length(...).
    position: the cache index every call writes at (rewound after each);
      position + k <= capacity.
    num_steps: calls per compiled loop.
    repeats: timed runs of the loop; the median is taken.
  """
  return _step_times({'call': (model, k)}, encoder_input_tokens, capacity=capacity,
                     position=position, num_steps=num_steps, repeats=repeats)['call']


def compiled_step_loop(model: loading.Draft, encoder_input_tokens: jax.Array, *, k: int,
                       capacity: int, position: int, num_steps: int) -> Callable[[], jax.Array]:
  """`num_steps` calls of the model over K positions, compiled now, as a run to time.

  JAX's caches are cleared first and the program is compiled ahead of time, so
  it is the model's code as it is at this call that runs, even where an
  identical call was traced before with other code (a trace-time variant:
  jit reuses the first trace it made of a function with the same arguments).

  Args:
    model: a T5Model or a draft provider.
    encoder_input_tokens: [B, S] int32.
    k: positions per call.
    capacity: the cache's positions.
    position: the cache index every call writes at (rewound after each).
    num_steps: calls per run.

  Returns:
    A function that runs the compiled loop once.
  """
  jax.clear_caches()
  encoder_input_tokens = jnp.asarray(encoder_input_tokens)
  cache = _fresh_caches([model], encoder_input_tokens, capacity, position)[0]
  compiled = _step_loop.lower(model, encoder_input_tokens, cache, k=k,
                              num_steps=num_steps).compile()
  return lambda: compiled(model, encoder_input_tokens, cache)


def _step_times(calls: dict, encoder_input_tokens: jax.Array, *, capacity: int, position: int,
                num_steps: int, repeats: int) -> dict:
  """name -> seconds per call, for calls {name: (model, K)} timed round-robin."""
  k_max = max(k for _, k in calls.values())
  if position + k_max > capacity:
    raise ValueError(f'position {position} + k {k_max} exceeds the capacity {capacity}')
  encoder_input_tokens = jnp.asarray(encoder_input_tokens)
  models_ = list({id(model): model for model, _ in calls.values()}.values())
  caches = dict(zip(map(id, models_), _fresh_caches(models_, encoder_input_tokens, capacity,
                                                   position)))
  runs = {name: functools.partial(_step_loop, model, encoder_input_tokens, caches[id(model)],
                                  k=k, num_steps=num_steps)
          for name, (model, k) in calls.items()}
  return {name: float(np.median(seconds)) / num_steps
          for name, seconds in timing.round_robin(runs, repeats).items()}


class StepCostRounds:
  """c, c_first and r(K) timed one round at a time, at mid-output.

  A round times, inside compiled loops, the draft step and the target calls
  over K = 1 .. k_max once each, then a (draft step, target step) loop and a
  target-step loop alone twice, alternating: what a draft step adds to a loop
  of target steps is the median of the pairs' differences (c_first), so that
  drift of a shared machine between runs cancels instead of landing in it.
  Rounds can be spread between other timings (`walltime.time_decoding`'s
  `between`) so that the parts and the loops they predict meet the same machine.
  After `add_iterations(gammas)` a round also times whole iterations (gamma
  draft steps, then the verify call) for those gammas: i(gamma); after
  `add_starts(inputs)` the models' starts at those inputs' lengths.

  Args:
    target: M_p.
    draft: M_q.
    encoder_input_tokens: [1, S] one real input.
    k_max: the largest verify call timed (gamma_max + 1).
    max_decode_len: sets the caches' capacity as decoding does.
    num_steps: calls per compiled loop.
  """

  def __init__(self, target: models.T5Model, draft: loading.Draft,
               encoder_input_tokens: np.ndarray, *, k_max: int, max_decode_len: int,
               num_steps: int = 64):
    capacity = decoding.cache_length(max_decode_len, k_max - 1)
    encoder_input_tokens = jnp.asarray(encoder_input_tokens)
    self._models, self._capacity = (target, draft), capacity
    target_cache, draft_cache = _fresh_caches((target, draft), encoder_input_tokens, capacity,
                                              max_decode_len // 2)
    step = functools.partial(_step_loop, encoder_input_tokens=encoder_input_tokens,
                             num_steps=num_steps)
    self._iteration = functools.partial(_iteration_loop, target, draft, encoder_input_tokens,
                                        (target_cache, draft_cache), parts=('drafts', 'verify'),
                                        num_steps=num_steps)
    self._runs = {
        'draft': lambda: step(draft, cache=draft_cache, k=1),
        **{k: functools.partial(step, target, cache=target_cache, k=k)
           for k in range(1, k_max + 1)},
        'pair': lambda: _iteration_loop(target, draft, encoder_input_tokens,
                                        (target_cache, draft_cache), gamma=1, verify_k=1,
                                        parts=('drafts', 'verify'), num_steps=num_steps),
        'alone': lambda: step(target, cache=target_cache, k=1)}
    self._k_max, self._num_steps = k_max, num_steps
    jax.block_until_ready([run() for run in self._runs.values()])  # compile and warm up
    self.clear()

  def add_iterations(self, gammas: Sequence[int]) -> None:
    """From now on a round also times whole iterations of each gamma (compiled here).

    Raises:
      ValueError: a gamma outside 1 .. k_max - 1.
    """
    for gamma in gammas:
      if not 1 <= gamma < self._k_max:
        raise ValueError(f'gamma must be in 1..{self._k_max - 1} (k_max - 1), got {gamma}')
      self._runs[('iteration', gamma)] = run = functools.partial(
          self._iteration, gamma=gamma, verify_k=gamma + 1)
      jax.block_until_ready(run())
      self._seconds[('iteration', gamma)] = []

  def add_starts(self, inputs: Sequence[np.ndarray]) -> None:
    """From now on a round also times the starts at each length among `inputs` (compiled here).

    Per encoder input length S, the first input of that length is started by
    the target alone and by both models in one program (`start_program`, at the
    rounds' cache capacity).

    Args:
      inputs: [1, S] int32 encoder inputs, e.g. each input cut to its bucket.
    """
    for x in inputs:
      length = int(np.shape(x)[1])
      if ('target start', length) in self._runs:
        continue
      x = jnp.asarray(x)
      for name, models_ in (('target start', self._models[:1]), ('both start', self._models)):
        self._runs[name, length] = run = functools.partial(start_program, models_, x,
                                                           self._capacity)
        jax.block_until_ready(run())
        self._seconds[name, length] = []

  def clear(self) -> None:
    """Forgets the rounds timed so far."""
    self._seconds = {name: [] for name in self._runs}

  def timed(self, repeats: int, progress: bool = False) -> StepTimes:
    """Forgets earlier rounds, times `repeats` rounds in a row and returns their times."""
    self.clear()
    for _ in progress_lib.bar(range(repeats), desc='step costs', disable=not progress):
      self.round()
    return self.times()

  def round(self) -> None:
    """Times one round (see the class docstring)."""
    for name in [*self._runs, 'pair', 'alone']:
      self._seconds[name].append(timing.median_time(self._runs[name], 1)[0])

  def times(self) -> StepTimes:
    """The median of every round timed since the last `clear`."""
    if not self._seconds['draft']:
      raise ValueError('no round timed yet: call round() first')
    per_call = lambda name: float(np.median(self._seconds[name])) / self._num_steps
    first = np.subtract(self._seconds['pair'], self._seconds['alone'])
    timed = lambda kind: {name[1]: name for name in self._runs
                          if isinstance(name, tuple) and name[0] == kind and self._seconds[name]}
    return StepTimes(
        draft_s=per_call('draft'),
        draft_first_s=max(float(np.median(first)), 0.0) / self._num_steps,
        verify_measured_s=np.asarray([per_call(k) for k in range(1, self._k_max + 1)]),
        iteration_s={g: per_call(name) for g, name in timed('iteration').items()},
        target_start_s={n: float(np.median(self._seconds[name]))
                        for n, name in timed('target start').items()},
        both_start_s={n: float(np.median(self._seconds[name]))
                      for n, name in timed('both start').items()})


def measure_step_times(target: models.T5Model, draft: loading.Draft,
                       encoder_input_tokens: np.ndarray, *, k_max: int, max_decode_len: int,
                       num_steps: int = 64, repeats: int = 5,
                       progress: bool = False) -> StepTimes:
  """c, c_first and r(K) for K = 1 .. k_max: `repeats` rounds of `StepCostRounds` in a row.

  Args:
    target: M_p.
    draft: M_q.
    encoder_input_tokens: [1, S] one real input.
    k_max: the largest verify call timed.
    max_decode_len: sets the caches' capacity as decoding does.
    num_steps: calls per compiled loop.
    repeats: timed rounds.
    progress: show a progress bar.
  """
  return StepCostRounds(target, draft, encoder_input_tokens, k_max=k_max,
                        max_decode_len=max_decode_len, num_steps=num_steps).timed(repeats,
                                                                                 progress)
