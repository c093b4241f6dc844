r"""Speculative decoding in batches on the bundled demo pair: where it stops paying.

  python scripts/studies/batch_walltime.py --draft draft_small --batch_sizes 1 2 4 8 16 \
      --temperatures 0 1 --n 32 --out_dir out/batch_walltime

The first --n Multi30k test sentences decoded in consecutive batches of each
size by the target alone and by speculative decoding (rows advance
independently): tokens/s of both, their ratio, alpha, row utilisation and the
break-even batch on this hardware. Writes batch_walltime.md,
batch_walltime.csv and speedup_vs_batch.png to --out_dir.
"""

import argparse
import dataclasses
import functools
import os
import pathlib
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import report_plots
from spec_decode.harness import timing
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib


BATCH_COLUMNS: tuple[report.Column, ...] = (
    ('T', lambda r: f'{r["temperature"]:g}'),
    ('batch', lambda r: str(r['batch_size'])),
    ('baseline tokens/s', lambda r: f'{r["baseline_tokens_per_s"]:.1f}'),
    ('speculative tokens/s', lambda r: f'{r["speculative_tokens_per_s"]:.1f}'),
    ('speedup', lambda r: f'{r["speedup"]:.2f}X'),
    ('alpha', lambda r: f'{r["alpha"]:.3f}'),
    ('tokens/call per row', lambda r: f'{r["tokens_per_call"]:.2f}'),
    ('row utilisation: baseline / speculative',
     lambda r: f'{r["baseline_utilisation"]:.2f} / {r["speculative_utilisation"]:.2f}'),
    ('greedy identical', report.identical_cell),
)


