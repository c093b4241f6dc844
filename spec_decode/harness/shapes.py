"""Loop costs of any T5 1.1 pair with random weights: the walltime an alpha would give.

The decoding loops have static shapes, so an iteration costs the same whatever
is accepted. With random weights (no checkpoint needed) this module measures,
compile excluded, median of interleaved repeats, each output decoded to full
length (no EOS can end it):

  baseline      seconds per token of the target alone
  speculative   seconds per iteration for each gamma: gamma draft steps, one
                verify call over gamma + 1 positions, the accept test and the
                loop's bookkeeping
  parts         c, c_first and r(K) (`step_costs.measure_step_times`), each
                model's `start` (encoder pass, cross K/V, fresh cache), the
                compile time of every loop, peak memory

and predicts, for an acceptance rate alpha given as an input,

  speedup(alpha, gamma) = E[tokens](alpha, gamma) * baseline token / iteration(gamma)

with eq. (1)'s expectation (an iteration's draft calls do not depend on what
was accepted: drafting.first_call). The per-input fixed cost (the `start` of
each model) is reported beside, not in the loop speedup.
"""

import dataclasses
import functools
import resource
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import data
from spec_decode import decoding
from spec_decode.harness import loading
from spec_decode.harness import progress as progress_lib
from spec_decode.harness import step_costs
from spec_decode import models
from spec_decode import sharding
from spec_decode.t5.config import T5Config
from spec_decode import theory

NO_EOS = -1  # an eos_id no token equals
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
# compute dtype, parameter dtype
DTYPES = {'float32': ('float32', 'float32'), 'bfloat16': ('bfloat16', 'bfloat16'),
          'bf16_weights': ('float32', 'bfloat16')}
# The paper's Table 2 (T5-XXL target, one TPU v4): task, draft, temperature, gamma, alpha, speedup.
PAPER_TABLE2 = tuple(tuple(row) for row in data.manifest('paper_table2')['rows'])


@dataclasses.dataclass(frozen=True)
class ShapeSettings:
  """What `measure_shapes` builds and times.

  Attributes:
    target: M_p, a `t5_1_1` size ('xxl', 'base', ...), a bundled model's ('demo_target') or a JSON
      file of T5Config fields (see `loading.parse_config`).
    draft: M_q, the same kinds.
    dtype: one of DTYPES: 'float32', 'bfloat16', or 'bf16_weights' (bfloat16
      parameters, float32 compute).
    draft_dtype: the draft's, one of DTYPES; None: `dtype`. Any q keeps the
      output exact: e.g. a float32 target with a 'bf16_weights' draft, whose
      steps read half the bytes on a CPU (bfloat16 panels, spec_decode.kernels).
    batch_size: rows decoded together.
    input_len: S, encoder input tokens per row.
    max_decode_len: tokens every decode produces.
    gammas: draft lengths timed.
    block_gammas: draft lengths also timed with block verification: its cost
      per iteration is measured; its tokens per call need real p and q, so
      the speedup tables are token verification's.
    alphas: acceptance rates the speedup tables are given at.
    repeats: timed runs per loop (interleaved); the median is kept.
    num_steps: model calls per compiled loop when timing c and r(K).
    vocab_size: vocabulary of a size name (T5's 32128).
    model_parallel: devices per model replica; 1 keeps every array on the
      first device, more lays both models over a (data, model) mesh.
    seed: weights and inputs.
  """

  target: str = 'xxl'
  draft: str = 'small'
  dtype: str = 'bfloat16'
  draft_dtype: str | None = None
  batch_size: int = 1
  input_len: int = 64
  max_decode_len: int = 32
  gammas: tuple[int, ...] = tuple(range(1, 9))
  block_gammas: tuple[int, ...] = ()
  alphas: tuple[float, ...] = ALPHAS
  repeats: int = 3
  num_steps: int = 16
  vocab_size: int = 32128
  model_parallel: int = 1
  seed: int = 0

  def __post_init__(self):
    for name in ('dtype', 'draft_dtype'):
      value = getattr(self, name)
      if value not in DTYPES and (name == 'dtype' or value is not None):
        raise ValueError(f'{name} {value!r}: expected one of {sorted(DTYPES)}')
    for name in ('batch_size', 'input_len', 'max_decode_len', 'repeats', 'num_steps',
                 'model_parallel'):
      decoding.check_size(name, getattr(self, name))
    if not self.gammas or any(int(g) != g or g < 1 for g in self.gammas):
      raise ValueError(f'gammas must be integers >= 1, got {self.gammas}')
    if any(g not in self.gammas for g in self.block_gammas):
      raise ValueError(f'block_gammas {self.block_gammas} must be among gammas {self.gammas}')
    theory.expected_tokens(np.asarray(self.alphas), 1)  # alphas in [0, 1]


