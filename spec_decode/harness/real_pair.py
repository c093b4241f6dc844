"""Walltime of a real decoder-only pair at batch 1: costs, alpha, ours and peers, one run.

`run_pair` times, for each prompt in turn, our baseline and our speculative
decoding at each temperature (and, where given, peers: transformers' greedy
and assisted generation) back to back, so that a shared machine's drift
moves all of them alike. Before and after the prompts it times the step
costs of eq. (5) (`step_ms`: the target's step, r(K), the draft's c); alpha
is measured on the baseline's own outputs (`alpha_lib.measure_alpha`);
gamma is eq. (5)'s best at the first costs and a quick alpha. A second
prediction times the loops whole (`loop_costs`): one speculative iteration
in baseline tokens, in place of eq. (5)'s sum of parts.

  rows, costs = run_pair(target, draft, prompts, lengths, settings)
"""

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import sampling as sampling_lib
from spec_decode import theory
from spec_decode.harness import loop_costs as loop_costs_lib
from spec_decode.harness import progress
from spec_decode.harness import timing
from spec_decode.harness import walltime
from spec_decode.models import alpha as alpha_lib
from spec_decode.models import front_ends
from spec_decode.models import protocol


@dataclasses.dataclass(frozen=True)
class PairSettings:
  """What `run_pair` measures.

  Attributes:
    max_new_tokens: tokens per prompt at most (EOS stops a row earlier).
    temperatures: 0 (greedy) and/or 1 (plain sampling).
    gamma_max: gammas 1..gamma_max are weighed by eq. (5).
    gamma: a fixed gamma, or 0: eq. (5)'s best.
    seed: the PRNG seed of sampling (prompt i uses seed + i).
  """

  max_new_tokens: int = 128
  temperatures: tuple[float, ...] = (0.0, 1.0)
  gamma_max: int = 8
  gamma: int = 0
  seed: int = 0


@functools.partial(jax.jit, static_argnames=('k', 'n', 'capacity'))
def _steps(models: tuple[Any, Any], batch: protocol.Batch, *, k: int, n: int, capacity: int):
  """n steps of models[0] over k positions each, started on `batch` (models[1]: its target).

  Returns:
    (the cache after the steps, the last step's argmax [1, k] int32).
  """
  model, target = models
  if target is None:
    step_fn, cache = model.start(batch, capacity)
  else:
    step_fn, cache = model.start_pair(target, batch, capacity)[1]

  def body(_, carry):
    cache, tokens = carry
    logits, cache = step_fn(tokens, cache)
    return cache, jnp.broadcast_to(jnp.argmax(logits[:, -1:], -1), tokens.shape).astype(jnp.int32)

  return jax.lax.fori_loop(0, n, body, (cache, jnp.ones((1, k), jnp.int32)))


def step_ms(model: Any, prompt_length: int, k: int, steps: int, repeats: int = 3,
            target: Any = None) -> float:
  """Milliseconds of one step of `model` over k positions behind a prompt.

  Each step feeds the argmax of the last one back (its logits are used, as in
  decoding). Two compiled loops of `steps` and 2 `steps` steps from the same
  start are timed alternately; the step is their difference over `steps`
  (the prefill cancels), the median of `repeats` rounds, floored at 1 us
  (a tiny model's steps drown in noise). `target`: the target a draft over
  its features (models.FeatureDraft) starts with; its step is the draft's in
  that pair. The loops are compiled once per model, prompt length, k and
  steps: timing again (after the prompts) reuses them.
  """
  batch = protocol.Batch.of(model, jnp.ones((1, prompt_length), jnp.int32),
                            jnp.array([prompt_length], jnp.int32))
  loop = functools.partial(_steps, (model, target), batch, k=k, capacity=2 * steps * k + 1)
  jax.block_until_ready((loop(n=steps), loop(n=2 * steps)))
  differences = []
  for _ in range(repeats):
    short, _ = timing.median_time(lambda: loop(n=steps), 1)
    long, _ = timing.median_time(lambda: loop(n=2 * steps), 1)
    differences.append((long - short) / steps)
  return max(float(np.median(differences)) * 1e3, 1e-3)


def costs(target: Any, draft: Any, prompt_length: int, k_max: int) -> dict[str, Any]:
  """The target's step ms, r(1..k_max) (a non-decreasing fit) and the draft's c.

  Both models are timed as the front ends decode them: packed (`with_panels`);
  a draft over the target's features in its pair.
  """
  target, draft = (m.with_panels() if hasattr(m, 'with_panels') else m for m in (target, draft))
  target_ms = [step_ms(target, prompt_length, k, steps=8) for k in range(1, k_max + 1)]
  draft_ms = step_ms(draft, prompt_length, 1, steps=64,
                     target=target if hasattr(draft, 'start_pair') else None)
  r = timing.nondecreasing_fit(np.array(target_ms) / target_ms[0])
  return {'target_ms': target_ms[0], 'r': [float(x) for x in r], 'draft_ms': draft_ms,
          'c': draft_ms / target_ms[0]}


