r"""Writes draft distillation data: the target's outputs on training inputs.

  python scripts/distill.py --config demo_target --checkpoint spec_decode/data/models/target \
      --train demo_ende:train:9000 demo_multi30k:train:6000 demo_debsum:train:5000 \
      --validation demo_ende:validation:200 demo_debsum:validation:100 --max_decode_len 96 \
      --out_dir out/distill

Each TASK:SPLIT:N takes a seeded random N examples of a local task split (all
of it without :N) and decodes them with the target in batches, greedily or
sampled (--temperature); outputs that reach max_decode_len without EOS are
dropped (and counted), or kept with their ids with --keep_unfinished (for
white-box distillation only; the seqio task skips them). The
records go to OUT_DIR/train.jsonl and OUT_DIR/validation.jsonl, which
gin/runs/distill.gin trains a draft on (spec_decode.training.distill), with
OUT_DIR/vocabulary.json, the vocabulary their ids belong to (the bundled one;
a checkpoint recorded with another is refused unless
--allow_vocabulary_mismatch).
"""

import argparse
import math
import sys

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.harness import loading
from spec_decode.training import distill


def parse_spec(spec: str) -> tuple[str, str, int | None]:
  """'TASK:SPLIT[:N]' -> (task, split, n or None)."""
  parts = spec.split(':')
  if len(parts) not in (2, 3) or (len(parts) == 3 and not (parts[2].isdigit()
                                                           and int(parts[2]) >= 1)):
    raise SystemExit(f'error: {spec!r} is not TASK:SPLIT or TASK:SPLIT:N with N >= 1')
  return parts[0], parts[1], int(parts[2]) if len(parts) == 3 else None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', required=True, help='the target: a t5_1_1 size name or a JSON file')
  parser.add_argument('--checkpoint', required=True, help='T5X, orbax or HF checkpoint')
  parser.add_argument('--train', nargs='+', required=True, help='TASK:SPLIT[:N] for train.jsonl')
  parser.add_argument('--validation', nargs='+', required=True,
                      help='TASK:SPLIT[:N] for validation.jsonl')
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--temperature', type=float, default=0.0,
                      help='0: greedy outputs (alpha at T = 0); 1: samples of the target (T = 1)')
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--seed', type=int, default=0, help='of the random subsets and the samples')
  parser.add_argument('--keep_unfinished', action='store_true',
                      help='keep outputs without EOS (white-box distillation learns their prefixes)')
  parser.add_argument('--allow_vocabulary_mismatch', action='store_true',
                      help='warn instead of failing when the checkpoint records another '
                      'vocabulary than the bundled one')
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()
  for name, value, minimum in (('--max_input_len', args.max_input_len, 2),
                               ('--max_decode_len', args.max_decode_len, 1),
                               ('--batch_size', args.batch_size, 1)):
    if value < minimum:
      parser.error(f'{name} {value}: must be >= {minimum}')
  if not (math.isfinite(args.temperature) and args.temperature >= 0):
    parser.error(f'--temperature {args.temperature}: must be a finite number >= 0')
  for spec in args.train + args.validation:
    parse_spec(spec)
  try:
    checkpoints.check_vocabulary(args.checkpoint, data.VOCAB_PATH,
                                 allow_mismatch=args.allow_vocabulary_mismatch,
                                 override='--allow_vocabulary_mismatch')
  except ValueError as e:
    parser.error(str(e))

  target = loading.load_model(args.config, args.checkpoint)
  for split, specs in (('train', args.train), ('validation', args.validation)):
    records = []
    for spec in specs:
      task, source_split, n = parse_spec(spec)
      examples = distill.select_examples(task, source_split, n, seed=args.seed)
      kept, unfinished = distill.distill_examples(
          target, examples, max_input_len=args.max_input_len,
          max_decode_len=args.max_decode_len, temperature=args.temperature, seed=args.seed,
          batch_size=args.batch_size, keep_unfinished=args.keep_unfinished)
      fate = 'kept' if args.keep_unfinished else 'dropped'
      print(f'{spec}: {len(kept)} outputs kept, {unfinished} without EOS {fate}', file=sys.stderr,
            flush=True)
      records += kept
    distill.write_split(f'{args.out_dir}/{split}.jsonl', records)
    print(f'{args.out_dir}/{split}.jsonl: {len(records)} records', file=sys.stderr)
  checkpoints.write_vocabulary(args.out_dir, data.VOCAB_PATH)


if __name__ == '__main__':
  main()
