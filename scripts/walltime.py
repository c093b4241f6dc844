r"""Measures c, r(K) and the walltime speedup of a draft (the paper's Table 2).

  python scripts/walltime.py --target_config small --target_checkpoint /ckpt/target \
      --draft_config nano --draft_checkpoint /ckpt/draft --task demo_ende \
      --split test_multi30k --n 100 --temperatures 0 1 --gammas 1 2 3 5 --out_dir out/walltime

Per temperature (and at temperature 1 with each --truncations top_k,top_p
pair): alpha from one teacher-forced pass over the target's outputs on the
same inputs and gamma = theory.best_gamma_along(betas, c, verify_cost=r,
c_first=...), eq. (5) along the outputs at each position's beta. Then every
input is decoded alone (batch 1) by each setting's baseline and speculative
decoding at that gamma and at each --gammas, all settings' decoders in turn
(one interleaved run), compile excluded, median over --repeats
(spec_decode.harness); c, c_first and r(K) are timed again in rounds between
the inputs, and the predictions use those. Writes report.md, the CSVs, results.json and the plots
to --out_dir; the report compares top-k/top-p with plain sampling.
"""

import argparse
import pathlib
import sys


from spec_decode import data
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report


def _truncation(text: str) -> tuple[int, float]:
  """'40,1' -> (40, 1.0): a top_k,top_p pair."""
  try:
    top_k, top_p = text.split(',')
    return int(top_k), float(top_p)
  except ValueError:
    raise argparse.ArgumentTypeError(f'--truncations takes top_k,top_p pairs such as 40,1 or '
                                     f'0,0.9; got {text!r}') from None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target_config', required=True,
                      help="a t5_1_1 size name (e.g. 'small') or a JSON file of T5Config fields")
  parser.add_argument('--target_checkpoint', required=True, help='T5X, orbax or HF checkpoint')
  parser.add_argument('--draft_config', required=True, help='the draft\'s config, as the target\'s')
  parser.add_argument('--draft_checkpoint', required=True)
  parser.add_argument('--vocab_size', type=int, default=8192, help='vocab_size of size names')
  parser.add_argument('--head_size', type=int, default=0,
                      help='the draft scores only the N tokens most frequent in the task\'s '
                           'training targets (models.PrunedHeadDraft; exact; the demo uses 4096); '
                           '0: its whole vocabulary')
  parser.add_argument('--dtype', default=None, choices=['float32', 'bfloat16'],
                      help='activation dtype override')
  parser.add_argument('--task', default='demo_ende', choices=data.LOCAL_TASKS)
  parser.add_argument('--split', default='test_multi30k')
  parser.add_argument('--n', type=int, default=100, help='inputs (the first N of the split)')
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--truncations', nargs='*', default=['40,1', '0,0.9'], metavar='K,P',
                      help='top_k,top_p pairs also run at temperature 1 (default: top_k 40, '
                           'top_p 0.9); none to skip')
  parser.add_argument('--truncated_draft', action='store_true',
                      help='q truncates with top-k/top-p as p does (default: q samples at the '
                           'temperature alone, which skips the truncation per draft step; exact '
                           'either way)')
  parser.add_argument('--gamma_max', type=int, default=8, help='largest gamma best_gamma tries')
  parser.add_argument('--gammas', type=int, nargs='*', default=[1, 2, 3, 5],
                      help='gammas also timed, for the speedup-vs-gamma plot')
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--batch_size', type=int, default=16, help='rows per alpha pass')
  parser.add_argument('--repeats', type=int, default=3, help='timed runs per input (median)')
  parser.add_argument('--num_steps', type=int, default=64, help='steps per timed loop (c, r)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--baseline', default='ours', choices=['ours', 't5x'],
                      help='t5x: also time T5X\'s decoding.temperature_sample (needs t5x)')
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()

  target = loading.load_model(args.target_config, args.target_checkpoint, args.vocab_size, args.dtype)
  draft = loading.load_model(args.draft_config, args.draft_checkpoint, args.vocab_size, args.dtype)
  draft_name = pathlib.Path(args.draft_config).stem
  if args.head_size:
    try:
      draft = loading.pruned_head(draft, args.task, args.head_size)
    except ValueError as error:
      parser.error(f'--head_size: {error}')
    draft_name += f', {args.head_size} ids'
  settings = experiments.WalltimeSettings(
      task=args.task, split=args.split, n=args.n, temperatures=tuple(args.temperatures),
      gamma_max=args.gamma_max, gammas=tuple(args.gammas), max_input_len=args.max_input_len,
      max_decode_len=args.max_decode_len, batch_size=args.batch_size, repeats=args.repeats,
      num_steps=args.num_steps, seed=args.seed, t5x_baseline=args.baseline == 't5x',
      truncations=tuple(map(_truncation, args.truncations)),
      untruncated_draft=not args.truncated_draft)
  alpha_rows, walltime_rows, timing = experiments.walltime_experiment(
      target, draft, draft_name, settings, target_name=pathlib.Path(args.target_config).stem)

  notes = (f'{args.task}/{args.split}, first {args.n} inputs, max_decode_len '
           f'{args.max_decode_len}, batch 1, {args.repeats} repeats.\n\n`{" ".join(sys.argv)}`')
  paths = report.write_report(args.out_dir, title='Walltime (Table 2)', alpha_rows=alpha_rows,
                              walltime_rows=walltime_rows, timing=timing, notes=notes)
  print('\n'.join(map(str, paths)))


if __name__ == '__main__':
  main()
