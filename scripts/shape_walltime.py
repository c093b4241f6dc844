"""Loop costs of a T5 1.1 pair at any shapes, random weights; speedups at given alphas.

  python scripts/shape_walltime.py --target base --draft small --dtype float32
  python scripts/shape_walltime.py --target xxl --draft small --dtype bfloat16 --batch_size 8
  python scripts/shape_walltime.py --target base --draft small --dtype float32 --draft_dtype bf16_weights

Builds both models with random weights on the devices JAX sees, times the
baseline and the speculative loop for each gamma, c, c_first and r(K), and
writes report.md, results.json, CSVs and plots to --out_dir (see
spec_decode/harness/shapes.py). Alpha is an input: --alphas.
"""

import argparse
import shlex
import sys

from spec_decode.harness import shapes
from spec_decode.harness import shapes_report


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  defaults = shapes.ShapeSettings()
  parser.add_argument('--target', default=defaults.target,
                      help='a t5_1_1 size (small, base, large, xl, xxl, demo_target, ...) or a '
                           'JSON file of T5Config fields')
  parser.add_argument('--draft', default=defaults.draft, help='as --target')
  parser.add_argument('--dtype', default=defaults.dtype, choices=sorted(shapes.DTYPES))
  parser.add_argument('--draft_dtype', choices=sorted(shapes.DTYPES),
                      help="the draft's (default: --dtype); e.g. bf16_weights with a float32 "
                           'target on a CPU: bfloat16 panels, half the bytes per draft step')
  parser.add_argument('--batch_size', type=int, default=defaults.batch_size)
  parser.add_argument('--input_len', type=int, default=defaults.input_len)
  parser.add_argument('--max_decode_len', type=int, default=defaults.max_decode_len)
  parser.add_argument('--gammas', type=int, nargs='+', default=list(defaults.gammas))
  parser.add_argument('--block_gammas', type=int, nargs='*', default=[],
                      help='gammas also timed with block verification (cost per iteration)')
  parser.add_argument('--alphas', type=float, nargs='+', default=list(defaults.alphas))
  parser.add_argument('--repeats', type=int, default=defaults.repeats)
  parser.add_argument('--num_steps', type=int, default=defaults.num_steps,
                      help='model calls per compiled loop when timing c and r(K)')
  parser.add_argument('--vocab_size', type=int, default=defaults.vocab_size)
  parser.add_argument('--model_parallel', type=int, default=defaults.model_parallel)
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args(argv)
  settings = shapes.ShapeSettings(
      target=args.target, draft=args.draft, dtype=args.dtype, draft_dtype=args.draft_dtype,
      batch_size=args.batch_size,
      input_len=args.input_len, max_decode_len=args.max_decode_len, gammas=tuple(args.gammas),
      block_gammas=tuple(args.block_gammas),
      alphas=tuple(args.alphas), repeats=args.repeats, num_steps=args.num_steps,
      vocab_size=args.vocab_size, model_parallel=args.model_parallel)
  result = shapes.measure_shapes(settings)
  command = shlex.join(['python', 'scripts/shape_walltime.py'] + list(
      sys.argv[1:] if argv is None else argv))
  paths = shapes_report.write_report(args.out_dir, result, command)
  print(shapes_report.report.markdown_table(result['best'], shapes_report.BEST_COLUMNS))
  print(f'\nfull report: {paths[0]}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