def loop_costs(target: Any, draft: Any, prompt: np.ndarray, gamma: int,
               lengths: tuple[int, ...] = (1, 32, 96), repeats: int = 3
               ) -> dict[str, loop_costs_lib.LoopCost]:
  """The baseline's and speculative decoding's cost lines, the loops timed whole.

  `harness.loop_costs.measure_loop_costs` over `prompt` ([n] ids) decoded
  greedily to exactly L tokens (no EOS) for each L of `lengths`, both
  decoders interleaved: per iteration (a token; gamma draft calls, the verify
  call and the accept step) with all that the parts of eq. (5) leave out (the
  draft's first call after the target's, a feature draft's feed, the loop's
  own work), and the fixed cost per decode (prefill, fresh caches; L = 1
  pins it).

  Returns:
    {'baseline': LoopCost, 'speculative': LoopCost}.
  """
  decoders = {'baseline': loop_costs_lib.baseline(target, None),
              'speculative': loop_costs_lib.speculative(target, draft, gamma, None)}
  return loop_costs_lib.measure_loop_costs(decoders, prompt[None], jax.random.key(0),
                                           lengths=lengths, repeats=repeats)


def alpha_from_tokens(tokens_per_call: float, gamma: int) -> float:
  """The alpha whose expected tokens per iteration (eq. (1)) are `tokens_per_call` (bisection).

  What the loop's acceptance amounted to, beside alpha measured by teacher
  forcing (they differ where acceptance varies with the draft step, as a
  draft over the target's features reads its own estimates from its second
  step on; rows cut by EOS or the length limit lower it a little).
  """
  low, high = 0.0, 1.0
  for _ in range(50):
    mid = (low + high) / 2
    low, high = (mid, high) if theory.expected_tokens(mid, gamma) < tokens_per_call else (low, mid)
  return (low + high) / 2


def _sampling(temperature: float) -> sampling_lib.SamplingParams | None:
  return None if temperature == 0 else sampling_lib.SamplingParams.create(temperature)


def alpha_on(target: Any, draft: Any, prompts: np.ndarray, lengths: np.ndarray,
             outputs: Sequence[np.ndarray], temperature: float) -> alpha_lib.AlphaStats:
  """alpha of `draft` on the target's `outputs` (one [n] array per prompt)."""
  width = max(len(o) for o in outputs)
  tokens = np.zeros((len(outputs), width), np.int32)
  for i, o in enumerate(outputs):
    tokens[i, :len(o)] = o
  return alpha_lib.measure_alpha(target, draft, prompts, tokens,
                                 np.array([len(o) for o in outputs]),
                                 sampling=sampling_lib.SamplingParams.create(temperature),
                                 lengths=lengths, batch_size=4)


