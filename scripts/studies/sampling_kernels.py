r"""Prints the decoding loops' cost lines with sampling's CPU kernels on and off, interleaved.

  python scripts/studies/sampling_kernels.py                  # softmax kernel against XLA's
  python scripts/studies/sampling_kernels.py --kernel thresholds --knobs top_p
  python scripts/studies/sampling_kernels.py --kernel argmax --knobs T0

Sampling turns each step's logits into a distribution (`kernels.distributions.softmax`),
with top-k/top-p cuts it at a threshold (`top_k_threshold`, `top_p_threshold`), and
at temperature 0 takes its argmax (`argmax`).
This study times the bundled pair's baseline and speculative loops (batch 1,
draft_small with its 4,096-id head as in the demo, q untruncated) with the
chosen kernel and with XLA's operations in its place, everything else alike:
the kernel is switched off while the second variant is traced (its
`*_applies` answers False), and that variant takes another eos_id that no
output emits, so each compiles on its own. `harness.loop_costs` fits each
decoder's line seconds = fixed + iterations * per_iteration over two output
lengths, all decoders interleaved per run, and this prints per-iteration
ratios and the loops' speedups.
"""

import argparse

import jax

from spec_decode import data
from spec_decode import demo
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.harness import loading
from spec_decode.harness import loop_costs
from spec_decode.kernels import distributions

KNOBS = {'T0': dict(temperature=0.0), 'T1': dict(temperature=1.0),
         'top_k': dict(temperature=1.0, top_k=40),
         'top_p': dict(temperature=1.0, top_p=0.9)}
SWITCHES = {'softmax': 'softmax_applies', 'thresholds': 'thresholds_apply',
            'argmax': 'argmax_applies'}
EOS = {'kernel': -1, 'xla': -2}  # never emitted; a static argument, so one compile each


def _switchable(name: str) -> dict:
  """Replaces distributions.<name> by a wrapper that answers False while state['xla']."""
  state = {'xla': False}
  original = getattr(distributions, name)
  setattr(distributions, name, lambda x: not state['xla'] and original(x))
  return state


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--kernel', choices=sorted(SWITCHES), default='softmax')
  parser.add_argument('--knobs', nargs='+', choices=sorted(KNOBS), default=['T1', 'top_p'])
  parser.add_argument('--gamma', type=int, default=3)
  parser.add_argument('--n', type=int, default=12, help='Multi30k test inputs')
  parser.add_argument('--lengths', type=int, nargs=2, default=[1, 40])
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  if args.gamma < 1 or args.n < 1 or args.repeats < 1:
    parser.error('gamma, n and repeats must be >= 1')

  state = _switchable(SWITCHES[args.kernel])
  target, draft = demo.load('target'), demo.load_draft('draft_small', head_size=4096)
  examples = data.load_examples('demo_ende', 'test_multi30k', args.n)
  inputs = loading.encode_texts([e['inputs'] for e in examples], 64)

  decoders = {}
  for knob in args.knobs:
    sampling = sampling_lib.SamplingParams.create(**KNOBS[knob])
    draft_sampling = sampling.untruncated() if knob in ('top_k', 'top_p') else None
    for which, eos in EOS.items():
      def baseline(x, key, length, sampling=sampling, eos=eos, xla=which == 'xla'):
        state['xla'] = xla
        return models.generate(target, x, key, max_decode_len=length, sampling=sampling,
                               eos_id=eos)

      def speculative(x, key, length, sampling=sampling, q=draft_sampling, eos=eos,
                      xla=which == 'xla'):
        state['xla'] = xla
        return models.speculative_generate(target, draft, x, key, gamma=args.gamma,
                                           max_decode_len=length, sampling=sampling,
                                           draft_sampling=q, eos_id=eos)
      decoders[knob, 'baseline', which] = baseline
      decoders[knob, 'speculative', which] = speculative
  costs = loop_costs.measure_loop_costs(decoders, inputs, jax.random.key(0),
                                        lengths=args.lengths, repeats=args.repeats)

  print(f'{args.kernel} kernel against XLA, bundled pair + draft_small (4096 ids), gamma '
        f'{args.gamma}, {args.n} Multi30k inputs, L = {args.lengths}, batch 1, median of '
        f'{args.repeats} (ms)\n')
  print('| knob | decoder | kernel: fixed, per iteration | XLA: fixed, per iteration | '
        'per iteration, kernel / XLA |')
  print('| --- | --- | --- | --- | --- |')
  for knob in args.knobs:
    for decoder in ('baseline', 'speculative'):
      k, x = costs[knob, decoder, 'kernel'], costs[knob, decoder, 'xla']
      print(f'| {knob} | {decoder} | {1e3 * k.fixed_s:.2f}, {1e3 * k.iteration_s:.3f} | '
            f'{1e3 * x.fixed_s:.2f}, {1e3 * x.iteration_s:.3f} | '
            f'{k.iteration_s / x.iteration_s:.3f} |')
  print('\n| knob | loop speedup, kernel | loop speedup, XLA |')
  print('| --- | --- | --- |')
  for knob in args.knobs:
    speedup = {which: costs[knob, 'speculative', which].tokens_per_iteration
               * costs[knob, 'baseline', which].iteration_s
               / costs[knob, 'speculative', which].iteration_s for which in EOS}
    print(f'| {knob} | {speedup["kernel"]:.3f}X | {speedup["xla"]:.3f}X |')


if __name__ == '__main__':
  main()
