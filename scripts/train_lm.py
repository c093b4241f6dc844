"""Trains the decoder-only language model pair on the bundled English text.

  python scripts/train_lm.py target out/lm_target --steps 2000 --minutes 45
  python scripts/train_lm.py draft out/lm_draft --teacher out/lm_target/checkpoint \
      --steps 1500 --minutes 25

The sizes are spec_decode.data.LM_SIZES'; the draft is distilled from the
teacher (spec_decode.training.lm). Each run writes OUTPUT/checkpoint (bfloat16
T5X, vocabulary recorded), OUTPUT/log.jsonl and OUTPUT/summary.json.
"""

import argparse
import json
import sys

from spec_decode.models import decoder_only
from spec_decode.training import lm as lm_training


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('role', choices=('target', 'draft'))
  parser.add_argument('output')
  parser.add_argument('--teacher', help='the target checkpoint a draft is distilled from')
  parser.add_argument('--steps', type=int, default=2000)
  parser.add_argument('--minutes', type=float, default=60.0)
  parser.add_argument('--learning_rate', type=float, default=1e-2)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  if (args.role == 'draft') != (args.teacher is not None):
    parser.error('a draft needs --teacher (the target checkpoint); a target takes none')
  teacher = None if args.teacher is None else decoder_only.DecoderOnlyModel.load(
      args.teacher, decoder_only.bundled_config('lm_target'), 'float32')
  summary = lm_training.train(
      decoder_only.bundled_config(f'lm_{args.role}'), lm_training.LMTrainConfig(
          num_steps=args.steps, max_minutes=args.minutes, learning_rate=args.learning_rate,
          seed=args.seed), args.output, teacher)
  print(json.dumps(summary))
  return 0


if __name__ == '__main__':
  sys.exit(main())
