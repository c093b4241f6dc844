r"""Speculative beam search against T5X-style beam search on the bundled demo pair.

  python scripts/studies/beam.py --draft draft_small --n 200 --out_dir out/beam

Every input is decoded alone (batch 1) by plain beam search and by the
speculative version at each (gamma, draft_width) in --configs, interleaved
input by input and timed (median of --repeats). Per configuration:
  - identity: inputs whose beams (all of them, tokens) equal plain beam
    search's, and the largest score difference;
  - target calls per output token (the best beam's tokens, EOS included) and
    per beam step; plain beam search makes one call per step;
  - walltime ratio: plain seconds over speculative seconds, summed over inputs.
Where the time goes: each model call is timed alone inside a compiled loop
(`step_costs.step_time`, rows = the decoder's rows, input 0 repeated): the
plain step over [W, 1], the verify call over [W * m, gamma + 1] and a draft
step over [W * m, 1]. `predicted_ratio` is the walltime ratio those calls
alone would give (plain step / (target calls per step x (verify + gamma
drafts))); `other_ms` is what an iteration took beyond its model calls
(cache reordering, the replayed steps' top-k, the draft's top-m).
Greedy decoding of the same inputs gives the BLEU that beam search is
compared with. Writes beam.md, .csv and .png to --out_dir.
"""

import argparse
import dataclasses
import pathlib
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import report_plots
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode import models


