r"""Prints the panel kernel's multiply-adds per second against XLA's product, weights in cache.

  python scripts/studies/product_rate.py                       # the demo target's products
  python scripts/studies/product_rate.py --shapes 384x8192 --rows 1 5 16

With the weights cache-resident (one matrix multiplied again and again), a
product of one row is bound by reading the weights and a product of a few rows
by the cores' multiply-add throughput: the rate here is the ceiling for the
extra positions of a verify call (each adds its multiply-adds to a step) when
the weights come from cache, as the demo target's bfloat16 panels do (20 MB in
a 32 MB L3). One compiled loop of `--steps` products per (shape, rows,
variant), timed round-robin (median over `--rounds`), float32 activations and
weights (float32 panels; bfloat16-valued with --bfloat16_weights).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels
from spec_decode.harness import timing


def _loop(product, num_steps: int):
  """num_steps products x @ w, each fed a trace of the last (so none is dropped)."""
  @jax.jit
  def run(x, w, *extra):
    y0 = jnp.zeros((x.shape[0], w.shape[1]), jnp.float32)
    return jax.lax.fori_loop(0, num_steps,
                             lambda _, y: product(x + 1e-30 * y[:, :1], w, *extra), y0)
  return run


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shapes', nargs='+', default=['384x1152', '384x1536', '768x384',
                                                      '384x8192'],
                      help='in x out of each weight matrix (default: the demo target\'s '
                           'fused self-attention, MLP input and output, and output layer)')
  parser.add_argument('--rows', type=int, nargs='+', default=[1, 2, 5, 8, 16, 32])
  parser.add_argument('--steps', type=int, default=100, help='products per timed loop')
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--bfloat16_weights', action='store_true',
                      help='bfloat16-valued weights, so that the kernel reads bfloat16 panels')
  args = parser.parse_args()
  if not kernels.available():
    parser.error('the kernels are not available on this machine (see the warning)')
  if min(args.rows) < 1 or max(args.rows) > kernels.PANEL_MAX_ROWS:
    parser.error(f'rows must lie in 1..{kernels.PANEL_MAX_ROWS}, got {args.rows}')
  try:
    shapes = [tuple(int(n) for n in shape.split('x')) for shape in args.shapes]
  except ValueError:
    parser.error(f'shapes are IN x OUT, e.g. 384x8192; got {args.shapes}')
  if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
    parser.error(f'shapes are IN x OUT with both >= 1, got {args.shapes}')

  rng = np.random.default_rng(0)
  kernel_loop = _loop(lambda x, w, panels: kernels.dense_panels(x, panels, w), args.steps)
  xla_loop = _loop(lambda x, w: x @ w, args.steps)
  runs = {}
  for shape in shapes:
    w = rng.standard_normal(shape).astype(np.float32)
    if args.bfloat16_weights:
      w = w.astype(jnp.bfloat16).astype(np.float32)
    panels, w = kernels.pack_weights(w), jnp.asarray(w)
    for rows in args.rows:
      x = jnp.asarray(rng.standard_normal((rows, shape[0])), jnp.float32)
      runs[shape, rows, 'kernel'] = lambda x=x, w=w, panels=panels: kernel_loop(x, w, panels)
      runs[shape, rows, 'xla'] = lambda x=x, w=w: xla_loop(x, w)
  seconds = {key: float(np.median(s)) / args.steps
             for key, s in timing.round_robin(runs, args.rounds).items()}

  panels = 'bfloat16' if args.bfloat16_weights else 'float32'
  print(f'{jax.devices()[0].device_kind}, {jax.local_devices()[0].platform}; {panels} panels; '
        f'median of {args.rounds} interleaved rounds of {args.steps} products\n')
  print('| in x out | rows | kernel us | kernel G multiply-adds/s | XLA us | XLA G multiply-adds/s |')
  print('| --- | --- | --- | --- | --- | --- |')
  for (shape, rows, variant), s in seconds.items():
    if variant != 'kernel':
      continue
    rate = lambda t: rows * shape[0] * shape[1] / t / 1e9
    xla = seconds[shape, rows, 'xla']
    print(f'| {shape[0]}x{shape[1]} | {rows} | {1e6 * s:.1f} | {rate(s):.0f} | {1e6 * xla:.1f} | '
          f'{rate(xla):.0f} |')


if __name__ == '__main__':
  main()
