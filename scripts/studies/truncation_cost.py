r"""Prints what top-k's and top-p's truncation costs per row, with the CPU kernel and with XLA.

  python scripts/studies/truncation_cost.py                 # V = 8192 and 32128, 3 rows a call
  python scripts/studies/truncation_cost.py --vocab 32128 --rows 1 5

Sampling with top-k or top-p masks each row of a call (gamma + 1 rows in a
verify call) at a threshold (`spec_decode.sampling`). XLA:CPU finds it with a
TopK over the row's largest entries where it lies among them, else with an
exact bisection of 32 masked sums; on a CPU with the kernels every row's
threshold is one call of `kernels.distributions`' `top_k_threshold` /
`top_p_threshold`. For reference, plain sampling's softmax too (the kernel for
calls of up to `kernels.distributions.SOFTMAX_MAX_ROWS` rows). Each case is compiled twice (the kernels switched
on and off while tracing) and the two are timed round-robin, median over
rounds. Flat and peaked rows: normal logits at scale 0.5 and 6.
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels, sampling
from spec_decode.harness import timing


def _compiled(fn, kernels_on: bool, args: tuple):
  """fn jit-compiled with the kernels switched on or off (read while tracing)."""
  os.environ[kernels.SWITCH] = '1' if kernels_on else '0'
  compiled = jax.jit(lambda *a: fn(*a)).lower(*args).compile()
  return lambda: compiled(*args)


def _cases(vocab: int, rows: int, rng: np.random.Generator) -> dict:
  """name -> (mask function, arguments)."""
  cases = {}
  for name, scale in (('top-p 0.9, flat', 0.5), ('top-p 0.9, peaked', 6.0)):
    logits = jnp.asarray(rng.standard_normal((rows, vocab)) * scale, jnp.float32)
    cases[name] = (sampling.top_p_mask, (jax.nn.softmax(logits, -1), jnp.full((rows, 1), 0.9)))
  logits = jnp.asarray(rng.standard_normal((rows, vocab)), jnp.float32)
  plain = sampling.SamplingParams.create(1.0)  # softmax alone: no cut
  cases['softmax (T = 1, no cut)'] = (lambda x, _: sampling.adjust_sampled(x, plain),
                                      (logits, None))
  for k in (40, 1000):
    cases[f'top-k {k}'] = (sampling.top_k_mask, (logits, jnp.full((rows, 1), k, jnp.int32)))
  return cases


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--vocab', type=int, nargs='+', default=[8192, 32128])
  parser.add_argument('--rows', type=int, nargs='+', default=[3], help='rows per call')
  parser.add_argument('--calls', type=int, default=30, help='calls per timed sample')
  parser.add_argument('--rounds', type=int, default=15)
  args = parser.parse_args()
  if min(args.vocab + args.rows + [args.calls, args.rounds]) < 1:
    parser.error('vocab, rows, calls and rounds must be >= 1')
  if not kernels.in_use():
    raise SystemExit('the CPU kernels are not in use here (see the warning above): nothing to '
                     'compare')

  rng = np.random.default_rng(0)
  print(f'{jax.devices()[0].device_kind}, median of {args.rounds} interleaved rounds of '
        f'{args.calls} calls\n')
  print('| V | rows | mask | kernel µs/row | XLA µs/row | kernel / XLA |')
  print('| --- | --- | --- | --- | --- | --- |')
  for vocab in args.vocab:
    for rows in args.rows:
      for name, (fn, fn_args) in _cases(vocab, rows, rng).items():
        runs = {on: _compiled(fn, on, fn_args) for on in (True, False)}
        loops = {on: (lambda run=run: [run() for _ in range(args.calls)])
                 for on, run in runs.items()}
        seconds = timing.round_robin(loops, args.rounds)
        us = {on: 1e6 * float(np.median(s)) / args.calls / rows for on, s in seconds.items()}
        print(f'| {vocab} | {rows} | {name} | {us[True]:.1f} | {us[False]:.1f} | '
              f'{us[True] / us[False]:.2f} |', flush=True)


if __name__ == '__main__':
  main()
