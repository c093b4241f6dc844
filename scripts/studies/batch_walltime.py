r"""Speculative decoding in batches on the bundled demo pair: where it stops paying.

  python scripts/studies/batch_walltime.py --draft draft_small --batch_sizes 1 2 4 8 16 \
      --temperatures 0 1 --n 32 --out_dir out/batch_walltime

The first --n Multi30k test sentences decoded in consecutive batches of each
size by the target alone and by speculative decoding (rows advance
independently; spec_decode.harness.batch_sweep): tokens/s of both, their ratio, alpha
and row utilisation. Writes batch_walltime.md, batch_walltime.csv and
speedup_vs_batch.png to --out_dir.
"""

import argparse
import sys

from spec_decode import demo
from spec_decode.harness import batch_sweep
from spec_decode.harness import experiments


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

  settings = batch_sweep.BatchSettings(
      n=args.n, batch_sizes=tuple(args.batch_sizes), temperatures=tuple(args.temperatures),
      gamma=args.gamma, max_decode_len=args.max_decode_len, repeats=args.repeats, seed=args.seed)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = batch_sweep.batch_walltime_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair, first {args.n} sentences.\n\n`python {" ".join(sys.argv)}`'
  paths = batch_sweep.write_batch_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
