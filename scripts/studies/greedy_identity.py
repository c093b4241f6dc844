r"""Counts greedy speculative outputs that differ from the greedy baseline's, per precision.

  python scripts/studies/greedy_identity.py                 # 200 Multi30k inputs, gamma 4 and 7
  python scripts/studies/greedy_identity.py --n 50 --gammas 3

Greedy speculative decoding emits the target's argmax at every position, so
its output equals the baseline's token for token when both compute the same
logits. They compute them in different shapes (a verify call scores gamma + 1
positions at once, the baseline one), and in bfloat16 compute the rounding of
the two differs enough to flip near-ties of the argmax. For the bundled target
and draft at three precisions (float32; bfloat16 parameters with float32
compute; bfloat16 parameters and compute), decodes the first --n Multi30k test
inputs in batches with the baseline and with speculative decoding at each
--gammas, and prints how many outputs differ.
"""

import argparse
import dataclasses

import jax
import numpy as np
import tqdm

from spec_decode import checkpoints
from spec_decode import data
from spec_decode import demo
from spec_decode.harness import loading
from spec_decode import models

# name: (param_dtype, dtype)
PRECISIONS = {'float32': ('float32', 'float32'),
              'bfloat16 parameters, float32 compute': ('bfloat16', 'float32'),
              'bfloat16 parameters and compute': ('bfloat16', 'bfloat16')}


def _load(name: str, param_dtype: str, dtype: str) -> models.T5Model:
  config = dataclasses.replace(demo.config(name), param_dtype=param_dtype, dtype=dtype)
  return models.T5Model(config, checkpoints.load_params(str(demo.MODELS_DIR / name), config))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--n', type=int, default=200, help='Multi30k test inputs')
  parser.add_argument('--gammas', type=int, nargs='+', default=[4, 7])
  parser.add_argument('--draft', default='draft_small', choices=['draft_small', 'draft_large'])
  parser.add_argument('--batch_size', type=int, default=20)
  parser.add_argument('--max_decode_len', type=int, default=64)
  args = parser.parse_args()

  examples = data.load_examples('demo_ende', 'test_multi30k', args.n)
  inputs = loading.encode_texts([e['inputs'] for e in examples], 64)
  batches = [inputs[i:i + args.batch_size] for i in range(0, len(inputs), args.batch_size)]
  key = jax.random.key(0)
  # Each precision's rows as soon as they are counted: a run cut short keeps what it finished.
  print(f'Bundled target + {args.draft}, first {len(inputs)} Multi30k test inputs, greedy, '
        f'batches of {args.batch_size}, max_decode_len {args.max_decode_len}\n', flush=True)
  print('| precision | gamma | outputs differing from the baseline |')
  print('| --- | --- | --- |', flush=True)
  for precision, dtypes in PRECISIONS.items():
    target, draft = _load('target', *dtypes), _load(args.draft, *dtypes)
    differ = dict.fromkeys(args.gammas, 0)
    for batch in tqdm.tqdm(batches, desc=precision, unit='batch'):
      base = models.generate(target, batch, key, max_decode_len=args.max_decode_len)
      for gamma in args.gammas:
        spec = models.speculative_generate(target, draft, batch, key, gamma=gamma,
                                           max_decode_len=args.max_decode_len)
        differ[gamma] += int(np.sum(np.any(np.asarray(spec.tokens) != np.asarray(base.tokens),
                                           axis=1)))
    for gamma, count in differ.items():
      print(f'| {precision} | {gamma} | {count}/{len(inputs)} '
            f'({100 * count / len(inputs):.1f}%) |', flush=True)


if __name__ == '__main__':
  main()