@dataclasses.dataclass(frozen=True)
class BeamSettings:
  """What the comparison decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs.
    beam_size: beams W (T5X's WMT evaluation uses 4).
    alpha: brevity penalty exponent (T5X's default 0.6).
    configs: (gamma, draft_width) pairs of the speculative version.
    max_input_len: longer inputs are cut.
    max_decode_len: most tokens per sequence.
    repeats: timed runs per input and decoder (median).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 200
  beam_size: int = 4
  alpha: float = 0.6
  configs: Sequence[tuple[int, int]] = ((1, 2), (2, 2), (2, 4), (3, 4))
  max_input_len: int = 256
  max_decode_len: int = 64
  repeats: int = 1


def _length(tokens: np.ndarray, steps: int) -> int:
  """Tokens of one beam: through its first EOS, else all `steps`."""
  eos = np.flatnonzero(tokens == loading.EOS_ID)
  return int(eos[0]) + 1 if eos.size else steps


def beam_experiment(target: models.T5Model, draft: loading.Draft, draft_name: str,
                    settings: BeamSettings) -> tuple[list[dict], dict]:
  """Plain and speculative beam search on the first n inputs, interleaved.

  Returns:
    One row per decoder ('plain' first, then each (gamma, draft_width)):
    decoder, gamma, draft_width, n, identical (count), max_score_diff,
    calls_per_token, calls_per_step, seconds, walltime_ratio; and a dict
    with the BLEU of the best beams and of greedy decoding.
  """
  s = settings
  inputs, references = experiments.task_inputs(s.task, s.split, s.n, s.max_input_len)
  decoders = {'plain': lambda x: models.beam_generate(
      target, x, beam_size=s.beam_size, max_decode_len=s.max_decode_len, alpha=s.alpha)}
  for gamma, width in s.configs:
    decoders[gamma, width] = lambda x, g=gamma, m=width: models.beam_generate(
        target, x, beam_size=s.beam_size, max_decode_len=s.max_decode_len, alpha=s.alpha,
        draft=draft, draft_width=m, gamma=g)
  rows = [jnp.asarray(inputs[i:i + 1]) for i in range(len(inputs))]
  for decode in decoders.values():  # compile before timing
    jax.block_until_ready(decode(rows[0]))
  outs = {name: [] for name in decoders}
  for x in tqdm.tqdm(rows, desc='beam search'):
    for name, decode in decoders.items():
      seconds, out = timing.median_time(lambda d=decode: d(x), s.repeats)
      outs[name].append((seconds, jax.device_get(out)))

  plain = outs['plain']
  lengths = [_length(o.tokens[0, -1], int(o.steps)) for _, o in plain]
  results = []
  for name, records in outs.items():
    calls = sum(int(o.target_calls) for _, o in records)
    steps = sum(int(o.steps) for _, o in records)
    seconds = sum(t for t, _ in records)
    same = [np.array_equal(o.tokens, p.tokens) for (_, o), (_, p) in zip(records, plain)]
    diff = max(float(np.max(np.abs(o.scores - p.scores))) for (_, o), (_, p) in
               zip(records, plain))
    relative = max(float(np.max(np.abs(o.scores - p.scores) / np.abs(p.scores)))
                   for (_, o), (_, p) in zip(records, plain))
    gamma, width = (0, 0) if name == 'plain' else name
    results.append(dict(
        task=s.task, draft=draft_name, decoder='plain' if name == 'plain' else 'speculative',
        gamma=gamma, draft_width=width, beam_size=s.beam_size, alpha=s.alpha, n=len(rows),
        identical=int(sum(same)), max_score_diff=diff, max_relative_diff=relative,
        calls_per_token=calls / sum(lengths), target_calls=calls, calls_per_step=calls / steps,
        steps_per_call=steps / calls, seconds=seconds, ms_per_token=1e3 * seconds / sum(lengths),
        walltime_ratio=sum(t for t, _ in plain) / seconds))

  _call_costs(target, draft, inputs[:1], results, s)
  greedy = [jax.device_get(models.generate(target, x, jax.random.key(0),
                                           max_decode_len=s.max_decode_len)) for x in rows]
  best = [o.tokens[0, -1, :n].tolist() for (_, o), n in zip(plain, lengths)]
  quality = {
      'beam': experiments.output_quality(s.task, references, best),
      'greedy': experiments.output_quality(s.task, references,
                                           [o.tokens[0, :o.lengths[0]].tolist() for o in greedy]),
  }
  return results, quality


def _call_costs(target, draft, x: np.ndarray, rows: list[dict], s: BeamSettings) -> None:
  """Adds each decoder's model-call times, predicted ratio and other cost to its row."""
  gamma_max = max(r['gamma'] for r in rows)
  capacity, position = s.max_decode_len + gamma_max + 1, s.max_decode_len // 4
  time = lambda model, rows_, k: step_costs.step_time(
      model, np.repeat(x, rows_, axis=0), k=k, capacity=capacity, position=position)
  plain_s = time(target, s.beam_size, 1)
  for r in tqdm.tqdm(rows, desc='call costs'):
    if r['decoder'] == 'plain':
      calls_s = plain_s
    else:
      paths = s.beam_size * r['draft_width']
      r['verify_ms'] = 1e3 * time(target, paths, r['gamma'] + 1)
      r['draft_ms'] = 1e3 * time(draft, paths, 1)
      calls_s = 1e-3 * (r['verify_ms'] + r['gamma'] * r['draft_ms'])
    r['plain_step_ms'] = 1e3 * plain_s
    r['predicted_ratio'] = plain_s / (r['calls_per_step'] * calls_s)
    r['other_ms'] = 1e3 * (r['seconds'] / r['target_calls'] - calls_s)


COLUMNS: tuple[report.Column, ...] = (
    ('decoder', lambda r: 'plain beam search' if r['decoder'] == 'plain'
     else f'speculative, gamma {r["gamma"]}, m {r["draft_width"]}'),
    ('paths per call', lambda r: '-' if r['decoder'] == 'plain'
     else f'{r["beam_size"] * r["draft_width"]} x {r["gamma"] + 1}'),
    ('identical beams', lambda r: f'{r["identical"]}/{r["n"]}'),
    ('max score diff (relative)',
     lambda r: f'{r["max_score_diff"]:.1e} ({r["max_relative_diff"]:.0e})'),
    ('target calls / output token', lambda r: f'{r["calls_per_token"]:.3f}'),
    ('target calls / beam step', lambda r: f'{r["calls_per_step"]:.3f}'),
    ('ms / output token', lambda r: f'{r["ms_per_token"]:.2f}'),
    ('walltime ratio (plain / this)', lambda r: f'{r["walltime_ratio"]:.2f}X'),
    ('predicted from call costs', lambda r: f'{r["predicted_ratio"]:.2f}X'),
    ('target call ms', lambda r: f'{r["plain_step_ms"]:.2f}' if r['decoder'] == 'plain'
     else f'{r["verify_ms"]:.2f}'),
    ('draft call ms', lambda r: '-' if r['decoder'] == 'plain' else f'{r["draft_ms"]:.2f}'),
    ('other ms / iteration', lambda r: f'{r["other_ms"]:.2f}'),
)


