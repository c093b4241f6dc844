r"""Speculative beam search against T5X-style beam search on the bundled demo pair.

  python scripts/studies/beam.py --draft draft_small --n 200 --out_dir out/beam

Identity of the beams, target calls per output token and per beam step, and
the walltime ratio at batch 1 for each (gamma, draft_width) in --configs, all
decoders interleaved input by input (spec_decode.harness.beam_sweep); BLEU of
the best beam against greedy decoding. Writes beam.md, .csv and .png to
--out_dir.
"""

import argparse
import sys

from spec_decode import demo
from spec_decode.harness import beam_sweep


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
  settings = beam_sweep.BeamSettings(n=args.n, beam_size=args.beam_size, alpha=args.alpha,
                                     configs=configs, max_decode_len=args.max_decode_len,
                                     repeats=args.repeats)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows, quality = beam_sweep.beam_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair.\n\n`python {" ".join(sys.argv)}`'
  paths = beam_sweep.write_report(args.out_dir, rows, quality, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
