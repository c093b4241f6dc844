r"""Output quality of a model on test splits: greedy decoding, BLEU or ROUGE.

  python scripts/evaluate.py --config demo_target \
      --checkpoint spec_decode/data/models/target \
      --splits demo_ende:test_multi30k demo_ende:test_ddtp demo_debsum:test \
      --out out/quality.json

Decodes every input of each split greedily in batches with the baseline
(speculative decoding gives the same tokens), then scores sacreBLEU (demo_ende)
or ROUGE-1/2/Lsum (demo_debsum) against the references.
"""

import argparse
import json
import pathlib

import jax

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode import sampling as sampling_lib


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', required=True, help='a t5_1_1 size name or a JSON file')
  parser.add_argument('--checkpoint', required=True)
  parser.add_argument('--splits', nargs='+', required=True, help='TASK:SPLIT, e.g. demo_ende:test_ddtp')
  parser.add_argument('--n', type=int, default=None, help='only the first N inputs of each split')
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=128)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--out', required=True, help='JSON file of the scores')
  args = parser.parse_args()

  model = loading.load_model(args.config, args.checkpoint)
  scores = {}
  for spec in args.splits:
    task, _, split = spec.partition(':')
    examples = data.load_examples(task, split, args.n)
    inputs = loading.encode_texts([e['inputs'] for e in examples], args.max_input_len)
    tokens, lengths = alpha_lib.generate_sequences(
        model, inputs, sampling=sampling_lib.SamplingParams.create(),
        max_decode_len=args.max_decode_len, rng=jax.random.key(0),
        batch_size=args.batch_size, progress=True)
    predictions = [loading.detokenize(row[:n]) for row, n in zip(tokens, lengths)]
    scores[spec] = dict(n=len(examples), **experiments.METRICS[task](
        [e['targets'] for e in examples], predictions))
    scores[spec]['examples'] = [dict(inputs=e['inputs'], target=e['targets'], output=p)
                                for e, p in list(zip(examples, predictions))[:3]]
    print(spec, {k: v for k, v in scores[spec].items() if k != 'examples'}, flush=True)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(args.out).write_text(json.dumps(scores, indent=1, ensure_ascii=False),
                                    encoding='utf-8')


if __name__ == '__main__':
  main()