def model_config(spec: str, settings: ShapeSettings, dtype: str | None = None) -> T5Config:
  """The T5Config of `spec` in `dtype` (a key of DTYPES; None: the settings' dtype)."""
  compute, params = DTYPES[dtype or settings.dtype]
  config = loading.parse_config(spec, settings.vocab_size)
  return dataclasses.replace(config, dtype=compute, param_dtype=params)


def random_model(config: T5Config, rng: jax.Array, mesh=None, rules=None) -> models.T5Model:
  """Random parameters of the right shapes and dtypes, created where they will live.

  Kernels and embeddings are normal with std 1/sqrt(first dimension), 1-D
  scales are ones: the values do not change what a call costs, and filling
  each array by its own small jit skips compiling the network's `init` (which
  at XXL's size costs more than a loop). On a mesh each array is created on
  its shards.
  """
  abstract = jax.eval_shape(functools.partial(models.T5Model.random, config), rng).params
  leaves, treedef = jax.tree.flatten(abstract)
  if mesh is None:
    placements = [None] * len(leaves)
  else:
    rules = sharding.check_rules(rules)
    placements = jax.tree.leaves(sharding.param_shardings(abstract, mesh, rules))
  keys = jax.random.split(rng, len(leaves))
  params = jax.tree.unflatten(treedef, [
      _random_array(x.shape, x.dtype, placement)(key)
      for x, placement, key in zip(leaves, placements, keys)])
  if mesh is None:
    return models.T5Model(config, params).with_panels()
  return sharding.ShardedT5Model(config, params, mesh, rules)


@functools.cache
def _random_array(shape: tuple[int, ...], dtype, placement) -> Callable[[jax.Array], jax.Array]:
  """A jitted key -> array of `shape` (one compile per shape, dtype and placement)."""
  def make(key):
    if len(shape) == 1:
      return jnp.ones(shape, dtype)
    return (jax.random.normal(key, shape, jnp.float32) * shape[0]**-0.5).astype(dtype)
  return jax.jit(make, out_shardings=placement)


