r"""Prints what the decoding loops cost on the bundled pair: fixed, per iteration, per knob.

  python scripts/studies/speed_check.py                    # draft_small (4,096 ids), gamma 3, 12 inputs
  python scripts/studies/speed_check.py --t5x_path /path/with/t5x   # also T5X's sampling loop

One interleaved run, batch 1, Multi30k test inputs decoded to exactly L tokens
(no EOS) for two L, so that the line seconds = fixed + iterations * per_iteration
(spec_decode.harness.loop_costs) splits each decoder's time into what every input pays once
and what each loop iteration costs, at T = 0, at T = 1, and at T = 1 with
top_k 40 and with top_p 0.9 (the draft untruncated, as in the demo). It prints:

  - per-input fixed cost: baseline, speculative, and the draft's own `start`
    (encoder pass + cross-attention K/V) timed alone and as it adds to the
    target's in one program (`loop_costs.start_times`), against the rule
    speculative <= baseline + 1.5 x draft start;
  - ms per iteration of each loop, and what top-k/top-p add to the baseline's;
  - the loops' speedup eq. (1) x baseline / speculative iteration at the given
    alphas (default: the demo's measured ones), per knob;
  - the loops' speedup at the tokens per iteration each loop drew (its own
    acceptance, which its iteration costs carry), and its ratio to plain T = 1's;
  - an iteration's model calls (gamma draft steps and the verify call) timed
    in one loop and apart (`step_costs.StepCostRounds`, i(gamma)): what the two
    models cost each other beyond c_first;
  - with --t5x_path: T5X's `decoding.temperature_sample` driving our step
    function, ms per iteration against our baseline loop's (greedy).
"""

import argparse
import sys

import jax

from spec_decode import data
from spec_decode import decoding
from spec_decode import demo
from spec_decode.harness import loading
from spec_decode.harness import loop_costs
from spec_decode.harness import step_costs
from spec_decode.harness import walltime
from spec_decode import sampling as sampling_lib
from spec_decode import theory

