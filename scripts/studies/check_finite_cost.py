r"""Measures what the non-finite logits check costs: walltime with it over without.

  python scripts/studies/check_finite_cost.py      # bundled pair, 64 Multi30k inputs, batches of 8

One interleaved run, as scripts/decode.py decodes (batches, EOS ends rows):
for the baseline and for speculative decoding (the bundled target and
draft_small, gamma 3) at T = 0 and T = 1, every batch is decoded with
check_finite off and on, back to back (in alternating order), --repeats
times. Prints, per decoder, the median seconds of the whole set without and
with the check, and the median (and quartiles) of the with / without ratio
over the pairs; decode.py turns the check on by default (CHECK_FINITE)
because that ratio stays within about 1.02 (docs/results/check-finite-cost/).
"""

import argparse
import time

import jax
import numpy as np

from spec_decode import data
from spec_decode import demo
from spec_decode.harness import loading
from spec_decode import models
from spec_decode import sampling as sampling_lib


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--n', type=int, default=64, help='Multi30k test inputs')
  parser.add_argument('--batch_size', type=int, default=8)
  parser.add_argument('--gamma', type=int, default=3)
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()

  target, draft = demo.load('target'), demo.load('draft_small')
  examples = data.load_examples('demo_ende', 'test_multi30k', args.n)
  inputs = loading.encode_texts([e['inputs'] for e in examples], 64)
  batches = [inputs[i:i + args.batch_size] for i in range(0, len(inputs), args.batch_size)]
  batches = [b for b in batches if len(b) == args.batch_size]  # one compiled shape
  keys = jax.random.split(jax.random.key(0), args.batch_size)

  decoders = {}
  for temperature in (0.0, 1.0):
    sampling = sampling_lib.SamplingParams.create(temperature)
    for check in (False, True):
      common = dict(max_decode_len=args.max_decode_len, sampling=sampling, check_finite=check)
      decoders['baseline', temperature, check] = (
          lambda x, common=common: models.generate(target, x, keys, **common))
      decoders['speculative', temperature, check] = (
          lambda x, common=common: models.speculative_generate(target, draft, x, keys,
                                                               gamma=args.gamma, **common))
  for decode in decoders.values():
    jax.block_until_ready(decode(batches[0]))

  # Each batch runs without and with the check back to back (the order
  # alternating), so that the machine's drift cancels in each pair's ratio.
  pairs = sorted({name[:2] for name in decoders})
  seconds = {name: np.zeros((args.repeats, len(batches))) for name in decoders}
  for r in range(args.repeats):
    for kind, temperature in pairs:
      for i, batch in enumerate(batches):
        for check in ((False, True) if (r + i) % 2 == 0 else (True, False)):
          start = time.perf_counter()
          jax.block_until_ready(decoders[kind, temperature, check](batch))
          seconds[kind, temperature, check][r, i] = time.perf_counter() - start

  print(f'Bundled target + draft_small, gamma {args.gamma}, {len(batches)} batches of '
        f'{args.batch_size} Multi30k inputs, max_decode_len {args.max_decode_len}, '
        f'{args.repeats} interleaved runs\n')
  print('| decoder | T | s per set, without check | with check | with / without, median of '
        'pairs (25th-75th percentile) |')
  print('| --- | --- | --- | --- | --- |')
  for kind, temperature in pairs:
    off, on = seconds[kind, temperature, False], seconds[kind, temperature, True]
    low, mid, high = np.percentile(on / off, [25, 50, 75])
    print(f'| {kind} | {temperature:g} | {np.median(off.sum(1)):.3f} | '
          f'{np.median(on.sum(1)):.3f} | {mid:.3f} ({low:.3f}-{high:.3f}) |')

if __name__ == '__main__':
  main()