@dataclasses.dataclass(frozen=True)
class BatchSettings:
  """What the batch walltime table decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs; every batch size must divide n.
    batch_sizes: rows per decoder call.
    temperatures: 0 is greedy.
    gamma: draft length.
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    repeats: timed runs per batch (median).
    seed: PRNG seed (input i uses fold_in(key(seed), i) at every batch size).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 32
  batch_sizes: Sequence[int] = (1, 2, 4, 8, 16)
  temperatures: Sequence[float] = (0.0, 1.0)
  gamma: int = 3
  max_input_len: int = 256
  max_decode_len: int = 64
  repeats: int = 2
  seed: int = 0


def _time_batches(decoders: dict[str, walltime.DecodeFn], inputs: np.ndarray, keys: jax.Array,
                  batch_size: int, repeats: int) -> dict[str, dict]:
  """Decodes the inputs in consecutive batches with every decoder, interleaved, timed.

  Returns:
    name -> dict(seconds: total of the per-batch medians, tokens: [N, L]
    outputs, generated: tokens produced, row_calls: target calls summed over
    unfinished rows, loop_calls: batched target calls, accept_histogram).
  """
  batches = [slice(i, i + batch_size) for i in range(0, len(inputs), batch_size)]
  for decode in decoders.values():  # compile and warm up
    jax.block_until_ready(decode(jnp.asarray(inputs[batches[0]]), keys[batches[0]]))
  records = {name: [] for name in decoders}
  for rows in batches:
    x = jnp.asarray(inputs[rows])
    for name, decode in decoders.items():
      seconds, out = timing.median_time(lambda: decode(x, keys[rows]), repeats)
      records[name].append((seconds, jax.device_get(out)))
  return {name: dict(
      seconds=sum(t for t, _ in outs),
      tokens=np.concatenate([o.tokens for _, o in outs]),
      generated=int(sum(o.generated.sum() for _, o in outs)),
      row_calls=int(sum(o.target_calls.sum() for _, o in outs)),
      loop_calls=int(sum(o.loop_target_calls for _, o in outs)),
      accept_histogram=np.sum([o.accept_histogram for _, o in outs], axis=0))
          for name, outs in records.items()}


def batch_walltime_experiment(target: models.T5Model, draft: loading.Draft, draft_name: str,
                              settings: BatchSettings) -> list[dict]:
  """Throughput of the baseline and of speculative decoding per batch size.

  The same inputs are decoded in consecutive batches of each size; rows
  advance independently, so input i gives the same output at every batch size
  (key fold_in(key(seed), i)), but a batch runs until its slowest row is done.
  Row utilisation = target calls of unfinished rows / (batch size x batched
  target calls): the share of the batch's work that is not idle rows.

  Returns:
    One row per (temperature, batch size): task, draft, temperature, gamma,
    batch_size, baseline_tokens_per_s, speculative_tokens_per_s, speedup (their
    ratio), alpha (`alpha_from_histogram`), tokens_per_call (per row),
    baseline_utilisation, speculative_utilisation, identical (outputs equal
    the baseline's), baseline_s, speculative_s.
  """
  s = settings
  if any(b < 1 or s.n % b for b in s.batch_sizes):
    raise ValueError(f'every batch size must divide n={s.n}, got {s.batch_sizes}')
  inputs, _ = experiments.task_inputs(s.task, s.split, s.n, s.max_input_len)
  keys = jax.vmap(functools.partial(jax.random.fold_in, jax.random.key(s.seed)))(
      jnp.arange(s.n))
  rows = []
  for temperature in s.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    decoders = {
        'baseline': walltime.baseline_decoder(target, max_decode_len=s.max_decode_len,
                                              sampling=sampling),
        'speculative': walltime.speculative_decoder(target, draft, gamma=s.gamma,
                                                    max_decode_len=s.max_decode_len,
                                                    sampling=sampling)}
    for batch_size in s.batch_sizes:
      timed = _time_batches(decoders, inputs, keys, batch_size, s.repeats)
      base, spec = timed['baseline'], timed['speculative']
      row = dict(
          task=s.task, draft=draft_name, temperature=temperature, gamma=s.gamma,
          batch_size=batch_size,
          baseline_tokens_per_s=base['generated'] / base['seconds'],
          speculative_tokens_per_s=spec['generated'] / spec['seconds'],
          alpha=walltime.alpha_from_histogram(spec['accept_histogram']),
          tokens_per_call=spec['generated'] / spec['row_calls'],
          baseline_utilisation=base['row_calls'] / (batch_size * base['loop_calls']),
          speculative_utilisation=spec['row_calls'] / (batch_size * spec['loop_calls']),
          identical=bool(np.array_equal(base['tokens'], spec['tokens'])),
          baseline_s=base['seconds'], speculative_s=spec['seconds'])
      row['speedup'] = row['speculative_tokens_per_s'] / row['baseline_tokens_per_s']
      rows.append(row)
      print(f'T={temperature:g} batch {batch_size}: {row["baseline_tokens_per_s"]:.1f} -> '
            f'{row["speculative_tokens_per_s"]:.1f} tokens/s ({row["speedup"]:.2f}X)',
            file=sys.stderr)
  return rows


def break_even(rows: Sequence[dict]) -> str:
  """Per temperature, the batch sizes at which speculation pays and those it does not."""
  lines = []
  for temperature in dict.fromkeys(r['temperature'] for r in rows):
    group = sorted((r for r in rows if r['temperature'] == temperature),
                   key=lambda r: r['batch_size'])
    sizes = lambda keep: ', '.join(str(r['batch_size']) for r in group if keep(r['speedup']))
    faster, slower = sizes(lambda x: x >= 1), sizes(lambda x: x < 1)
    if not slower:
      verdict = f'speculation pays at every batch size tried ({faster})'
    elif not faster:
      verdict = f'speculation is slower than the baseline at every batch size tried ({slower})'
    else:
      verdict = f'speculation pays at batch {faster} and is slower at batch {slower}'
    lines.append(f'- T = {temperature:g}: {verdict}')
  return '\n'.join(lines)


def plot_batch_walltime(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Tokens/s of both decoders and the speedup against the batch size."""
  fig = report_plots.figure((9, 3.5))
  throughput, speedup = fig.subplots(1, 2)
  for temperature in dict.fromkeys(r['temperature'] for r in rows):
    group = sorted((r for r in rows if r['temperature'] == temperature),
                   key=lambda r: r['batch_size'])
    b = [r['batch_size'] for r in group]
    line, = throughput.plot(b, [r['speculative_tokens_per_s'] for r in group], 'o-',
                            label=f'speculative, T = {temperature:g}')
    throughput.plot(b, [r['baseline_tokens_per_s'] for r in group], 's--', color=line.get_color(),
                    label=f'baseline, T = {temperature:g}')
    speedup.plot(b, [r['speedup'] for r in group], 'o-', label=f'T = {temperature:g}')
  sizes = sorted({r['batch_size'] for r in rows})
  speedup.axhline(1.0, color='gray', linewidth=0.8)
  for ax in (throughput, speedup):
    ax.set_xscale('log', base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.legend(fontsize=8)
  throughput.set(xlabel='batch size', ylabel='generated tokens / s', title='Throughput')
  speedup.set(xlabel='batch size', ylabel='speculative / baseline tokens/s',
              title=f'Speedup ({rows[0]["draft"]}, gamma = {rows[0]["gamma"]})')
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def write_report(out_dir: str | pathlib.Path, rows: Sequence[dict],
                 notes: str = '') -> list[pathlib.Path]:
  """batch_walltime.md, batch_walltime.csv and speedup_vs_batch.png."""
  r = rows[0]
  device = jax.devices()[0]
  paths = report.write_tables(out_dir, 'batch_walltime', [
      '# Speculative decoding in batches', notes,
      f'{r["task"]}, draft {r["draft"]}, gamma = {r["gamma"]}, on {device.platform} '
      f'({device.device_kind}, {os.cpu_count()} CPUs visible). Every batch size decodes '
      'the same inputs in consecutive batches; compile excluded, median over repeats '
      'per batch. Rows advance independently, but a batch runs until its slowest row '
      'ends (row utilisation).',
      report.markdown_table(rows, BATCH_COLUMNS), break_even(rows),
      '![speedup vs batch size](speedup_vs_batch.png)'], rows)
  paths.append(paths[0].parent / 'speedup_vs_batch.png')
  plot_batch_walltime(paths[-1], rows)
  return paths


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small',
                      choices=[*demo.NAMES[1:], *experiments.DRAFT_KINDS],
                      help='a bundled draft model or a draft provider')
  parser.add_argument('--batch_sizes', type=int, nargs='+', default=[1, 2, 4, 8, 16])
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--gamma', type=int, default=3)
  parser.add_argument('--n', type=int, default=32,
                      help='Multi30k test sentences; every batch size must divide it')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2, help='timed runs per batch (median)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out_dir', default='out/batch_walltime')
  args = parser.parse_args()

  settings = BatchSettings(
      n=args.n, batch_sizes=tuple(args.batch_sizes), temperatures=tuple(args.temperatures),
      gamma=args.gamma, max_decode_len=args.max_decode_len, repeats=args.repeats, seed=args.seed)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = batch_walltime_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair, first {args.n} sentences.\n\n`python {" ".join(sys.argv)}`'
  paths = write_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
