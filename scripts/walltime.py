r"""Measures c, r(K) and the walltime speedup of a draft (the paper's Table 2).

  python scripts/walltime.py --target_config small --target_checkpoint /ckpt/target \
      --draft_config nano --draft_checkpoint /ckpt/draft --task demo_ende \
      --split test_multi30k --n 100 --temperatures 0 1 --gammas 1 2 3 5 --out_dir runs/walltime

Per temperature: alpha from one teacher-forced pass over the target's outputs
on the same inputs, gamma = theory.best_gamma(alpha, c, verify_cost=r), then
every input decoded alone (batch 1) by the baseline and by speculative
decoding at that gamma and at each --gammas, compile excluded, median over
--repeats (spec_decode.measure). Writes report.md, the CSVs, results.json and
the plots to --out_dir.
"""

import argparse
import pathlib
import sys

import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode import data
from spec_decode import measure
from spec_decode import models
from spec_decode import report
from spec_decode import sampling as sampling_lib
from spec_decode import tasks
from spec_decode import theory

METRICS = {'demo_ende': tasks.bleu, 'demo_debsum': tasks.rouge}


def _load(config_spec: str, checkpoint: str, args: argparse.Namespace) -> models.T5Model:
  config = measure.parse_config(config_spec, args.vocab_size, args.dtype)
  return models.T5Model(config, jax.device_put(checkpoints.load_params(checkpoint, config)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target_config', required=True,
                      help="a t5_1_1 size name (e.g. 'small') or a JSON file of T5Config fields")
  parser.add_argument('--target_checkpoint', required=True, help='T5X, orbax or HF checkpoint')
  parser.add_argument('--draft_config', required=True, help='the draft\'s config, as the target\'s')
  parser.add_argument('--draft_checkpoint', required=True)
  parser.add_argument('--vocab_size', type=int, default=8192, help='vocab_size of size names')
  parser.add_argument('--dtype', default=None, choices=['float32', 'bfloat16'],
                      help='activation dtype override')
  parser.add_argument('--task', default='demo_ende', choices=data.LOCAL_TASKS)
  parser.add_argument('--split', default='test_multi30k')
  parser.add_argument('--n', type=int, default=100, help='inputs (the first N of the split)')
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--gamma_max', type=int, default=8, help='largest gamma best_gamma tries')
  parser.add_argument('--gammas', type=int, nargs='*', default=[1, 2, 3, 5],
                      help='gammas also timed, for the speedup-vs-gamma plot')
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--batch_size', type=int, default=16, help='rows per alpha pass')
  parser.add_argument('--repeats', type=int, default=3, help='timed runs per input (median)')
  parser.add_argument('--num_steps', type=int, default=64, help='steps per timed loop (c, r)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()

  target = _load(args.target_config, args.target_checkpoint, args)
  draft = _load(args.draft_config, args.draft_checkpoint, args)
  draft_name = pathlib.Path(args.draft_config).stem
  examples = data.load_examples(args.task, args.split, args.n)
  references = [e['targets'] for e in examples]
  inputs = measure.encode_texts([e['inputs'] for e in examples], args.max_input_len)
  rng = jax.random.key(args.seed)

  times = measure.measure_step_times(
      target, draft, inputs[:1], k_max=max(args.gamma_max, *args.gammas) + 1,
      max_decode_len=args.max_decode_len, num_steps=args.num_steps, progress=True)
  print(f'c = {times.c:.4f}, r(K) = {np.round(times.r, 3).tolist()}', file=sys.stderr)

  alpha_rows, walltime_rows = [], []
  for temperature in args.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    tokens, lengths = measure.generate_sequences(
        target, inputs, sampling=sampling, max_decode_len=args.max_decode_len, rng=rng,
        batch_size=args.batch_size, progress=True)
    stats = measure.measure_alpha(target, draft, inputs, tokens, lengths, sampling=sampling,
                                  batch_size=args.batch_size)
    alpha_rows.append(dict(task=args.task, target=pathlib.Path(args.target_config).stem,
                           draft=draft_name, temperature=temperature, **stats.row()))
    best, predicted = theory.best_gamma(stats.alpha, times.c, args.gamma_max, times.r)
    best = int(best)
    print(f'T={temperature:g}: alpha {stats.alpha:.4f}, best gamma {best} (predicted '
          f'{float(predicted):.2f}X)', file=sys.stderr)

    gammas = sorted(set(args.gammas) | {best})
    decoders = {'baseline': measure.baseline_decoder(
        target, max_decode_len=args.max_decode_len, sampling=sampling)}
    decoders.update({f'gamma={g}': measure.speculative_decoder(
        target, draft, gamma=g, max_decode_len=args.max_decode_len, sampling=sampling)
                     for g in gammas})
    decoded = measure.time_decoding(decoders, inputs, rng, repeats=args.repeats, progress=True)
    baseline = decoded['baseline']
    quality = {name: METRICS[args.task](references, [measure.detokenize(t) for t in out.tokens])
               for name, out in decoded.items()}
    for g in gammas:
      row = dict(task=args.task, draft=draft_name, temperature=temperature, chosen=g == best,
                 **measure.summarize(baseline, decoded[f'gamma={g}'], gamma=g, alpha=stats.alpha,
                                     times=times))
      row['metrics'] = ' '.join(quality['baseline'])
      for metric, value in quality['baseline'].items():
        row.update({f'{metric}_baseline': value,
                    f'{metric}_speculative': quality[f'gamma={g}'][metric]})
      walltime_rows.append(row)
      print(f'  gamma {g}: {row["measured_speedup"]:.2f}X measured, '
            f'{row["predicted_speedup"]:.2f}X predicted', file=sys.stderr)

  notes = (f'{args.task}/{args.split}, first {len(inputs)} inputs, max_decode_len '
           f'{args.max_decode_len}, batch 1, {args.repeats} repeats.\n\n`{" ".join(sys.argv)}`')
  paths = report.write_report(args.out_dir, title='Walltime (Table 2)', alpha_rows=alpha_rows,
                              walltime_rows=walltime_rows, timing=times.row(), notes=notes)
  print('\n'.join(map(str, paths)))


if __name__ == '__main__':
  main()
