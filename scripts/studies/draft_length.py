r"""Fixed gamma against adaptive draft length on the bundled demo pair.

  python scripts/studies/draft_length.py --draft draft_small --gammas 1 2 3 4 5 6 7 8 \
      --gamma_max 8 --thresholds 0.2 0.4 0.6 --out_dir out/draft_length

Every input decoded alone (batch 1) by the baseline, by speculative decoding
at each fixed gamma, and with an adaptive draft length (at most --gamma_max
drafts; a row stops after a token its draft gave probability below the
threshold: `spec_decode.draft_phase`), its verify call over all --gamma_max + 1
positions, and again over the smallest of --verify_lengths that holds the
drafts, interleaved in one run (`walltime.time_decoding`). Speedup = seconds
per generated token of the baseline over speculative decoding's. Writes
draft_length.md, .csv and .png to --out_dir.
"""

import argparse
import dataclasses
import pathlib
import sys
from typing import Sequence

import jax
import numpy as np

from spec_decode import checks
from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import report_plots
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import speculative


@dataclasses.dataclass(frozen=True)
class DraftLengthSettings:
  """What the comparison decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs, each decoded alone.
    temperatures: sampling temperatures (0 is greedy).
    gammas: fixed draft lengths.
    gamma_max: most drafts per iteration of the adaptive decoders.
    thresholds: their confidence thresholds.
    verify_lengths: static verify lengths K of a second set of adaptive
      decoders (gamma_max + 1 is added); None runs the flat ones only.
    verification: 'token' or 'block', for every decoder.
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    repeats: timed runs per input (median).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 50
  temperatures: Sequence[float] = (0.0, 1.0)
  gammas: Sequence[int] = tuple(range(1, 9))
  gamma_max: int = 8
  thresholds: Sequence[float] = (0.2, 0.4, 0.6)
  verify_lengths: Sequence[int] | None = (2, 3, 5)
  verification: str = 'token'
  max_input_len: int = 256
  max_decode_len: int = 64
  repeats: int = 2


def draft_length_experiment(target: models.T5Model, draft: loading.Draft, draft_name: str,
                            settings: DraftLengthSettings) -> list[dict]:
  """Fixed gammas and adaptive draft lengths at each temperature.

  Returns:
    One row per (temperature, decoder): task, draft, temperature, kind
    ('fixed' or 'adaptive'), gamma (the maximum when adaptive), threshold
    (None when fixed), verify_lengths (None: gamma + 1), verification, n,
    tokens_per_call and stderr (over the inputs), drafted_per_call (mean
    drafts proposed per target call),
    draft_histogram, speedup, ms_per_token, identical (the fraction of
    outputs equal to the baseline's: 1 at T = 0, exactness's check).
  """
  s = settings
  buckets = [None, checks.check_verify_lengths(s.verify_lengths, s.gamma_max)]
  inputs, _ = experiments.task_inputs(s.task, s.split, s.n, s.max_input_len)
  # Threshold 0 never stops: gamma_max drafts, as fixed gamma_max, through the adaptive loop.
  variants = [('fixed', g, None, None) for g in s.gammas] + [('adaptive', s.gamma_max, 0.0, None)]
  variants += [('adaptive', s.gamma_max, t, b) for b in dict.fromkeys(buckets)
               for t in s.thresholds]
  rows = []
  for temperature in s.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    decoders = {'baseline': walltime.baseline_decoder(target, max_decode_len=s.max_decode_len,
                                                      sampling=sampling)}
    decoders.update({v: walltime.speculative_decoder(
        target, draft, gamma=v[1], max_decode_len=s.max_decode_len, sampling=sampling,
        verification=s.verification, confidence_threshold=v[2], verify_lengths=v[3])
                     for v in variants})
    decoded = walltime.time_decoding(decoders, inputs, jax.random.key(0), repeats=s.repeats,
                                     progress=True)
    baseline = decoded['baseline']
    baseline_rate = experiments.tokens_per_second(baseline)
    for kind, gamma, threshold, verify_lengths in variants:
      out = decoded[(kind, gamma, threshold, verify_lengths)]
      histogram = np.asarray(out.draft_histogram)
      tokens_per_call, stderr = experiments.ratio_stderr(
          np.array([len(t) for t in out.tokens]), out.iterations)
      rows.append(dict(
          task=s.task, draft=draft_name, temperature=temperature, kind=kind, gamma=gamma,
          threshold=threshold, verify_lengths=verify_lengths, verification=s.verification,
          n=len(inputs),
          tokens_per_call=tokens_per_call, stderr=stderr,
          drafted_per_call=float(np.arange(len(histogram)) @ histogram / histogram.sum()),
          draft_histogram=histogram.tolist(),
          speedup=experiments.tokens_per_second(out) / baseline_rate,
          ms_per_token=1e3 * out.total_s / out.generated,
          identical=float(np.mean([a == b for a, b in zip(out.tokens, baseline.tokens)]))))
  return rows


def _label(row: dict) -> str:
  if row['kind'] == 'fixed':
    return f'gamma = {row["gamma"]}'
  label = f'adaptive <= {row["gamma"]}, threshold {row["threshold"]:g}'
  if row['verify_lengths'] is None:
    return label
  return f'{label}, K in {{{", ".join(map(str, row["verify_lengths"]))}}}'


COLUMNS: tuple[report.Column, ...] = (
    ('T', lambda r: f'{r["temperature"]:g}'),
    ('drafting', _label),
    ('drafts/call', lambda r: f'{r["drafted_per_call"]:.2f}'),
    ('tokens/call', lambda r: f'{r["tokens_per_call"]:.3f} ± {r["stderr"]:.3f}'),
    ('ms/token', lambda r: f'{r["ms_per_token"]:.3f}'),
    ('speedup', lambda r: f'{r["speedup"]:.2f}X'),
    ('same as baseline', lambda r: f'{r["identical"]:.0%}'),
)


def summary(rows: Sequence[dict]) -> list[dict]:
  """Per temperature: the best fixed gamma, the best adaptive decoder, their speedup ratio.

  Threshold-0 decoders (the adaptive loop drafting gamma_max, a control) are
  not candidates.
  """
  out = []
  for temperature in sorted({r['temperature'] for r in rows}):
    group = [r for r in rows if r['temperature'] == temperature]
    fixed = max((r for r in group if r['kind'] == 'fixed'), key=lambda r: r['speedup'])
    adaptive = max((r for r in group if r['kind'] == 'adaptive' and r['threshold'] > 0),
                   key=lambda r: r['speedup'])
    out.append(dict(temperature=temperature, best_fixed=_label(fixed),
                    best_fixed_speedup=fixed['speedup'], best_adaptive=_label(adaptive),
                    best_adaptive_speedup=adaptive['speedup'],
                    ratio=adaptive['speedup'] / fixed['speedup']))
  return out


def plot(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Speedup against drafts per call (fixed and adaptive), and adaptive drafted lengths."""
  temperatures = sorted({r['temperature'] for r in rows})
  fig = report_plots.figure((4.5 * len(temperatures), 6.5))
  for column, temperature in enumerate(temperatures):
    group = [r for r in rows if r['temperature'] == temperature]
    fixed = [r for r in group if r['kind'] == 'fixed']
    adaptive = [r for r in group if r['kind'] == 'adaptive']
    top = fig.add_subplot(2, len(temperatures), column + 1)
    top.plot([r['drafted_per_call'] for r in fixed], [r['speedup'] for r in fixed], 'o-',
             label='fixed gamma')
    for r in adaptive:
      top.plot(r['drafted_per_call'], r['speedup'], 's' if r['verify_lengths'] else 'D',
               label=f'adaptive, {r["threshold"]:g}' + (', K buckets' if r['verify_lengths']
                                                        else ''))
    top.axhline(1.0, color='gray', linewidth=0.8)
    top.set(title=f'{group[0]["draft"]}, T = {temperature:g}', xlabel='drafts per target call',
            ylabel='walltime speedup (batch 1)')
    top.legend(fontsize=7)
    bottom = fig.add_subplot(2, len(temperatures), len(temperatures) + column + 1)
    flat = [r for r in adaptive if r['verify_lengths'] is None and r['threshold'] > 0]
    width = 0.8 / max(len(flat), 1)
    for i, r in enumerate(flat):
      histogram = np.asarray(r['draft_histogram'], float)
      bottom.bar(np.arange(len(histogram)) + i * width, histogram / histogram.sum(), width,
                 label=f'threshold {r["threshold"]:g}')
    bottom.set(xlabel='drafts proposed in an iteration', ylabel='fraction of iterations')
    bottom.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def write_report(out_dir: str | pathlib.Path, rows: Sequence[dict],
                 notes: str = '') -> list[pathlib.Path]:
  """draft_length.md (tables, plot, `notes`), draft_length.csv and draft_length.png."""
  r = rows[0]
  best = report.markdown_table(summary(rows), (
      ('T', lambda x: f'{x["temperature"]:g}'), ('best fixed', lambda x: x['best_fixed']),
      ('speedup', lambda x: f'{x["best_fixed_speedup"]:.2f}X'),
      ('best adaptive', lambda x: x['best_adaptive']),
      ('speedup ', lambda x: f'{x["best_adaptive_speedup"]:.2f}X'),
      ('adaptive / fixed', lambda x: f'{x["ratio"]:.3f}')))
  paths = report.write_tables(out_dir, 'draft_length', [
      '# Fixed against adaptive draft length', notes,
      f'{r["task"]}, draft {r["draft"]}, {r["verification"]} verification, the first '
      f'{r["n"]} inputs decoded alone (batch 1), every decoder interleaved in one run. '
      f'Adaptive: at most gamma drafts; a row stops after a token its draft gave probability '
      f'below the threshold (Hugging Face\'s assistant_confidence_threshold rule); the verify '
      f'call covers gamma + 1 positions, or (K in {{...}}) the smallest K that holds the '
      f'drafts. Threshold 0 never stops drafting: the adaptive loop at gamma_max drafts, a '
      f'control for its own cost against the fixed gamma_max loop. tokens/call ± one standard '
      f'error over the '
      f'inputs.', best, report.markdown_table(rows, COLUMNS), '![draft length](draft_length.png)'],
      rows)
  paths.append(paths[0].with_suffix('.png'))
  plot(paths[-1], rows)
  return paths


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small',
                      choices=[*demo.NAMES[1:], *experiments.DRAFT_KINDS],
                      help='a bundled draft model or a draft provider')
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--gammas', type=int, nargs='+', default=list(range(1, 9)))
  parser.add_argument('--gamma_max', type=int, default=8)
  parser.add_argument('--thresholds', type=float, nargs='+', default=[0.2, 0.4, 0.6])
  parser.add_argument('--verify_lengths', type=int, nargs='*', default=[2, 3, 5],
                      help='static verify lengths K of a second set of adaptive decoders '
                           '(gamma_max + 1 is added); none to skip them')
  parser.add_argument('--verification', default='token', choices=speculative.VERIFICATIONS)
  parser.add_argument('--n', type=int, default=50, help='Multi30k test sentences')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2, help='timed runs per input (median)')
  parser.add_argument('--out_dir', default='out/draft_length')
  args = parser.parse_args()

  settings = DraftLengthSettings(
      n=args.n, temperatures=tuple(args.temperatures), gammas=tuple(args.gammas),
      gamma_max=args.gamma_max, thresholds=tuple(args.thresholds),
      verify_lengths=tuple(args.verify_lengths) or None,
      verification=args.verification, max_decode_len=args.max_decode_len, repeats=args.repeats)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = draft_length_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair.\n\n`python {" ".join(sys.argv)}`'
  paths = write_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
