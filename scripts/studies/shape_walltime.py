r"""Loop costs of a T5 1.1 pair at any shapes, random weights; speedups at given alphas.

  python scripts/studies/shape_walltime.py --target base --draft small --dtype float32
  python scripts/studies/shape_walltime.py --target xxl --draft small --dtype bfloat16 --batch_size 8
  python scripts/studies/shape_walltime.py --target base --draft small --dtype float32 --draft_dtype bf16_weights

Builds both models with random weights on the devices JAX sees, times the
baseline and the speculative loop for each gamma, c, c_first and r(K)
(`spec_decode.harness.shapes`), and writes report.md, results.json,
loops.csv, speedup.csv and two plots to --out_dir. Alpha is an input:
--alphas. The report can be rebuilt from results.json alone
(`write_report(out_dir, json.load(...))`); its first line says that alpha is
an input. Without matplotlib (accelerator images) the report keeps its tables.
"""

import argparse
import json
import pathlib
import shlex
import sys

import numpy as np

from spec_decode.harness import report
from spec_decode.harness import report_plots
from spec_decode.harness import shapes

ALPHA_IS_INPUT = (
    '**Alpha is an input here, not a measurement**: the weights are random, so the speedups '
    'below are eq. (1) at the given alphas over the measured per-iteration costs; every other '
    'figure is measured.')


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
    result: a `shapes.measure_shapes` record.
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
  return {'float32': 'float32 weights and compute', 'bfloat16': 'bfloat16 weights and compute',
          'bf16_weights': 'bfloat16 weights, float32 compute'}[dtype]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  defaults = shapes.ShapeSettings()
  parser.add_argument('--target', default=defaults.target,
                      help='a t5_1_1 size (small, base, large, xl, xxl, demo_target, ...) or a '
                           'JSON file of T5Config fields')
  parser.add_argument('--draft', default=defaults.draft, help='as --target')
  parser.add_argument('--dtype', default=defaults.dtype, choices=sorted(shapes.DTYPES))
  parser.add_argument('--draft_dtype', choices=sorted(shapes.DTYPES),
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
  settings = shapes.ShapeSettings(
      target=args.target, draft=args.draft, dtype=args.dtype, draft_dtype=args.draft_dtype,
      batch_size=args.batch_size,
      input_len=args.input_len, max_decode_len=args.max_decode_len, gammas=tuple(args.gammas),
      block_gammas=tuple(args.block_gammas),
      alphas=tuple(args.alphas), repeats=args.repeats, num_steps=args.num_steps,
      vocab_size=args.vocab_size, model_parallel=args.model_parallel)
  result = shapes.measure_shapes(settings)
  command = shlex.join(['python', 'scripts/studies/shape_walltime.py'] + list(
      sys.argv[1:] if argv is None else argv))
  paths = write_report(args.out_dir, result, command)
  print(report.markdown_table(result['best'], BEST_COLUMNS))
  print(f'\nfull report: {paths[0]}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
