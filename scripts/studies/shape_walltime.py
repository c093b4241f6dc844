r"""Loop costs of a T5 1.1 pair at any shapes, random weights; speedups at given alphas.

  python scripts/studies/shape_walltime.py --target base --draft small --dtype float32
  python scripts/studies/shape_walltime.py --target xxl --draft small --dtype bfloat16 --batch_size 8
  python scripts/studies/shape_walltime.py --target base --draft small --dtype float32 --draft_dtype bf16_weights

The decoding loops have static shapes, so an iteration costs the same whatever
is accepted. With random weights (no checkpoint needed), on the devices JAX
sees, this times, compile excluded, median of interleaved repeats, each output
decoded to full length (no EOS can end it):

  baseline      seconds per token of the target alone
  speculative   seconds per iteration for each gamma: gamma draft steps, one
                verify call over gamma + 1 positions, the accept test and the
                loop's bookkeeping
  parts         c, c_first and r(K) (`step_costs.measure_step_times`), each
                model's `start` (encoder pass, cross K/V, fresh cache), the
                compile time of every loop, peak memory

and predicts, for an acceptance rate alpha given as an input (--alphas),

  speedup(alpha, gamma) = E[tokens](alpha, gamma) * baseline token / iteration(gamma)

with eq. (1)'s expectation (an iteration's draft calls do not depend on what
was accepted: draft_phase.first_call). The per-input fixed cost (the `start` of
each model) is reported beside, not in the loop speedup.

Writes report.md, results.json, loops.csv, speedup.csv and two plots to
--out_dir. The report can be rebuilt from results.json alone
(`write_report(out_dir, json.load(...))`); its first line says that alpha is
an input. Without matplotlib (accelerator images) the report keeps its tables.
"""

import argparse
import dataclasses
import functools
import json
import pathlib
import resource
import shlex
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checks
from spec_decode import data
from spec_decode import decoding
from spec_decode import models
from spec_decode import theory
from spec_decode.harness import loading
from spec_decode.harness import progress
from spec_decode.harness import report
from spec_decode.harness import report_plots
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode.models import sharding
from spec_decode.t5.config import T5Config

NO_EOS = -1  # an eos_id no token equals
# compute dtype, parameter dtype
DTYPES = {'float32': ('float32', 'float32'), 'bfloat16': ('bfloat16', 'bfloat16'),
          'bf16_weights': ('float32', 'bfloat16')}
# The paper's Table 2 (T5-XXL target, one TPU v4): task, draft, temperature, gamma, alpha, speedup.
PAPER_TABLE2 = tuple(tuple(row) for row in data.manifest('paper_table2')['rows'])
ALPHA_IS_INPUT = (
    '**Alpha is an input here, not a measurement**: the weights are random, so the speedups '
    'below are eq. (1) at the given alphas over the measured per-iteration costs; every other '
    'figure is measured.')


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
  alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
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
      checks.check_size(name, getattr(self, name))
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
  placements = ([None] * len(leaves) if mesh is None
                else jax.tree.leaves(sharding.param_shardings(abstract, mesh, rules)))
  keys = jax.random.split(rng, len(leaves))
  params = jax.tree.unflatten(treedef, [
      _random_array(x.shape, x.dtype, placement)(key)
      for x, placement, key in zip(leaves, placements, keys)])
  if mesh is None:
    return models.T5Model(config, params).with_panels()
  return sharding.ShardedT5Model(config, params, mesh, sharding.check_rules(rules))


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


def _seconds(run: Callable[[], object]) -> float:
  return timing.median_time(run, 1)[0]


