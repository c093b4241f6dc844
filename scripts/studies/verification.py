r"""Token against block verification on the bundled demo pair, at each gamma.

  python scripts/studies/verification.py --draft draft_small --gammas 1 2 3 4 5 6 7 8 \
      --out_dir out/verification

Algorithm 1's token verification against Sun et al.'s (2025) block
verification, two measurements per temperature and gamma, both verifications
alike:

- Tokens per target call, untimed: every input decoded --seeds times in
  batches (each row its own key), generated tokens over the target calls the
  row took, with the standard error of that ratio over the (input, seed)
  rows. Block verification can only raise it in expectation (Sun et al.);
  at T = 0 (one-hot p and q) and at gamma = 1 both rules are the same.
- Walltime at batch 1: the first --timed_n inputs decoded alone by the
  baseline and by speculative decoding with each verification and gamma,
  interleaved (`walltime.time_decoding`); speedup = seconds per generated
  token of the baseline over speculative decoding's.

Writes verification.md, .csv and .png to --out_dir.
"""

import argparse
import dataclasses
import pathlib
import sys
from typing import Sequence

import jax
import numpy as np
import tqdm

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
class VerificationSettings:
  """What the comparison decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: inputs whose tokens per target call are counted (the first n).
    seeds: decodes per input for the counts (keys fold_in(key(seed), i)).
    timed_n: the first timed_n inputs are also timed at batch 1.
    temperatures: sampling temperatures (0 is greedy).
    gammas: draft lengths.
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    batch_size: rows per counting batch.
    repeats: timed runs per input (median).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 200
  seeds: int = 4
  timed_n: int = 50
  temperatures: Sequence[float] = (0.0, 1.0)
  gammas: Sequence[int] = tuple(range(1, 9))
  max_input_len: int = 256
  max_decode_len: int = 64
  batch_size: int = 40
  repeats: int = 2


def count_tokens_per_call(target: models.T5Model, draft: loading.Draft, inputs: np.ndarray, *,
                          gamma: int, verification: str, sampling: sampling_lib.SamplingParams,
                          seeds: int, batch_size: int, max_decode_len: int
                          ) -> tuple[np.ndarray, np.ndarray]:
  """Decodes every input `seeds` times; ([M] generated tokens, [M] target calls) per row."""
  n = len(inputs)
  tokens, calls = [], []
  for seed in range(seeds):
    for start in range(0, n, batch_size):
      index = np.arange(start, start + batch_size)
      keys = jax.vmap(lambda i, s=seed: jax.random.fold_in(jax.random.key(s), i))(index)
      out = jax.device_get(models.speculative_generate(
          target, draft, inputs[np.minimum(index, n - 1)], keys, gamma=gamma,
          max_decode_len=max_decode_len, sampling=sampling, verification=verification,
          eos_id=loading.EOS_ID))
      real = index < n  # the last batch repeats the last input
      tokens.append(out.generated[real])
      calls.append(out.target_calls[real])
  return np.concatenate(tokens), np.concatenate(calls)


def verification_experiment(target: models.T5Model, draft: loading.Draft, draft_name: str,
                            settings: VerificationSettings) -> list[dict]:
  """Token and block verification at each temperature and gamma.

  Returns:
    One row per (temperature, gamma): task, draft, temperature, gamma, n,
    seeds, timed_n, and per verification v in ('token', 'block'):
    `v_tokens_per_call` and `v_stderr` (counts), `v_speedup` and `v_ms`
    (seconds per generated token, batch 1); `gain` = block - token tokens
    per call and `gain_stderr`; `identical` = the fraction of timed outputs
    where block and token verification decoded the same tokens.
  """
  s = settings
  inputs, _ = experiments.task_inputs(s.task, s.split, s.n, s.max_input_len)
  timed = inputs[:s.timed_n]
  rows = []
  for temperature in s.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    decoders = {'baseline': walltime.baseline_decoder(target, max_decode_len=s.max_decode_len,
                                                      sampling=sampling)}
    decoders.update({(gamma, v): walltime.speculative_decoder(
        target, draft, gamma=gamma, max_decode_len=s.max_decode_len, sampling=sampling,
        verification=v) for gamma in s.gammas for v in speculative.VERIFICATIONS})
    decoded = walltime.time_decoding(decoders, timed, jax.random.key(0), repeats=s.repeats,
                                     progress=True)
    baseline_rate = experiments.tokens_per_second(decoded['baseline'])
    for gamma in tqdm.tqdm(s.gammas, desc=f'tokens per call, T = {temperature:g}'):
      row = dict(task=s.task, draft=draft_name, temperature=temperature, gamma=gamma, n=s.n,
                 seeds=s.seeds, timed_n=len(timed))
      for v in speculative.VERIFICATIONS:
        counts = count_tokens_per_call(
            target, draft, inputs, gamma=gamma, verification=v, sampling=sampling,
            seeds=s.seeds, batch_size=s.batch_size, max_decode_len=s.max_decode_len)
        row[f'{v}_tokens_per_call'], row[f'{v}_stderr'] = experiments.ratio_stderr(*counts)
        out = decoded[(gamma, v)]
        row[f'{v}_speedup'] = experiments.tokens_per_second(out) / baseline_rate
        row[f'{v}_ms'] = 1e3 * out.total_s / out.generated
      row['gain'] = row['block_tokens_per_call'] - row['token_tokens_per_call']
      row['gain_stderr'] = float(np.hypot(row['block_stderr'], row['token_stderr']))
      row['identical'] = float(np.mean([a == b for a, b in zip(
          decoded[(gamma, 'token')].tokens, decoded[(gamma, 'block')].tokens)]))
      rows.append(row)
  return rows


COLUMNS: tuple[report.Column, ...] = (
    ('T', lambda r: f'{r["temperature"]:g}'),
    ('gamma', lambda r: str(r['gamma'])),
    ('tokens/call: token',
     lambda r: f'{r["token_tokens_per_call"]:.3f} ± {r["token_stderr"]:.3f}'),
    ('block', lambda r: f'{r["block_tokens_per_call"]:.3f} ± {r["block_stderr"]:.3f}'),
    ('block - token', lambda r: f'{r["gain"]:+.3f} ± {r["gain_stderr"]:.3f}'),
    ('speedup: token', lambda r: f'{r["token_speedup"]:.2f}X'),
    ('block', lambda r: f'{r["block_speedup"]:.2f}X'),
    ('ms/token block / token', lambda r: f'{r["block_ms"] / r["token_ms"]:.3f}'),
    ('same outputs', lambda r: f'{r["identical"]:.0%}'),
)


def plot(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Tokens per call (with standard errors) and speedup against gamma, per temperature."""
  temperatures = sorted({r['temperature'] for r in rows})
  fig = report_plots.figure((4.5 * len(temperatures), 6.5))
  for column, temperature in enumerate(temperatures):
    group = [r for r in rows if r['temperature'] == temperature]
    gammas = [r['gamma'] for r in group]
    top = fig.add_subplot(2, len(temperatures), column + 1)
    bottom = fig.add_subplot(2, len(temperatures), len(temperatures) + column + 1)
    for v, marker in zip(speculative.VERIFICATIONS, 'os'):
      top.errorbar(gammas, [r[f'{v}_tokens_per_call'] for r in group],
                   yerr=[2 * r[f'{v}_stderr'] for r in group], fmt=f'{marker}-', capsize=3,
                   label=f'{v} (± 2 s.e.)')
      bottom.plot(gammas, [r[f'{v}_speedup'] for r in group], f'{marker}-', label=v)
    top.set(title=f'{group[0]["draft"]}, T = {temperature:g}', ylabel='tokens per target call',
            xticks=gammas)
    bottom.axhline(1.0, color='gray', linewidth=0.8)
    bottom.set(xlabel='gamma', ylabel='walltime speedup (batch 1)', xticks=gammas)
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def write_report(out_dir: str | pathlib.Path, rows: Sequence[dict],
                 notes: str = '') -> list[pathlib.Path]:
  """verification.md (table, plot, `notes`), verification.csv and verification.png."""
  r = rows[0]
  paths = report.write_tables(out_dir, 'verification', [
      '# Token against block verification', notes,
      f'{r["task"]}, draft {r["draft"]}. Tokens per target call: the first {r["n"]} inputs, '
      f'each decoded {r["seeds"]} times (batches, one key per row), ± one standard error of the '
      f'ratio over those rows; block - token with sqrt(s_token^2 + s_block^2), which treats the '
      f'two as independent (they decode the same inputs with the same keys, so it overstates '
      f'the error: at T = 0 the difference is exactly 0). Speedup: the '
      f'first {r["timed_n"]} inputs decoded alone (batch 1), seconds per generated token of '
      f'the baseline over speculative decoding\'s, interleaved in one run. At T = 0 both rules '
      f'keep the same prefix (one-hot p and q), so outputs and counts must be equal there.',
      report.markdown_table(rows, COLUMNS), '![verification](verification.png)'], rows)
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
  parser.add_argument('--n', type=int, default=200, help='Multi30k test sentences counted')
  parser.add_argument('--seeds', type=int, default=4, help='decodes per sentence counted')
  parser.add_argument('--timed_n', type=int, default=50, help='sentences timed at batch 1')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=2, help='timed runs per input (median)')
  parser.add_argument('--out_dir', default='out/verification')
  args = parser.parse_args()

  settings = VerificationSettings(
      n=args.n, seeds=args.seeds, timed_n=args.timed_n, temperatures=tuple(args.temperatures),
      gammas=tuple(args.gammas), max_decode_len=args.max_decode_len, repeats=args.repeats)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = verification_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair.\n\n`python {" ".join(sys.argv)}`'
  paths = write_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