def peak_memory() -> tuple[float, str]:
  """(GiB, what): the first device's peak bytes in use, or this process's peak RSS (CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return stats['peak_bytes_in_use'] / 2**30, 'peak device memory'
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 'peak process RSS'


def _timed_first(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def measure_shapes(settings: ShapeSettings, progress: bool = True) -> dict:
  """Builds both models with random weights and times every loop (see the module doc).

  Returns:
    A JSON-able record: settings, devices, parameter counts, step times (c,
    c_first, r(K)), start seconds, per-loop compile and iteration seconds,
    the speedup table [gamma][alpha] and the best gamma per alpha (from whole
    iterations and from the parts), and peak memory.
  """
  rng = jax.random.key(settings.seed)
  mesh = (sharding.make_mesh(settings.model_parallel) if settings.model_parallel > 1 else None)
  target_config = model_config(settings.target, settings)
  draft_config = model_config(settings.draft, settings, settings.draft_dtype)
  built = time.perf_counter()
  target = random_model(target_config, jax.random.fold_in(rng, 1), mesh, sharding.STANDARD_RULES)
  draft = random_model(draft_config, jax.random.fold_in(rng, 2), mesh,
                       sharding.DATA_PARALLEL_RULES)
  jax.block_until_ready((target.params, draft.params))
  built = time.perf_counter() - built
  if progress:
    print(f'random weights built in {built:.1f} s', flush=True)
  inputs = np.asarray(jax.random.randint(jax.random.fold_in(rng, 3),
                                         (settings.batch_size, settings.input_len), 2,
                                         settings.vocab_size), np.int32)
  keys = jax.random.split(jax.random.fold_in(rng, 4), settings.batch_size)
  length = settings.max_decode_len
  generate = models.generate if mesh is None else sharding.generate
  speculate = models.speculative_generate if mesh is None else sharding.speculative_generate
  loops = {'baseline': lambda: generate(target, inputs, keys, max_decode_len=length,
                                        eos_id=NO_EOS)}
  for gamma, verification in [(g, 'token') for g in settings.gammas] + [
      (g, 'block') for g in settings.block_gammas]:
    name = f'gamma {gamma}' + (' block' if verification == 'block' else '')
    loops[name] = (lambda g, v: lambda: speculate(
        target, draft, inputs, keys, gamma=g, max_decode_len=length, verification=v,
        eos_id=NO_EOS))(gamma, verification)

  compile_s, outputs = {}, {}
  for name, run in progress_lib.bar(loops.items(), desc='compile', disable=not progress):
    first = _timed_first(run)
    outputs[name] = jax.device_get(run())
    compile_s[name] = first - _timed_first(run)
    if progress:  # a run cut short still shows what compiling cost
      print(f'{name}: compiled in {compile_s[name]:.1f} s', flush=True)
  runs = {name: [] for name in loops}
  for _ in progress_lib.bar(range(settings.repeats), desc='loops', disable=not progress):
    for name, run in loops.items():  # interleaved: drift lands on every loop alike
      runs[name].append(_timed_first(run))
  capacity = decoding.cache_length(length, max(settings.gammas))
  start_s = {name: _start_seconds(model, inputs, capacity, settings.repeats)
             for name, model in (('target', target), ('draft', draft))}
  steps_start = time.perf_counter()
  times = step_costs.measure_step_times(
      target, draft, inputs, k_max=max(settings.gammas) + 1, max_decode_len=length,
      num_steps=settings.num_steps, repeats=settings.repeats, progress=progress)
  if progress:
    print(f'step costs (compiles included): {time.perf_counter() - steps_start:.1f} s',
          flush=True)

  loop_rows = []
  for name, seconds in runs.items():
    out = outputs[name]
    starts = start_s['target'] + (0.0 if name == 'baseline' else start_s['draft'])
    iterations = int(out.loop_target_calls)
    loop_rows.append(dict(
        loop=name, gamma=0 if name == 'baseline' else int(name.split()[1]),
        verification='block' if name.endswith('block') else 'token',
        compile_s=compile_s[name], seconds=float(np.median(seconds)), iterations=iterations,
        iteration_ms=1e3 * max(float(np.median(seconds)) - starts, 0.0) / iterations))
  memory, memory_kind = peak_memory()
  result = dict(
      settings=dataclasses.asdict(settings), devices=[str(d) for d in jax.devices()],
      device_kind=jax.devices()[0].device_kind, platform=jax.devices()[0].platform,
      jax_version=jax.__version__, build_s=built,
      params=dict(target=_count(target.params), draft=_count(draft.params)),
      steps=times.row(), start_ms={k: 1e3 * v for k, v in start_s.items()}, loops=loop_rows,
      peak_memory_gib=memory, peak_memory_kind=memory_kind)
  result.update(speedups(result))
  return result


def _start_seconds(model, inputs: np.ndarray, capacity: int, repeats: int) -> float:
  """Median seconds of one model's `start` over the batch (compiled once)."""
  start = jax.jit(lambda m, x: m.start(x, capacity)[1])
  x = jnp.asarray(inputs)
  jax.block_until_ready(start(model, x))
  return float(np.median([_timed_first(lambda: start(model, x)) for _ in range(2 * repeats + 1)]))


def _count(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def speedups(result: dict) -> dict:
  """The speedup tables of a `measure_shapes` record (recomputable from its JSON).

  Returns:
    table: [{gamma, alpha -> speedup from whole iterations}], best: [{alpha,
    gamma and speedup from whole iterations, and from the parts (eq. (5)
    with c, c_first, r(K))}], paper: the paper's Table 2 rows beside this
    run's prediction at their alpha and gamma.
  """
  settings, steps = result['settings'], result['steps']
  loops = {row['gamma']: row for row in result['loops']
           if row.get('verification', 'token') == 'token'}
  token_ms = loops.pop(0)['iteration_ms']
  r = np.asarray(steps['r'])

  def from_iterations(alpha: float, gamma: int) -> float:
    return float(theory.expected_tokens(alpha, gamma) * token_ms / loops[gamma]['iteration_ms'])

  def from_parts(alpha: float, gamma: int) -> float:
    return float(theory.walltime_improvement(alpha, gamma, steps['c'], r, steps['c_first']))

  table = [dict(gamma=g, **{f'{a:g}': from_iterations(a, g) for a in settings['alphas']})
           for g in sorted(loops)]
  best = []
  for alpha in settings['alphas']:
    by_iterations = max(loops, key=lambda g: from_iterations(alpha, g))
    by_parts = max(loops, key=lambda g: from_parts(alpha, g))
    best.append(dict(alpha=alpha, gamma=by_iterations,
                     speedup=from_iterations(alpha, by_iterations), parts_gamma=by_parts,
                     parts_speedup=from_parts(alpha, by_parts)))
  pair = (settings['target'] == 'xxl', settings['draft'])
  paper = [dict(task=task, draft=f'T5-{draft}', temperature=temperature, gamma=gamma,
                alpha=alpha, paper_speedup=speedup,
                this_pair=pair == (True, draft),
                predicted=from_iterations(alpha, gamma) if gamma in loops else None)
           for task, draft, temperature, gamma, alpha, speedup in PAPER_TABLE2]
  return dict(table=table, best=best, paper=paper)
