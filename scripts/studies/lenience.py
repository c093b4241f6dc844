r"""Lenience on the bundled demo pair: the paper's Table 5 (Appendix A.5).

  python scripts/studies/lenience.py --draft draft_small --lenience 1 0.5 0.3 0.1 --n 50 \
      --out_dir out/lenience

Every input decoded alone (batch 1) by the target and by speculative decoding
at each lenience l, at temperature 1: alpha from the accepted drafts, tokens
per target call, walltime speedup and BLEU, with the output quality that
l < 1 trades for them. l < 1 is not exact (the report says so beside the
table). Writes lenience.md and lenience.csv to --out_dir.
"""

import argparse
import dataclasses
import pathlib
import sys
from typing import Sequence

import jax

from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import theory


LENIENCE_CAVEAT = (
    'l = 1 is exact: the outputs are distributed as the target\'s own samples. l < 1 '
    '(Appendix A.5) multiplies q by l in the accept test and in the residual, so more drafts '
    'are accepted and the outputs are **no longer distributed as the target\'s**: they drift '
    'towards the draft. The quality column shows what that costs.')


LENIENCE_COLUMNS: tuple[report.Column, ...] = (
    ('l', lambda r: f'{r["lenience"]:g}'),
    ('exact', lambda r: 'yes' if r['exact'] else 'no (not p)'),
    ('alpha', lambda r: f'{r["alpha"]:.3f}'),
    ('tokens/call (eq. (1))',
     lambda r: f'{r["tokens_per_call"]:.2f} ({r["expected_tokens_per_call"]:.2f})'),
    ('speedup', lambda r: f'{r["speedup"]:.2f}X'),
    ('quality: baseline / speculative', report.quality_cell),
)


@dataclasses.dataclass(frozen=True)
class LenienceSettings:
  """What Table 5 decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs.
    lenience: the values of l; 1 is exact.
    temperature: sampling temperature (the paper's Table 5: 1).
    gamma: draft length.
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    repeats: timed runs per input (median).
    seed: PRNG seed (input i uses fold_in(key(seed), i)).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 50
  lenience: Sequence[float] = (1.0, 0.5, 0.3, 0.1)
  temperature: float = 1.0
  gamma: int = 3
  max_input_len: int = 256
  max_decode_len: int = 64
  repeats: int = 2
  seed: int = 0


def lenience_experiment(target: models.T5Model, draft: loading.Draft, draft_name: str,
                        settings: LenienceSettings) -> list[dict]:
  """Table 5: alpha, tokens per call and speedup for each lenience l.

  Every input is decoded alone (batch 1) by the baseline and by speculative
  decoding at each l (one compiled function: l is traced), timed as Table 2.
  alpha is `alpha_from_histogram` of the loop's accepted drafts; the speedup
  is the ratio of seconds per generated token (sampled outputs differ in
  length from one decoder to another).

  Returns:
    One row per l: task, draft, temperature, gamma, lenience, exact, alpha,
    tokens_per_call, expected_tokens_per_call (eq. (1) at that alpha),
    speedup, baseline_s, speculative_s, accept_histogram, metrics and
    `<metric>_baseline` / `<metric>_speculative` for each metric.
  """
  s = settings
  if any(not 0 < l <= 1 for l in s.lenience):
    raise ValueError(f'lenience values must lie in (0, 1], got {s.lenience}')
  inputs, references = experiments.task_inputs(s.task, s.split, s.n, s.max_input_len)
  sampling = sampling_lib.SamplingParams.create(s.temperature)
  decoders = {'baseline': walltime.baseline_decoder(target, max_decode_len=s.max_decode_len,
                                                    sampling=sampling)}
  decoders.update({f'l={l:g}': walltime.speculative_decoder(
      target, draft, gamma=s.gamma, max_decode_len=s.max_decode_len, sampling=sampling,
      lenience=l) for l in s.lenience})
  decoded = walltime.time_decoding(decoders, inputs, jax.random.key(s.seed), repeats=s.repeats,
                                   progress=True)
  baseline = decoded['baseline']
  baseline_quality = experiments.output_quality(s.task, references, baseline.tokens)
  rows = []
  for l in s.lenience:
    out = decoded[f'l={l:g}']
    alpha = walltime.alpha_from_histogram(out.accept_histogram)
    row = dict(task=s.task, draft=draft_name, temperature=s.temperature, gamma=s.gamma,
               lenience=l, exact=l == 1.0, alpha=alpha, tokens_per_call=out.tokens_per_call,
               expected_tokens_per_call=float(theory.expected_tokens(alpha, s.gamma)),
               speedup=experiments.tokens_per_second(out) / experiments.tokens_per_second(baseline),
               baseline_s=baseline.total_s, speculative_s=out.total_s,
               accept_histogram=out.accept_histogram.tolist(), metrics=' '.join(baseline_quality))
    for metric, value in experiments.output_quality(s.task, references, out.tokens).items():
      row.update({f'{metric}_baseline': baseline_quality[metric], f'{metric}_speculative': value})
    rows.append(row)
    print(f'l={l:g}: alpha {alpha:.3f}, {row["speedup"]:.2f}X', file=sys.stderr)
  return rows


def write_report(out_dir: str | pathlib.Path, rows: Sequence[dict],
                 notes: str = '') -> list[pathlib.Path]:
  """lenience.md (the table, the exactness caveat, `notes`) and lenience.csv."""
  r = rows[0]
  return report.write_tables(out_dir, 'lenience', [
      '# Lenience (Table 5, Appendix A.5)', notes,
      f'{r["task"]}, draft {r["draft"]}, T = {r["temperature"]:g}, gamma = {r["gamma"]}, '
      'batch 1. alpha = accepted / tested drafts (`walltime.alpha_from_histogram`); '
      'speedup = seconds per token of the baseline / of speculative decoding.',
      report.markdown_table(rows, LENIENCE_COLUMNS), f'**Exactness.** {LENIENCE_CAVEAT}'], rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small',
                      choices=[*demo.NAMES[1:], *experiments.DRAFT_KINDS],
                      help='a bundled draft model or a draft provider')
  parser.add_argument('--lenience', type=float, nargs='+', default=[1.0, 0.5, 0.3, 0.1])
  parser.add_argument('--temperature', type=float, default=1.0)
  parser.add_argument('--gamma', type=int, default=3)
  parser.add_argument('--n', type=int, default=50, help='Multi30k test sentences')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2, help='timed runs per input (median)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out_dir', default='out/lenience')
  args = parser.parse_args()

  settings = LenienceSettings(
      n=args.n, lenience=tuple(args.lenience), temperature=args.temperature, gamma=args.gamma,
      max_decode_len=args.max_decode_len, repeats=args.repeats, seed=args.seed)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = lenience_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair, first {args.n} sentences.\n\n`python {" ".join(sys.argv)}`'
  paths = write_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
