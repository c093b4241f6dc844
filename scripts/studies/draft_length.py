r"""Fixed gamma against adaptive draft length on the bundled demo pair.

  python scripts/studies/draft_length.py --draft draft_small --gammas 1 2 3 4 5 6 7 8 \
      --gamma_max 8 --thresholds 0.2 0.4 0.6 --out_dir out/draft_length

Every input decoded alone (batch 1) by the baseline, at each fixed gamma, and
adaptively (at most --gamma_max drafts; a row stops after a token its draft
gave probability below the threshold; the verify call over all --gamma_max + 1
positions, and again over the smallest of --verify_lengths that holds the
drafts), interleaved in one run
(spec_decode.harness.draft_length_sweep). Writes draft_length.md, .csv and
.png to --out_dir.
"""

import argparse
import sys

from spec_decode import demo
from spec_decode.harness import draft_length_sweep
from spec_decode.harness import experiments
from spec_decode import speculative


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

  settings = draft_length_sweep.DraftLengthSettings(
      n=args.n, temperatures=tuple(args.temperatures), gammas=tuple(args.gammas),
      gamma_max=args.gamma_max, thresholds=tuple(args.thresholds),
      verify_lengths=tuple(args.verify_lengths) or None,
      verification=args.verification, max_decode_len=args.max_decode_len, repeats=args.repeats)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = draft_length_sweep.draft_length_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair.\n\n`python {" ".join(sys.argv)}`'
  paths = draft_length_sweep.write_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
