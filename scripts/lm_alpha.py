"""The GPT-like row of the paper's Table 3 for a decoder-only pair: alpha of its draft,

and of unigram and bigram drafts, at T = 0 and T = 1, beside the paper's figures.

  python scripts/lm_alpha.py --n 200 --out_dir out/lm_alpha

Prompts are the first PROMPT_TOKENS tokens of the first N English sentences of
Multi30k test; the target continues each (greedy, or sampled with key
fold_in(key(seed), i)) for at most MAX_DECODE_LEN tokens, and alpha is the mean
of beta = sum_x min(p(x), q(x)) over the continuations' tokens
(spec_decode.models.alpha.measure_alpha), with a cluster-robust standard
error. The n-gram drafts are estimated from the training text
(spec_decode.training.lm). Defaults: the bundled pair.
"""

import argparse
import json
import pathlib
import sys

import jax
import numpy as np

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode.models import drafts
from spec_decode.models import decoder_only
from spec_decode import sampling as sampling_lib
from spec_decode.training import lm as lm_training

# Leviathan et al. 2023, Table 3: GPT-like (97M) target, LM1B.
PAPER = {'draft (6M)': (0.88, 0.89), 'unigram': (0.03, 0.03), 'bigram': (0.05, 0.05)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', help='a checkpoint of lm_target\'s size; default the bundled one')
  parser.add_argument('--draft', help='a checkpoint of lm_draft\'s size; default the bundled one')
  parser.add_argument('--n', type=int, default=200)
  parser.add_argument('--prompt_tokens', type=int, default=3)
  parser.add_argument('--max_decode_len', type=int, default=32)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out_dir')
  args = parser.parse_args(argv)

  target = decoder_only.load_bundled('lm_target', path=args.target)
  draft = decoder_only.load_bundled('lm_draft', path=args.draft)
  stream = np.concatenate(lm_training.sequences('train'))
  q = {'draft': draft, **{name: drafts.TableDraft.estimate(stream, data.VOCAB_SIZE, order)
                          for name, order in (('unigram', 1), ('bigram', 2))}}
  tokens, lengths = lm_training.prompts_from_test(args.n, args.prompt_tokens)
  rows = []
  for temperature in (0.0, 1.0):
    sampling = sampling_lib.SamplingParams.create(temperature)
    outputs, output_lengths = alpha_lib.generate_sequences(
        target, tokens, lengths=lengths, sampling=sampling, max_decode_len=args.max_decode_len,
        rng=jax.random.key(args.seed), batch_size=64)
    for name, model in q.items():
      stats = alpha_lib.measure_alpha(target, model, tokens, outputs, output_lengths,
                                      lengths=lengths, sampling=sampling, batch_size=64)
      rows.append({'draft': name, 'temperature': temperature, **stats.row()})
      print(f'T={temperature:g} {name:8s} alpha {stats.alpha:.3f} +- {stats.stderr:.3f} '
            f'({stats.positions} tokens)', flush=True)
  paper = dict(zip(('draft', 'unigram', 'bigram'), PAPER.values()))
  lines = ['| draft | alpha T=0 | alpha T=1 | paper T=0 | paper T=1 |', '| --- | --- | --- | --- | --- |']
  for name in q:
    ours = [r for r in rows if r['draft'] == name]
    lines.append(f'| {name} | ' + ' | '.join(f'{r["alpha"]:.3f} ± {r["stderr"]:.3f}' for r in ours)
                 + f' | {paper[name][0]:.2f} | {paper[name][1]:.2f} |')
  print('\n'.join(lines))
  if args.out_dir:
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'alpha.json').write_text(json.dumps({'args': vars(args), 'rows': rows}, indent=1))
    (out / 'table3_lm.md').write_text('\n'.join(lines) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
