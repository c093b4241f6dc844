r"""Prints what scoring only the N most frequent tokens buys a draft: c, alpha and speed.

  python scripts/studies/pruned_head.py                          # draft_small, N = 2048, 3072, 4096
  python scripts/studies/pruned_head.py --sizes 3072 --n 50 --temperatures 0

A draft step multiplies its features by the whole output layer, [E, V]; for
draft_small (E = 128, V = 8192) that is 4.2 of the 6.6 MB a step reads.
`models.PrunedHeadDraft` scores only N ids (here the N most frequent in the
task's training targets, `drafts.most_frequent_ids`): the rest get q = 0, so
the output is still exactly the target's, and alpha loses at most the target's
mass outside the ids.

For the full head and each N the script prints the share of training-target
tokens the ids cover, alpha (teacher-forced on the target's own outputs for
the first `--n` Multi30k test sentences, as the demo measures it), c and
c_first, and then decodes those sentences at batch 1 with the baseline and
speculative decoding with each head, interleaved (`walltime.time_decoding`):
ms per generated token, the speedup over the baseline and over the full head's
loop, tokens per target call, and whether greedy outputs equal the baseline's.
"""

import argparse

import jax
import numpy as np

from spec_decode.models import alpha as alpha_lib
from spec_decode import demo
from spec_decode.models import drafts
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import step_costs
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib

TASK, SPLIT = 'demo_ende', 'test_multi30k'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small', choices=['draft_small', 'draft_large'])
  parser.add_argument('--sizes', type=int, nargs='+', default=[2048, 3072, 4096],
                      help='N, the ids each pruned head scores')
  parser.add_argument('--n', type=int, default=24, help='Multi30k test sentences')
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--repeats', type=int, default=3, help='timed runs per input (median)')
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--steps', type=int, default=32, help='calls per loop timing c')
  parser.add_argument('--rounds', type=int, default=5, help='timed rounds of those loops')
  args = parser.parse_args()
  vocab = demo.DEMO_VOCAB_SIZE
  if any(not 2 <= size <= vocab for size in args.sizes):
    parser.error(f'sizes must lie in 2..{vocab}, got {args.sizes}')
  if min(args.n, args.gamma, args.repeats, args.max_decode_len, args.steps, args.rounds) < 1:
    parser.error('n, gamma, repeats, max_decode_len, steps and rounds must be >= 1')

  target, full = demo.load('target'), demo.load(args.draft)
  stream = loading.target_token_stream(TASK, 'train')
  counts = np.bincount(stream, minlength=vocab)
  heads = {'full': (full, 1.0)}
  for size in args.sizes:
    ids = drafts.most_frequent_ids(stream, vocab, size)
    heads[f'N = {size}'] = (models.PrunedHeadDraft.create(full, ids),
                            counts[ids].sum() / counts.sum())
  inputs, _ = experiments.task_inputs(TASK, SPLIT, args.n, 256)
  rng = jax.random.key(0)

  costs = {name: step_costs.measure_step_times(  # c and c_first (r(K) is the target's)
      target, draft, loading.trim_padding(inputs[0])[None], k_max=1,
      max_decode_len=args.max_decode_len,
      num_steps=args.steps, repeats=args.rounds) for name, (draft, _) in heads.items()}
  print(f'{args.draft}, {TASK}/{SPLIT}, first {args.n} sentences, {jax.devices()[0].platform}\n')
  alphas = {}
  for temperature in args.temperatures:
    knobs = sampling_lib.SamplingParams.create(temperature=temperature)
    tokens, lengths = alpha_lib.generate_sequences(target, inputs, sampling=knobs,
                                                    max_decode_len=args.max_decode_len, rng=rng)
    for name, (draft, _) in heads.items():
      alphas[name, temperature] = alpha_lib.measure_alpha(target, draft, inputs, tokens, lengths,
                                                           sampling=knobs).alpha
  header = ' | '.join(f'alpha T={t:g}' for t in args.temperatures)
  print(f'| head | training-target tokens covered | {header} | c | c_first |')
  print('| --- ' * (4 + len(args.temperatures)) + '|')
  for name, (_, covered) in heads.items():
    cells = ' | '.join(f'{alphas[name, t]:.3f}' for t in args.temperatures)
    print(f'| {name} | {covered:.3f} | {cells} | {costs[name].c:.3f} | '
          f'{costs[name].c_first:.3f} |')

  for temperature in args.temperatures:
    knobs = sampling_lib.SamplingParams.create(temperature=temperature)
    decoders = {'baseline': walltime.baseline_decoder(target, max_decode_len=args.max_decode_len,
                                                      sampling=knobs)}
    decoders.update({name: walltime.speculative_decoder(
        target, draft, gamma=args.gamma, max_decode_len=args.max_decode_len, sampling=knobs)
                     for name, (draft, _) in heads.items()})
    decoded = walltime.time_decoding(decoders, inputs, rng, repeats=args.repeats)
    per_token = {name: 1 / experiments.tokens_per_second(d) for name, d in decoded.items()}
    print(f'\nT = {temperature:g}, gamma {args.gamma}, one interleaved run '
          f'(median of {args.repeats} per input)\n')
    print('| decoder | ms per token | speedup | over the full head | tokens per call | '
          'greedy identical |')
    print('| --- | --- | --- | --- | --- | --- |')
    for name, d in decoded.items():
      same = np.mean([a == b for a, b in zip(d.tokens, decoded['baseline'].tokens)])
      over_full = '' if name == 'baseline' else f'{per_token["full"] / per_token[name]:.3f}'
      print(f'| {name} | {1e3 * per_token[name]:.3f} | '
            f'{per_token["baseline"] / per_token[name]:.3f}X | {over_full} | '
            f'{d.tokens_per_call:.2f} | '
            f'{"n/a (sampled)" if temperature > 0 else f"{100 * same:.0f}%"} |')


if __name__ == '__main__':
  main()
