r"""Prints r(K) of a bare matmul: what K rows cost against one, weights in DRAM or in cache.

  python scripts/studies/matmul_rows.py                          # the demo target's width, 8k outputs
  XLA_FLAGS=--xla_cpu_use_xnnpack=false python scripts/studies/matmul_rows.py   # another backend

A verify call over K positions multiplies [K, d] activations by every weight
matrix that a single step multiplies one row by. Reading the weights bounds
both when they do not fit in the cache, so r(K) = 1 is the ideal; on XLA:CPU a
single row is a GEMV and K >= 2 rows a GEMM (YNNPACK by default), and the
ratio of the two is most of a model's r(K) (`harness.step_costs`).

One compiled loop per K multiplies by `--matrices` [d, n] float32 matrices in
turn, `--steps` times; the loops are timed round-robin (each once per round,
median over rounds), so that drift of a shared machine moves all K alike. Two
sizes: all matrices (DRAM-bound when they exceed the last-level cache) and the
first one alone (cache-resident).
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.harness import timing


def _loop(num_steps: int):
  @jax.jit
  def run(x: jax.Array, weights: tuple[jax.Array, ...]) -> jax.Array:
    def body(_, x):
      for w in weights:  # every output is used, so no matmul is dropped
        x = x + 1e-6 * jnp.sum(jnp.einsum('kd,dn->kn', x, w), axis=1, keepdims=True)
      return x
    return jax.lax.fori_loop(0, num_steps, body, x)
  return run


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--d', type=int, default=384, help='input width')
  parser.add_argument('--n', type=int, default=8192, help='output width')
  parser.add_argument('--matrices', type=int, default=8, help='distinct [d, n] matrices')
  parser.add_argument('--rows', type=int, nargs='+', default=[1, 2, 3, 4, 5, 8])
  parser.add_argument('--steps', type=int, default=30, help='passes per timed loop')
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args()
  if min(args.rows) < 1 or 1 not in args.rows:
    parser.error(f'rows must be >= 1 and include 1, got {args.rows}')
  if min(args.d, args.n, args.matrices, args.steps, args.rounds) < 1:
    parser.error('d, n, matrices, steps and rounds must be >= 1')

  rng = np.random.default_rng(0)
  weights = tuple(jnp.asarray(rng.standard_normal((args.d, args.n), np.float32) * 0.05)
                  for _ in range(args.matrices))
  sizes = {'all': weights, 'one': weights[:1]}
  run = _loop(args.steps)
  runs = {(size, k): (lambda w=w, x=jnp.ones((k, args.d), jnp.float32): run(x, w))
          for size, w in sizes.items() for k in args.rows}
  seconds = timing.round_robin(runs, args.rounds)  # per loop of args.steps passes

  print(f'[K, {args.d}] x [{args.d}, {args.n}] float32, {jax.devices()[0].platform}, '
        f'median of {args.rounds} interleaved rounds\n')
  print('| weights | MB | K | ms per pass | GB/s | r(K) |')
  print('| --- | --- | --- | --- | --- | --- |')
  for size, w in sizes.items():
    megabytes = sum(x.nbytes for x in w) / 1e6
    one = np.median(seconds[(size, 1)]) / args.steps
    for k in args.rows:
      s = float(np.median(seconds[(size, k)])) / args.steps
      print(f'| {size} | {megabytes:.0f} | {k} | {1e3 * s:.3f} | {megabytes / 1e3 / s:.1f} | '
            f'{s / one:.2f} |')


if __name__ == '__main__':
  main()
