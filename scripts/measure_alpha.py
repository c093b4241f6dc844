r"""Measures alpha = E[beta] of drafts against a target (the paper's Table 3).

  python scripts/measure_alpha.py --target_config small --target_checkpoint /ckpt/target \
      --draft_config nano --draft_checkpoint /ckpt/draft --tables unigram bigram \
      --task demo_ende --split test_multi30k --n 200 --temperatures 0 1 --out_dir out/alpha

The target decodes the task's first N inputs (greedy at T = 0, sampled
otherwise); one teacher-forced pass of each model over its outputs gives beta
at every position (spec_decode.models.alpha). Unigram/bigram table drafts are
estimated from the task's training targets. Writes report.md, table3_alpha.csv
and results.json to --out_dir.
"""

import argparse
import pathlib
import sys

import jax
import tqdm

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode.models import drafts as drafts_lib
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode import sampling as sampling_lib

TABLE_ORDERS = {'unigram': 1, 'bigram': 2}


def draft_names(configs: list[str], checkpoints: list[str]) -> list[str]:
  """A report row name per draft: its config's name, with the checkpoint where that repeats.

  Raises:
    SystemExit: the same config and checkpoint given twice.
  """
  stems = [pathlib.Path(spec).stem for spec in configs]
  names = [stem if stems.count(stem) == 1 else f'{stem} ({path})'
           for stem, path in zip(stems, checkpoints)]
  if len(set(names)) < len(names):
    raise SystemExit('error: a draft is given twice (same --draft_config and --draft_checkpoint)')
  return names


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target_config', required=True,
                      help="a t5_1_1 size name (e.g. 'small') or a JSON file of T5Config fields")
  parser.add_argument('--target_checkpoint', required=True, help='T5X, orbax or HF checkpoint')
  parser.add_argument('--draft_config', action='append', default=[],
                      help='a T5 draft config, repeatable (pairs with --draft_checkpoint)')
  parser.add_argument('--draft_checkpoint', action='append', default=[],
                      help='its checkpoint, repeatable')
  parser.add_argument('--tables', nargs='*', default=[], choices=sorted(TABLE_ORDERS),
                      help='table drafts estimated from the training targets')
  parser.add_argument('--add_k', type=float, default=0.01, help='table drafts\' add-k smoothing')
  parser.add_argument('--cache_dir', default=str(pathlib.Path.home() / '.cache' / 'spec_decode'),
                      help='where the tokenized training targets are cached')
  parser.add_argument('--vocab_size', type=int, default=8192, help='vocab_size of size names')
  parser.add_argument('--dtype', default=None, choices=['float32', 'bfloat16'],
                      help='activation dtype override')
  parser.add_argument('--task', default='demo_ende', choices=data.LOCAL_TASKS)
  parser.add_argument('--split', default='test_multi30k')
  parser.add_argument('--n', type=int, default=200, help='inputs (the first N of the split)')
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()
  if len(args.draft_config) != len(args.draft_checkpoint):
    parser.error('give one --draft_checkpoint per --draft_config')
  if not args.draft_config and not args.tables:
    parser.error('no draft: give --draft_config/--draft_checkpoint or --tables')

  target = loading.load_model(args.target_config, args.target_checkpoint, args.vocab_size, args.dtype)
  drafts = {name: loading.load_model(spec, path, args.vocab_size, args.dtype)
            for name, spec, path in zip(draft_names(args.draft_config, args.draft_checkpoint),
                                        args.draft_config, args.draft_checkpoint)}
  if args.tables:
    stream = loading.target_token_stream(args.task, 'train', cache_dir=args.cache_dir)
    for name in args.tables:
      drafts[name] = drafts_lib.TableDraft.estimate(stream, target.config.vocab_size,
                                                    TABLE_ORDERS[name], args.add_k)
  examples = data.load_examples(args.task, args.split, args.n)
  inputs = loading.encode_texts([e['inputs'] for e in examples], args.max_input_len)

  rows = []
  for temperature in args.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    tokens, lengths = alpha_lib.generate_sequences(
        target, inputs, sampling=sampling, max_decode_len=args.max_decode_len,
        rng=jax.random.key(args.seed), batch_size=args.batch_size, progress=True)
    for name, draft in tqdm.tqdm(drafts.items(), desc=f'alpha T={temperature:g}'):
      stats = alpha_lib.measure_alpha(target, draft, inputs, tokens, lengths, sampling=sampling,
                                       batch_size=args.batch_size)
      rows.append(dict(task=args.task, target=pathlib.Path(args.target_config).stem, draft=name,
                       temperature=temperature, **stats.row()))
      tqdm.tqdm.write(f'T={temperature:g} {name}: alpha {stats.alpha:.4f} ± {stats.stderr:.4f} '
                      f'({stats.positions} positions)')

  notes = (f'{args.task}/{args.split}, first {len(inputs)} inputs, max_decode_len '
           f'{args.max_decode_len}.\n\n`{" ".join(sys.argv)}`')
  paths = report.write_report(args.out_dir, title='alpha (Table 3)', alpha_rows=rows,
                              notes=notes)
  print('\n'.join(map(str, paths)))


if __name__ == '__main__':
  main()
