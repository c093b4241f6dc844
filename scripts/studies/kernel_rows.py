r"""Prints r(K) of a T5 decoding step with and without the CPU kernels, in one interleaved run.

  python scripts/studies/kernel_rows.py                        # the demo target's shapes
  python scripts/studies/kernel_rows.py --target base --input_len 128

r(K) is the cost of one target call over K positions against one position
(eq. (5)'s verify cost). Each (variant, K) is a compiled loop of `--steps`
calls at a fixed cache index (spec_decode.harness.step_costs), random weights
(rounded to bfloat16 values with --bfloat16_weights: bfloat16 panels), batch 1,
float32; `xla` traces with SPEC_DECODE_CPU_KERNELS=0, `kernels` with
the kernels of spec_decode.kernels. All loops are timed round-robin, the median
over rounds taken, so that a shared machine's drift moves both variants alike.
The last line is the kernels' one-position step against XLA's (the baseline's
cost per token).
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels
from spec_decode import models
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode.harness import loading

VARIANTS = {'xla': '0', 'kernels': '1'}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', default='demo_target', help="a t5_1_1 size, demo_target, or a JSON file of T5Config fields")
  parser.add_argument('--input_len', type=int, default=64)
  parser.add_argument('--position', type=int, default=32, help='the cache index of every call')
  parser.add_argument('--ks', type=int, nargs='+', default=[1, 2, 3, 4, 5, 6, 7, 8])
  parser.add_argument('--steps', type=int, default=30, help='calls per timed loop')
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--bfloat16_weights', action='store_true',
                      help='round the random weights to bfloat16 values, as a bfloat16 '
                           "checkpoint's, so that the kernels read bfloat16 panels")
  args = parser.parse_args()
  if 1 not in args.ks or min(args.ks) < 1 or max(args.ks) > kernels.MAX_ROWS:
    parser.error(f'ks must include 1 and lie in 1..{kernels.MAX_ROWS}, got {args.ks}')
  if not kernels.available():
    parser.error('the kernels are not available on this machine (see the warning)')

  config = loading.parse_config(args.target)
  target = models.T5Model.random(config, jax.random.key(0))
  if args.bfloat16_weights:
    target = models.T5Model(config, jax.tree_util.tree_map(
        lambda w: w.astype(jnp.bfloat16).astype(w.dtype), target.params)).with_panels()
  tokens = jnp.asarray(np.random.default_rng(0).integers(2, config.vocab_size,
                                                         (1, args.input_len)), jnp.int32)
  capacity = args.position + max(args.ks)
  runs = {}
  for name, switch in VARIANTS.items():  # the switch is read when a loop is traced
    os.environ[kernels.SWITCH] = switch
    for k in args.ks:
      runs[(name, k)] = step_costs.compiled_step_loop(
          target, tokens, k=k, capacity=capacity, position=args.position, num_steps=args.steps)
  del os.environ[kernels.SWITCH]
  seconds = {key: float(np.median(s)) / args.steps
             for key, s in timing.round_robin(runs, args.rounds).items()}

  weights = 'bfloat16-valued (bfloat16 panels)' if args.bfloat16_weights else 'float32'
  print(f'{args.target} target step, float32, {weights} weights, batch 1, {args.input_len} '
        f'input tokens, cache index {args.position}; {jax.devices()[0].device_kind}; median of '
        f'{args.rounds} interleaved rounds of {args.steps} calls\n')
  print('| K | xla ms | xla r(K) | kernels ms | kernels r(K) |')
  print('| --- | --- | --- | --- | --- |')
  for k in args.ks:
    cells = [f'{1e3 * seconds[(name, k)]:.3f} | {seconds[(name, k)] / seconds[(name, 1)]:.2f}'
             for name in VARIANTS]
    print(f'| {k} | ' + ' | '.join(cells) + ' |')
  print(f'\none position, kernels / xla: {seconds[("kernels", 1)] / seconds[("xla", 1)]:.3f}')


if __name__ == '__main__':
  main()