def measure_shapes(settings: ShapeSettings) -> dict:
  """Builds both models with random weights and times every loop (see the module doc).

  Returns:
    A JSON-able record: settings, devices, parameter counts, step times (c,
    c_first, r(K)), start seconds, per-loop compile and iteration seconds,
    the speedup table [gamma][alpha] and the best gamma per alpha (from whole
    iterations and from the parts), and peak memory.
  """
  rng = jax.random.key(settings.seed)
  mesh = (sharding.make_mesh(settings.model_parallel) if settings.model_parallel > 1 else None)
  built = time.perf_counter()
  target = random_model(model_config(settings.target, settings), jax.random.fold_in(rng, 1),
                        mesh, sharding.STANDARD_RULES)
  draft = random_model(model_config(settings.draft, settings, settings.draft_dtype),
                       jax.random.fold_in(rng, 2), mesh, sharding.DATA_PARALLEL_RULES)
  jax.block_until_ready((target.params, draft.params))
  built = time.perf_counter() - built
  print(f'random weights built in {built:.1f} s', flush=True)
  inputs = np.asarray(jax.random.randint(jax.random.fold_in(rng, 3),
                                         (settings.batch_size, settings.input_len), 2,
                                         settings.vocab_size), np.int32)
  keys = jax.random.split(jax.random.fold_in(rng, 4), settings.batch_size)
  length = settings.max_decode_len
  # A sharded model carries its mesh: the same front ends run both layouts.
  loops = {'baseline': functools.partial(models.generate, target, inputs, keys,
                                         max_decode_len=length, eos_id=NO_EOS)}
  for gamma, verification in [(g, 'token') for g in settings.gammas] + [
      (g, 'block') for g in settings.block_gammas]:
    name = f'gamma {gamma}' + (' block' if verification == 'block' else '')
    loops[name] = functools.partial(
        models.speculative_generate, target, draft, inputs, keys, gamma=gamma,
        max_decode_len=length, verification=verification, eos_id=NO_EOS)

  compile_s, outputs = {}, {}
  for name, run in progress.bar(loops.items(), desc='compile'):
    first = _seconds(run)
    outputs[name] = jax.device_get(run())
    compile_s[name] = first - _seconds(run)
    # printed as it goes: a run cut short still shows what compiling cost
    print(f'{name}: compiled in {compile_s[name]:.1f} s', flush=True)
  runs = {name: [] for name in loops}
  for _ in progress.bar(range(settings.repeats), desc='loops'):
    for name, run in loops.items():  # interleaved: drift lands on every loop alike
      runs[name].append(_seconds(run))
  capacity = decoding.cache_length(length, max(settings.gammas))
  start_s = {name: _start_seconds(model, inputs, capacity, settings.repeats)
             for name, model in (('target', target), ('draft', draft))}
  steps_start = time.perf_counter()
  times = step_costs.measure_step_times(
      target, draft, inputs, k_max=max(settings.gammas) + 1, max_decode_len=length,
      num_steps=settings.num_steps, repeats=settings.repeats, progress=True)
  print(f'step costs (compiles included): {time.perf_counter() - steps_start:.1f} s', flush=True)

  loop_rows = []
  for name, seconds in runs.items():
    starts = start_s['target'] + (0.0 if name == 'baseline' else start_s['draft'])
    iterations = int(outputs[name].loop_target_calls)
    loop_rows.append(dict(
        loop=name, gamma=0 if name == 'baseline' else int(name.split()[1]),
        verification='block' if name.endswith('block') else 'token',
        compile_s=compile_s[name], seconds=float(np.median(seconds)), iterations=iterations,
        iteration_ms=1e3 * max(float(np.median(seconds)) - starts, 0.0) / iterations))
  memory, memory_kind = peak_memory()
  count = lambda params: int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
  result = dict(
      settings=dataclasses.asdict(settings), devices=[str(d) for d in jax.devices()],
      device_kind=jax.devices()[0].device_kind, platform=jax.devices()[0].platform,
      jax_version=jax.__version__, build_s=built,
      params=dict(target=count(target.params), draft=count(draft.params)),
      steps=times.row(), start_ms={k: 1e3 * v for k, v in start_s.items()}, loops=loop_rows,
      peak_memory_gib=memory, peak_memory_kind=memory_kind)
  result.update(speedups(result))
  return result


def _start_seconds(model, inputs: np.ndarray, capacity: int, repeats: int) -> float:
  """Median seconds of one model's `start` over the batch (compiled once)."""
  run = functools.partial(step_costs.start_program, (model,), jnp.asarray(inputs), capacity)
  jax.block_until_ready(run())
  return timing.median_time(run, 2 * repeats + 1)[0]


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


def _f(fmt: str, key: str):
  return lambda row: '' if row.get(key) is None else format(row[key], fmt)


def _loop_rows(result: dict) -> list[dict]:
  """Loop rows with the iteration time the parts predict beside the measured one."""
  steps = result['steps']
  rows = []
  for row in result['loops']:
    gamma = row['gamma']
    if gamma == 0:
      parts = steps['target_step_ms']
    else:
      parts = (steps['draft_first_ms'] + (gamma - 1) * steps['draft_step_ms']
               + steps['verify_ms'][gamma])
    rows.append(dict(row, parts_ms=parts, other_ms=row['iteration_ms'] - parts))
  return rows


LOOP_COLUMNS = (
    ('loop', lambda row: row['loop']), ('compile s', _f('.1f', 'compile_s')),
    ('ms per iteration (measured)', _f('.3f', 'iteration_ms')),
    ('model calls (timed alone)', _f('.3f', 'parts_ms')),
    ('rest of the loop', _f('.3f', 'other_ms')),
    ('iterations', _f('d', 'iterations')))