def run_pair(target: Any, draft: Any, prompts: np.ndarray, lengths: np.ndarray,
             settings: PairSettings,
             peers: dict[str, Callable[[np.ndarray, int], tuple[float, Any]]] | None = None,
             show: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
  """Times the pair (and greedy peers) prompt by prompt; one row per temperature.

  Args:
    target, draft: decoder-only models (protocol.PROMPT readers).
    prompts: [N, P] int32 prompts, left-aligned; lengths: [N].
    settings: PairSettings.
    peers: name -> fn(prompt ids [n], gamma) -> (seconds, generated ids): run
      at temperature 0 after ours on each prompt.
    show: progress bars.

  Returns:
    rows (one per temperature: gamma, alpha, tokens per call, ms per token of
    each, measured and predicted speedup, greedy identity, peers' ms per
    token and identity) and the costs measured before and after (their
    means predict: eq. (5) with r(gamma + 1)).
  """
  n, peers = prompts.shape[0], peers or {}
  before = costs(target, draft, int(np.median(lengths)), settings.gamma_max + 1)
  rows = []
  for temperature in settings.temperatures:
    sampling = _sampling(temperature)
    base = functools.partial(front_ends.generate, target, max_decode_len=settings.max_new_tokens,
                             sampling=sampling)
    quick = [np.asarray(base(jnp.asarray(prompts[i:i + 1]), settings.seed + i,
                             lengths=jnp.asarray(lengths[i:i + 1])).tokens[0])
             for i in range(min(2, n))]
    quick_alpha = alpha_on(target, draft, prompts[:len(quick)], lengths[:len(quick)],
                           [q for q in quick], temperature).alpha
    gamma = settings.gamma or int(theory.best_gamma(
        quick_alpha, before['c'], settings.gamma_max, verify_cost=np.array(before['r']))[0])
    spec = functools.partial(front_ends.speculative_generate, target, draft, gamma=gamma,
                             max_decode_len=settings.max_new_tokens, sampling=sampling)
    record = {name: [] for name in ('baseline_s', 'speculative_s', 'generated', 'spec_generated',
                                    'target_calls', 'identical')}
    peer_s = {name: [] for name in peers} if temperature == 0 else {}
    peer_tokens = {name: 0 for name in peer_s}
    peer_identical = {name: [] for name in peer_s}
    outputs = []
    for i in progress.bar(range(n), desc=f'T = {temperature:g}', disable=not show):
      x, length = jnp.asarray(prompts[i:i + 1]), jnp.asarray(lengths[i:i + 1])
      if i == 0:  # compile
        jax.block_until_ready((base(x, 0, lengths=length), spec(x, 0, lengths=length)))
      s, b = timing.median_time(lambda: base(x, settings.seed + i, lengths=length), 1)
      s2, sp = timing.median_time(lambda: spec(x, settings.seed + i, lengths=length), 1)
      ours = np.asarray(b.tokens[0, :int(b.lengths[0])])
      outputs.append(ours)
      record['baseline_s'].append(s)
      record['speculative_s'].append(s2)
      record['generated'].append(int(b.generated[0]))
      record['spec_generated'].append(int(sp.generated[0]))
      record['target_calls'].append(int(sp.target_calls[0]))
      record['identical'].append(bool(np.array_equal(ours, np.asarray(
          sp.tokens[0, :int(sp.lengths[0])]))))
      for name, peer in peers.items() if peer_s else ():
        seconds, ids = peer(prompts[i, :lengths[i]], gamma)
        peer_s[name].append(seconds)
        peer_tokens[name] += len(ids)
        peer_identical[name].append(bool(np.array_equal(ours, np.asarray(ids))))
    stats = alpha_on(target, draft, prompts, lengths, outputs, temperature)
    baseline_ms = 1e3 * sum(record['baseline_s']) / sum(record['generated'])
    spec_ms = 1e3 * sum(record['speculative_s']) / sum(record['spec_generated'])
    row = {'temperature': temperature, 'gamma': gamma, 'alpha': stats.alpha,
           'alpha_stderr': stats.stderr, 'prompts': n,
           'tokens': sum(record['generated']),
           'tokens_per_call': sum(record['spec_generated']) / sum(record['target_calls']),
           'baseline_token_ms': baseline_ms, 'speculative_token_ms': spec_ms,
           'measured_speedup': baseline_ms / spec_ms,
           'greedy_identical': (sum(record['identical']) if temperature == 0 else None),
           'per_prompt': record, 'outputs': [o.tolist() for o in outputs]}
    for name in peer_s:
      row[f'{name}_token_ms'] = 1e3 * sum(peer_s[name]) / peer_tokens[name]
      row[f'{name}_identical'] = sum(peer_identical[name])
    rows.append(row)
  after = costs(target, draft, int(np.median(lengths)), settings.gamma_max + 1)
  c = (before['c'] + after['c']) / 2
  r = (np.array(before['r']) + np.array(after['r'])) / 2
  whole, middle = {}, int(np.argsort(lengths)[n // 2])  # the prompt of median length
  for row in rows:
    row['predicted_speedup'] = float(theory.walltime_improvement(row['alpha'], row['gamma'], c,
                                                                 verify_cost=r))
    row['c'], row['r_gamma_plus_1'] = c, float(r[row['gamma']])
    if row['gamma'] not in whole:
      whole[row['gamma']] = loop_costs(target, draft, prompts[middle, :lengths[middle]],
                                       row['gamma'])
    base, spec = whole[row['gamma']]['baseline'], whole[row['gamma']]['speculative']
    row['iteration_cost'] = spec.iteration_s / base.iteration_s  # in baseline tokens
    row['predicted_loops'] = float(theory.walltime_improvement(
        row['alpha'], row['gamma'], c, iteration_cost=row['iteration_cost']))
    generated = np.asarray(row['per_prompt']['generated'])
    fixed = [max(cost.fixed_s, 0.0) / base.iteration_s for cost in (base, spec)]
    row['predicted_whole'] = walltime.decode_speedup(
        generated, theory.expected_calls(row['alpha'], row['gamma'], generated),
        row['iteration_cost'], [fixed[0]] * n, [fixed[1]] * n)
    row['alpha_in_loop'] = alpha_from_tokens(row['tokens_per_call'], row['gamma'])
  loops = {gamma: {name: cost.row() for name, cost in lines.items()}
           for gamma, lines in whole.items()}
  return rows, {'before': before, 'after': after, 'loops': loops}
