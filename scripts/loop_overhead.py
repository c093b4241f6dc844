r"""Prints the decoding loops' own work per iteration, with model calls that cost nothing.

  python scripts/loop_overhead.py                      # gamma 0 (baseline), 1, 3, 5; T = 0, 1
  python scripts/loop_overhead.py --gammas 0 4 --temperatures 1
  python scripts/loop_overhead.py --gammas 0 4 --temperatures 1 --knobs plain top_k40 top_p0.9

What a speculative iteration costs beyond its draft steps and verify call
(sampling over the vocabulary, the accept test, bookkeeping): eq. (5) counts
none of it. Compare it with the target step time of `scripts/walltime.py`.

These loops run warm: nothing evicts their code or data between iterations. In
a real loop every target call streams the target's weights through the CPU
cache, and the same work then costs several times more: on the EPYC
(2026-12-03) top_k 40 added 0.24-0.54 ms and top_p 0.9 0.52-0.81 ms to a real
gamma-4 iteration, against 0.06-0.09 and 0.20-0.45 ms here. `scripts/speed_check.py`
and the demo time the real loops.
"""

import argparse

from spec_decode.harness import loop_costs


KNOBS = {'plain': {}, 'top_k40': dict(top_k=40), 'top_p0.9': dict(top_p=0.9)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gammas', type=int, nargs='+', default=[0, 1, 3, 5],
                      help='draft lengths; 0 is the baseline loop')
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--knobs', nargs='+', default=['plain'],
                      choices=['plain', 'top_k40', 'top_p0.9'],
                      help='sampling knobs at each temperature > 0')
  parser.add_argument('--logit_scale', type=float, default=2.0,
                      help="the free logits' standard deviation (8: top-p's nucleus is small)")
  parser.add_argument('--vocab_size', type=int, default=8192)
  parser.add_argument('--max_decode_len', type=int, default=64)
  args = parser.parse_args()
  if any(g < 0 for g in args.gammas):
    parser.error(f'gammas must be >= 0, got {args.gammas}')

  columns = [(t, knob) for t in args.temperatures for knob in (args.knobs if t > 0 else ['plain'])]
  print(f'Loop work per iteration, V = {args.vocab_size}, logits of standard deviation '
        f'{args.logit_scale:g}, batch 1 (ms)\n')
  print('| gamma | ' + ' | '.join(f'T = {t:g}' + ('' if k == 'plain' else f' {k}')
                                  for t, k in columns) + ' |')
  print('| --- |' + ' --- |' * len(columns))
  for gamma in args.gammas:
    seconds = [loop_costs.loop_work_time(gamma=gamma, temperature=t, **KNOBS[knob],
                                         logit_scale=args.logit_scale,
                                         vocab_size=args.vocab_size,
                                         max_decode_len=args.max_decode_len)
               for t, knob in columns]
    cells = [f'{1e3 * s:.3f}' for s in seconds]
    print(f'| {"baseline" if gamma == 0 else gamma} | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
  main()