KNOBS = {'T=0': dict(temperature=0.0), 'T=1': dict(temperature=1.0),
         'T=1 top_k=40': dict(temperature=1.0, top_k=40),
         'T=1 top_p=0.9': dict(temperature=1.0, top_p=0.9)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small', choices=['draft_small', 'draft_large'])
  parser.add_argument('--head_size', type=int, default=4096,
                      help="the draft's output layer scores the N most frequent tokens, as in "
                           'the demo (0: all)')
  parser.add_argument('--gamma', type=int, default=3)
  parser.add_argument('--n', type=int, default=12, help='Multi30k test inputs')
  parser.add_argument('--lengths', type=int, nargs=2, default=[1, 40],
                      help='the two output lengths L of the cost line')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--alphas', type=float, nargs=4, default=[0.743, 0.691, 0.719, 0.729],
                      metavar=('T0', 'T1', 'TOPK', 'TOPP'),
                      help='acceptance rates per knob for the predicted speedup (the demo '
                           'measures them; these are its 2026-12-03 values, q untruncated)')
  parser.add_argument('--truncated_draft', action='store_true',
                      help='with top-k/top-p, q truncates as p does (default: q samples at the '
                           'temperature alone, as in the demo)')
  parser.add_argument('--t5x_path', default=None,
                      help='a folder holding the t5x package (its decoding.py suffices)')
  args = parser.parse_args()

  try:
    demo.check_head_size(args.head_size)
  except ValueError as error:
    parser.error(str(error))
  target, draft = demo.load('target'), demo.load_draft(args.draft, head_size=args.head_size)
  examples = data.load_examples('demo_ende', 'test_multi30k', args.n)
  inputs = loading.encode_texts([e['inputs'] for e in examples], 64)
  rng = jax.random.key(0)

  decoders = {}
  for name, knobs in KNOBS.items():
    sampling = sampling_lib.SamplingParams.create(**knobs)
    decoders[f'baseline {name}'] = loop_costs.baseline(target, sampling)
    # As the demo: with top-k/top-p only p truncates (exact for any q; --truncated_draft).
    truncates = 'top_k' in knobs or 'top_p' in knobs
    draft_sampling = sampling.untruncated() if truncates and not args.truncated_draft else None
    decoders[f'speculative {name}'] = loop_costs.speculative(target, draft, args.gamma, sampling,
                                                             draft_sampling)
  if args.t5x_path:
    sys.path.insert(0, args.t5x_path)
    decoders['t5x T=0'] = _t5x_decoder(target)
  loop = loop_costs.measure_loop_costs(decoders, inputs, rng, lengths=args.lengths,
                                       repeats=args.repeats)
  capacity = decoding.cache_length(max(args.lengths), args.gamma)
  starts = loop_costs.start_times(target, draft, inputs, capacity=capacity)
  rounds = step_costs.StepCostRounds(target, draft, inputs[:1], k_max=args.gamma + 1,
                                     max_decode_len=max(args.lengths))
  rounds.add_iterations([args.gamma])
  parts = rounds.timed(7)

  head = f' ({args.head_size} ids)' if args.head_size else ''
  print(f'Bundled target + {args.draft}{head}, gamma {args.gamma}, {args.n} Multi30k inputs, '
        f'L = {args.lengths}, batch 1, median of {args.repeats} (ms)\n')
  print('| decoder | fixed per input | per iteration | tokens per iteration |')
  print('| --- | --- | --- | --- |')
  for name, cost in loop.items():
    print(f'| {name} | {1e3 * cost.fixed_s:.2f} | {1e3 * cost.iteration_s:.3f} | '
          f'{cost.tokens_per_iteration:.2f} |')
  print(f'\n`start` (encoder + cross K/V + fresh cache), each alone: target '
        f'{1e3 * starts["target"]:.2f}, {args.draft} {1e3 * starts["draft"]:.2f}; both in one '
        f'program {1e3 * starts["both"]:.2f}: the draft adds {1e3 * starts["draft_in_program"]:.2f} '
        '(a call alone also pays a dispatch and a wait)')
  g = args.gamma
  apart, apart_first = (theory.summed_iteration_cost(g, parts.c, parts.r, c_first)
                        for c_first in (None, parts.c_first))
  print(f'\nAn iteration\'s model calls ({g} draft steps, then one verify call over {g + 1} '
        f'positions; argmax feeds, no sampling), in target steps of {1e3 * parts.target_s:.3f} ms: '
        f'together i({g}) = {parts.iteration_cost(g):.2f}; apart {g} c + r({g + 1}) = '
        f'{apart:.2f}, or with the first draft step after a target call '
        f'c_first + {g - 1} c + r({g + 1}) = {apart_first:.2f}. '
        f'The difference is what the two models cost each other (evicted weights), in the loop.')

  print('\n| knob | speculative fixed - baseline fixed | 1.5 x draft start (alone; in one '
        'program) | '
        'baseline ms/iteration over T=1\'s | loop speedup at alpha | loop speedup at its '
        'tokens/iteration | over T=1\'s |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  plain = None
  for (name, _), alpha in zip(KNOBS.items(), args.alphas):
    base, spec = loop[f'baseline {name}'], loop[f'speculative {name}']
    speedup = loop_costs.iteration_speedup(alpha, args.gamma, base, spec)
    # Each loop's iterations carry its own acceptance: compare the knobs at it.
    measured = spec.tokens_per_iteration * base.iteration_s / spec.iteration_s
    plain = measured if name == 'T=1' else plain
    print(f'| {name} | {1e3 * (spec.fixed_s - base.fixed_s):.2f} | '
          f'{1.5e3 * starts["draft"]:.2f}; {1.5e3 * starts["draft_in_program"]:.2f} | '
          f'{base.iteration_s / loop["baseline T=1"].iteration_s:.3f} | '
          f'{speedup:.2f}X (alpha {alpha:.2f}) | {measured:.2f}X | '
          f'{"-" if plain is None or name == "T=1" else f"{measured / plain:.3f}"} |')
  if args.t5x_path:
    ratio = loop['baseline T=0'].iteration_s / loop['t5x T=0'].iteration_s
    print(f'\nOur baseline loop / T5X temperature_sample over the same step function, per '
          f'iteration (greedy): {ratio:.3f}')


def _t5x_decoder(target) -> loop_costs.LengthDecodeFn:
  """T5X's greedy temperature_sample over our step function, one jit per length."""
  by_length = {}

  def decode(x, key, length):
    if length not in by_length:
      by_length[length] = walltime.t5x_baseline_decoder(
          target, max_decode_len=length, sampling=sampling_lib.SamplingParams.create(),
          eos_id=loop_costs.NO_EOS)
    return by_length[length](x, key)

  return decode


if __name__ == '__main__':
  main()
