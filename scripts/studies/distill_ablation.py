r"""Trains a draft with each distillation recipe on one budget and measures its alpha.

  python scripts/studies/distill_ablation.py --draft draft_small --steps 200 \
      --distill_dir out/distill --out_dir out/distill_ablation_small

Rows (spec_decode.harness.distill_ablation): the bundled draft; sequence KD
on the target's greedy outputs (--distill_dir, written by scripts/distill.py;
left out without it); white-box TVD, forward KL, reverse KL and JSD on half
references, half on-policy draft samples; TVD on references alone. alpha at
T = 0 and 1 on Multi30k test (200) and Debian summarization test (100), as
scripts/measure_alpha.py measures it. Each row's result is kept in
OUT_DIR/rows/ and reused: a repeated command resumes at the next row.
"""

import argparse
import sys

from spec_decode.harness import distill_ablation


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small', choices=['draft_small', 'draft_large'])
  parser.add_argument('--steps', type=int, default=200, help='optimizer steps per trained row')
  parser.add_argument('--batch_tokens', type=int, default=4096)
  parser.add_argument('--learning_rate', type=float, default=3e-3, help='white-box rows')
  parser.add_argument('--kd_learning_rate', type=float, default=1e-2, help='sequence-KD row')
  parser.add_argument('--distill_dir', default=None,
                      help='scripts/distill.py records for the sequence-KD row')
  parser.add_argument('--work_dir', default='out/distill_ablation')
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()
  settings = distill_ablation.Settings(
      draft=args.draft, steps=args.steps, batch_tokens=args.batch_tokens,
      learning_rate=args.learning_rate, kd_learning_rate=args.kd_learning_rate,
      distill_dir=args.distill_dir, work_dir=args.work_dir, out_dir=args.out_dir)
  paths = distill_ablation.run(settings, 'python ' + ' '.join(sys.argv))
  print('\n'.join(map(str, paths)))


if __name__ == '__main__':
  main()
