"""What a Llama draft over its target's embedding costs per step: c by layers and head size.

  python scripts/studies/llama_draft_cost.py --target DIR [--layers 1 2 3] [--heads 4096 8192 0]

The draft of spec_decode.llama.draft: the target's width, its first L layers
(float32 here: a bfloat16 draft's packed layers read half the bytes), its
tied output layer pruned to the first N ids (0: the whole vocabulary); both
models packed as the front ends decode them (LlamaModel.with_panels). Prints the target's step, r(K)
for K = 1..6 and each draft's step and c, all timed in one run
(spec_decode.harness.real_pair.step_ms, batch 1, behind a 64-token prompt).
"""

import argparse
import json
import sys

import numpy as np

from spec_decode.harness import real_pair
from spec_decode.llama import draft as draft_lib
from spec_decode.models.llama import LlamaModel
from spec_decode.models.pruned_head import PrunedHeadDraft

PROMPT = 64


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', required=True)
  parser.add_argument('--layers', type=int, nargs='+', default=[1, 2, 3])
  parser.add_argument('--heads', type=int, nargs='+', default=[4096, 8192, 0])
  args = parser.parse_args(argv)
  target = LlamaModel.load(args.target).with_panels()  # as the front ends decode it
  target_ms = [real_pair.step_ms(target, PROMPT, k, steps=8) for k in range(1, 7)]
  print(f'target step {target_ms[0]:.2f} ms; r(1..6) = '
        + ', '.join(f'{t / target_ms[0]:.2f}' for t in target_ms), flush=True)
  rows = []
  for layers in args.layers:
    params = {'embed_tokens': target.params['embed_tokens'], 'norm': target.params['norm'],
              **{f'layers_{i}': target.params[f'layers_{i}'] for i in range(layers)}}
    model = LlamaModel(draft_lib.draft_config(target.config, layers), params)
    for head in args.heads:
      draft = PrunedHeadDraft.create(model, np.arange(head)) if head else model
      ms = real_pair.step_ms(draft, PROMPT, 1, steps=64)
      rows.append({'layers': layers, 'head': head or target.vocab_size, 'ms': ms,
                   'c': ms / target_ms[0]})
      print(f'{layers} layers, head {head or target.vocab_size}: {ms:.2f} ms, '
            f'c = {ms / target_ms[0]:.3f}', flush=True)
  print(json.dumps({'target_ms': target_ms, 'drafts': rows}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
