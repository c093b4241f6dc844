r"""Token against block verification on the bundled demo pair, at each gamma.

  python scripts/studies/verification.py --draft draft_small --gammas 1 2 3 4 5 6 7 8 \
      --out_dir out/verification

Tokens per target call with standard errors (every input decoded --seeds
times in batches) and the walltime speedup at batch 1 (the first --timed_n
inputs, interleaved), at each temperature and gamma, for Algorithm 1's token
verification and Sun et al.'s block verification
(spec_decode.harness.verification_sweep). Writes verification.md, .csv and
.png to --out_dir.
"""

import argparse
import sys

from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import verification_sweep


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

  settings = verification_sweep.VerificationSettings(
      n=args.n, seeds=args.seeds, timed_n=args.timed_n, temperatures=tuple(args.temperatures),
      gammas=tuple(args.gammas), max_decode_len=args.max_decode_len, repeats=args.repeats)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = verification_sweep.verification_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair.\n\n`python {" ".join(sys.argv)}`'
  paths = verification_sweep.write_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
