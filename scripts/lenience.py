r"""Lenience on the bundled demo pair: the paper's Table 5 (Appendix A.5).

  python scripts/lenience.py --draft draft_small --lenience 1 0.5 0.3 0.1 --n 50 \
      --out_dir out/lenience

Every input decoded alone (batch 1) by the target and by speculative decoding
at each lenience l, at temperature 1 (spec_decode.harness.lenience_sweep): alpha from the
accepted drafts, tokens per target call, walltime speedup and BLEU. l < 1 is
not exact (the report says so beside the table). Writes lenience.md and
lenience.csv to --out_dir.
"""

import argparse
import sys

from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import lenience_sweep


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

  settings = lenience_sweep.LenienceSettings(
      n=args.n, lenience=tuple(args.lenience), temperature=args.temperature, gamma=args.gamma,
      max_decode_len=args.max_decode_len, repeats=args.repeats, seed=args.seed)
  target = demo.load('target')
  draft = demo.load_draft(args.draft, settings.task)
  rows = lenience_sweep.lenience_experiment(target, draft, args.draft, settings)
  notes = f'Bundled demo pair, first {args.n} sentences.\n\n`python {" ".join(sys.argv)}`'
  paths = lenience_sweep.write_lenience_report(args.out_dir, rows, notes)
  print(paths[0].read_text(encoding='utf-8'))


if __name__ == '__main__':
  main()