BEST_COLUMNS = (
    ('alpha', _f('g', 'alpha')), ('best gamma', _f('d', 'gamma')),
    ('speedup', lambda row: f'{row["speedup"]:.2f}X'),
    ('best gamma from the parts', _f('d', 'parts_gamma')),
    ('speedup from the parts', lambda row: f'{row["parts_speedup"]:.2f}X'))
PAPER_COLUMNS = (
    ('task', lambda row: row['task']), ('M_q', lambda row: row['draft']),
    ('T', _f('g', 'temperature')), ('gamma', _f('d', 'gamma')), ('alpha', _f('.2f', 'alpha')),
    ('paper (TPU v4)', lambda row: f'{row["paper_speedup"]:.1f}X'),
    ('this run at that alpha, gamma', lambda row: '' if row['predicted'] is None
     else f'{row["predicted"]:.2f}X'),
    ('same pair', lambda row: 'yes' if row['this_pair'] else 'no'))


def _costs_section(result: dict, image: str) -> str:
  steps = result['steps']
  k_rows = [dict(k=k + 1, measured=m, fit=f, r=r) for k, (m, f, r) in enumerate(zip(
      steps['verify_measured_ms'], steps['verify_ms'], steps['r']))]
  table = report.markdown_table(k_rows, (
      ('K', _f('d', 'k')), ('target call ms, measured', _f('.3f', 'measured')),
      ('non-decreasing fit', _f('.3f', 'fit')), ('r(K)', _f('.3f', 'r'))))
  return (f'Target step {steps["target_step_ms"]:.3f} ms; draft step {steps["draft_step_ms"]:.3f} '
          f'ms in a run of draft steps (**c = {steps["c"]:.3f}**), '
          f'{steps["draft_first_ms"]:.3f} ms as the first after a target call '
          f'(**c_first = {steps["c_first"]:.3f}**). `start` (encoder pass, cross K/V, fresh '
          f'cache) per batch: target {result["start_ms"]["target"]:.2f} ms, draft '
          f'{result["start_ms"]["draft"]:.2f} ms.\n\n{table}\n\n{image}')


def plot_speedups(path: pathlib.Path, result: dict) -> None:
  """Speedup against gamma, one line per alpha, best gamma starred."""
  fig = report_plots.figure((5.5, 3.8))
  ax = fig.add_subplot()
  gammas = [row['gamma'] for row in result['table']]
  for alpha in result['settings']['alphas']:
    values = [row[f'{alpha:g}'] for row in result['table']]
    line, = ax.plot(gammas, values, 'o-', label=f'alpha {alpha:g}')
    best = int(np.argmax(values))
    ax.plot(gammas[best], values[best], '*', color=line.get_color(), markersize=13)
  ax.axhline(1.0, color='gray', linewidth=0.8)
  s = result['settings']
  ax.set(xlabel='gamma', ylabel='predicted walltime speedup', xticks=gammas,
         title=f'{s["target"]} / {s["draft"]}, {s["dtype"]}, batch {s["batch_size"]}, '
               f'{result["device_kind"]}\n(alpha is an input; costs measured)')
  report_plots.save(fig, ax, path)


