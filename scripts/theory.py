r"""Prints the paper's Table 1, or the best gamma for given alpha and c.

  python scripts/theory.py                       # Table 1 (c = c_hat = 0)
  python scripts/theory.py --alpha 0.6 0.75 0.9 --c 0.05 0.2 --gamma_max 20
"""

import argparse

import numpy as np

from spec_decode import theory


def _markdown(header: list[str], rows: list[list[str]]) -> str:
  lines = [header, ['---'] * len(header)] + rows
  return '\n'.join('| ' + ' | '.join(line) + ' |' for line in lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--alpha', type=float, nargs='+',
                      help='acceptance rates; prints the best gamma for each')
  parser.add_argument('--c', type=float, nargs='+', default=[0.0],
                      help='draft/target step time ratios (default 0)')
  parser.add_argument('--c_hat', type=float, default=None,
                      help='draft/target operations ratio (default: each c)')
  parser.add_argument('--gamma_max', type=int, default=30,
                      help='largest gamma searched (default 30)')
  args = parser.parse_args()

  if args.alpha is None:
    rows = [[f"{r['alpha']:.1f}", str(r['gamma']), f"{r['operations']:.2f}X",
             f"{r['speed']:.2f}X"] for r in theory.table1()]
    print('Table 1 (c = c_hat = 0)\n')
    print(_markdown(['alpha', 'gamma', 'operations', 'speed'], rows))
    return

  alpha, c = np.meshgrid(args.alpha, args.c, indexing='ij')
  gamma, speed = theory.best_gamma(alpha, c, args.gamma_max)
  c_hat = c if args.c_hat is None else args.c_hat
  ops = theory.operations_factor(alpha, gamma, c_hat)
  tokens = theory.expected_tokens(alpha, gamma)
  rows = [[f'{a:g}', f'{cc:g}', str(g), f'{t:.2f}', f'{s:.2f}X', f'{o:.2f}X']
          for a, cc, g, t, s, o in zip(alpha.ravel(), c.ravel(), gamma.ravel(),
                                       tokens.ravel(), speed.ravel(),
                                       ops.ravel())]
  print(f'Best gamma in 1..{args.gamma_max} (speed < 1X: do not speculate)\n')
  print(_markdown(
      ['alpha', 'c', 'best gamma', 'tokens/call', 'speed', 'operations'], rows))


if __name__ == '__main__':
  main()