def plot(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Target calls per output token and the walltime ratio of each decoder."""
  labels = ['plain'] + [f'g{r["gamma"]} m{r["draft_width"]}' for r in rows[1:]]
  fig = report_plots.figure((9, 3.5))
  left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
  x = np.arange(len(rows))
  left.bar(x - 0.2, [r['calls_per_token'] for r in rows], 0.4, label='per output token')
  left.bar(x + 0.2, [r['calls_per_step'] for r in rows], 0.4, label='per beam step')
  left.axhline(1.0, color='gray', linewidth=0.8)
  left.set(xticks=x, xticklabels=labels, ylabel='target calls', title='calls (lower is better)')
  left.legend(fontsize=8)
  right.bar(labels, [r['walltime_ratio'] for r in rows], color='tab:orange')
  right.axhline(1.0, color='gray', linewidth=0.8)
  right.set(ylabel='plain seconds / seconds', title='walltime ratio (batch 1)')
  for ax in (left, right):
    ax.tick_params(axis='x', labelsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def write_report(out_dir: str | pathlib.Path, rows: Sequence[dict], quality: dict,
                 notes: str = '') -> list[pathlib.Path]:
  """beam.md (table, plot, BLEU, `notes`), beam.csv and beam.png."""
  r = rows[0]
  metrics = ', '.join(f'{k} {v:.2f}' for k, v in quality['beam'].items())
  greedy = ', '.join(f'{k} {v:.2f}' for k, v in quality['greedy'].items())
  paths = report.write_tables(out_dir, 'beam', [
      '# Speculative beam search against beam search', notes,
      f'{r["task"]}, draft {r["draft"]}, the first {r["n"]} inputs, each decoded alone (batch '
      f'1), beam size {r["beam_size"]}, alpha {r["alpha"]}, every decoder interleaved input by '
      f'input. m paths of gamma tokens are drafted from each live beam (its m most likely next '
      f'tokens, continued greedily); one target call scores all of them. Identical: every beam '
      f'of the input has the tokens of plain beam search. Output tokens: the best beam\'s, EOS '
      f'included. The walltime ratio sums seconds over the inputs. Call costs: each model call '
      f'timed alone in a compiled loop over the decoder\'s rows (plain: [W, 1]; verify: '
      f'[W * m, gamma + 1]; draft: [W * m, 1]); predicted = the ratio those calls alone give; '
      f'other = an iteration\'s time beyond its model calls (cache reordering of every row, the '
      f'replayed steps, the draft\'s top-m).',
      report.markdown_table(rows, COLUMNS),
      '![calls and walltime](beam.png)',
      f'Quality of the best beam: {metrics}; greedy decoding of the same inputs: {greedy}.',
  ], rows)
  paths.append(paths[0].with_suffix('.png'))
  plot(paths[-1], rows)
  return paths


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small', choices=demo.NAMES[1:],
                      help='a bundled draft model')
  parser.add_argument('--n', type=int, default=200, help='Multi30k test sentences')
  parser.add_argument('--beam_size', type=int, default=4)
  parser.add_argument('--alpha', type=float, default=0.6, help='brevity penalty exponent')
  parser.add_argument('--configs', nargs='+', default=['1,2', '2,2', '2,4', '3,4'],
                      help='gamma,draft_width pairs of the speculative version')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=1, help='timed runs per input (median)')
  parser.add_argument('--out_dir', default='out/beam')
  args = parser.parse_args()

  try:
    configs = tuple(tuple(int(v) for v in c.split(',')) for c in args.configs)
    if any(len(c) != 2 or min(c) < 1 for c in configs):
      raise ValueError
  except ValueError:
    parser.error(f'--configs takes gamma,draft_width pairs of integers >= 1, got {args.configs}')
  settings = BeamSettings(n=args.n, beam_size=args.beam_size, alpha=args.alpha, configs=configs,
                          max_decode_len=args.max_decode_len, repeats=args.repeats)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows, quality = beam_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair.\n\n`python {" ".join(sys.argv)}`'
  paths = write_report(args.out_dir, rows, quality, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