def write_report(out_dir: str | pathlib.Path, result: dict,
                 command: str = '') -> list[pathlib.Path]:
  """Writes report.md, results.json, loops.csv, speedup.csv and two plots.

  Args:
    out_dir: created if missing; files of the same names are replaced.
    result: a `measure_shapes` record.
    command: the command line that made it, quoted in the report.

  Returns:
    The paths written.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  s, steps = result['settings'], result['steps']
  loops = _loop_rows(result)
  report.write_csv(out / 'loops.csv', loops)
  report.write_csv(out / 'speedup.csv', result['table'])
  plots = ['r_vs_k.png', 'speedup_vs_gamma.png']
  try:
    report_plots.plot_verify_cost(out / plots[0], steps['r'],
                            np.asarray(steps['verify_measured_ms']) / steps['target_step_ms'])
    plot_speedups(out / plots[1], result)
    images = [f'![{name}]({name})' for name in plots]
  except ImportError as e:  # an accelerator image without matplotlib: tables only
    plots, images = [], [f'(no plots: {e})'] * 2
  alphas = [f'{a:g}' for a in s['alphas']]
  speedup_columns = [('gamma', _f('d', 'gamma'))] + [
      (f'alpha {a}', (lambda a: lambda row: f'{row[a]:.2f}X')(a)) for a in alphas]
  params = result['params']
  memory_kind = result['peak_memory_kind'][0].upper() + result['peak_memory_kind'][1:]
  sections = [
      ALPHA_IS_INPUT,
      f'# Loop costs at the shapes of {s["target"]} (target) and {s["draft"]} (draft)',
      (f'`{command}`\n\n' if command else '')
      + f'{result["device_kind"]} ({len(result["devices"])} device(s), {result["platform"]}), '
      f'jax {result["jax_version"]}. {s["dtype"]} ({_dtype_words(s["dtype"])})'
      + (f', the draft {draft_dtype} ({_dtype_words(draft_dtype)})'
         if (draft_dtype := s.get('draft_dtype')) not in (None, s['dtype']) else '') + ', batch '
      f'{s["batch_size"]}, inputs of {s["input_len"]} random tokens, {s["max_decode_len"]} '
      f'tokens per decode (no EOS), model_parallel {s["model_parallel"]}, median of '
      f'{s["repeats"]} interleaved runs, compile excluded. Parameters: target '
      f'{params["target"] / 1e6:.1f}M, draft {params["draft"] / 1e6:.1f}M (random, built in '
      f'{result["build_s"]:.1f} s). {memory_kind}: {result["peak_memory_gib"]:.2f} GiB.',
      '## c and r(K)\n\n' + _costs_section(result, images[0]),
      '## The loops\n\nms per iteration = (loop seconds - both models\' `start`) / iterations; '
      'an iteration is one token for the baseline, and gamma draft steps plus one verify call '
      'for speculative decoding. "Model calls" adds up the calls as timed alone (c_first for the '
      'first draft step, c for the others, r(gamma + 1) for the verify call); the rest is the '
      "loop's own work and whatever the calls cost more inside it.\n\n"
      + report.markdown_table(loops, LOOP_COLUMNS),
      '## Speedup at a given alpha\n\nE[tokens](alpha, gamma) x baseline ms per token / ms per '
      'iteration. "From the parts": eq. (5) with the measured c, c_first and r(K).\n\n'
      + report.markdown_table(result['table'], speedup_columns)
      + '\n\n' + report.markdown_table(result['best'], BEST_COLUMNS)
      + '\n\n' + images[1],
      "## The paper's Table 2 beside this run\n\nThe paper's rows (T5-XXL target on a TPU v4, "
      'alpha measured there); this run\'s speedup at the same alpha and gamma. Only rows marked '
      '"same pair" have this run\'s shapes.\n\n'
      + report.markdown_table(result['paper'], PAPER_COLUMNS)]
  (out / 'report.md').write_text('\n\n'.join(sections) + '\n', encoding='utf-8')
  (out / 'results.json').write_text(json.dumps(result, indent=1), encoding='utf-8')
  return [out / name for name in ['report.md', 'results.json', 'loops.csv', 'speedup.csv'] + plots]


def _dtype_words(dtype: str) -> str:
  compute, params = DTYPES[dtype]
  if compute == params:
    return f'{params} weights and compute'
  return f'{params} weights, {compute} compute'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  defaults = ShapeSettings()
  parser.add_argument('--target', default=defaults.target,
                      help='a t5_1_1 size (small, base, large, xl, xxl, demo_target, ...) or a '
                           'JSON file of T5Config fields')
  parser.add_argument('--draft', default=defaults.draft, help='as --target')
  parser.add_argument('--dtype', default=defaults.dtype, choices=sorted(DTYPES))
  parser.add_argument('--draft_dtype', choices=sorted(DTYPES),
                      help="the draft's (default: --dtype); e.g. bf16_weights with a float32 "
                           'target on a CPU: bfloat16 panels, half the bytes per draft step')
  parser.add_argument('--batch_size', type=int, default=defaults.batch_size)
  parser.add_argument('--input_len', type=int, default=defaults.input_len)
  parser.add_argument('--max_decode_len', type=int, default=defaults.max_decode_len)
  parser.add_argument('--gammas', type=int, nargs='+', default=list(defaults.gammas))
  parser.add_argument('--block_gammas', type=int, nargs='*', default=[],
                      help='gammas also timed with block verification (cost per iteration)')
  parser.add_argument('--alphas', type=float, nargs='+', default=list(defaults.alphas))
  parser.add_argument('--repeats', type=int, default=defaults.repeats)
  parser.add_argument('--num_steps', type=int, default=defaults.num_steps,
                      help='model calls per compiled loop when timing c and r(K)')
  parser.add_argument('--vocab_size', type=int, default=defaults.vocab_size)
  parser.add_argument('--model_parallel', type=int, default=defaults.model_parallel)
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args(argv)
  settings = ShapeSettings(**{name: tuple(value) if isinstance(value, list) else value
                              for name, value in vars(args).items() if name != 'out_dir'})
  result = measure_shapes(settings)
  command = shlex.join(['python', 'scripts/studies/shape_walltime.py'] + list(
      sys.argv[1:] if argv is None else argv))
  paths = write_report(args.out_dir, result, command)
  print(report.markdown_table(result['best'], BEST_COLUMNS))
  print(f'\nfull report: {paths[0]}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
