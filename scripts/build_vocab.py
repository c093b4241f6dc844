r"""Trains the 8k SentencePiece vocabulary of the local demo tasks.

Training text: the bundled TRAINING splits only (both sides of the En-De
pairs, Debian summaries, a sample of Debian description paragraphs), never
the prefixes. T5 conventions: pad 0, eos 1, unk 2, no bos, no extra ids.
The sample, the input order and the trainer are fixed, so rerunning it gives
the same model file.

  python scripts/build_vocab.py [--output spec_decode/data/vocab/spm_8k.model]
"""

import argparse
import io
import pathlib
import random
import tempfile

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from spec_decode import data

VOCAB_SIZE = 8192
SEED = 0
MAX_LINE_BYTES = 4192  # SentencePiece's max_sentence_length default.


def training_lines(description_fraction: float) -> list[str]:
  """Training-split text lines, description paragraphs subsampled."""
  lines = []
  for en, de in data.translation_pairs('train'):
    lines += [en, de]
  paragraphs = []
  for document, summary in data.summarization_pairs('train'):
    lines.append(summary)
    paragraphs += document.split('\n')
  rng = random.Random(SEED)
  lines += rng.sample(paragraphs, round(description_fraction * len(paragraphs)))
  return [line for line in lines
          if line.strip() and len(line.encode()) <= MAX_LINE_BYTES]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--output', type=pathlib.Path, default=data.VOCAB_PATH)
  parser.add_argument('--description_fraction', type=float, default=0.25,
                      help='fraction of Debian description paragraphs used')
  parser.add_argument('--num_threads', type=int, default=2)
  args = parser.parse_args()

  lines = training_lines(args.description_fraction)
  print(f'Training on {len(lines)} lines, {sum(map(len, lines))} characters.')
  model = io.BytesIO()
  with tempfile.NamedTemporaryFile('w', encoding='utf-8', suffix='.txt') as f:
    f.write('\n'.join(lines) + '\n')
    f.flush()
    spm.SentencePieceTrainer.train(
        input=f.name,
        model_writer=model,
        model_type='unigram',
        vocab_size=VOCAB_SIZE,
        character_coverage=0.9999,
        byte_fallback=True,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
        input_sentence_size=0,  # Use every line: the sample above is seeded.
        shuffle_input_sentence=False,
        num_threads=args.num_threads,
        minloglevel=1,
    )
  proto = sentencepiece_model_pb2.ModelProto.FromString(model.getvalue())
  proto.trainer_spec.ClearField('input')  # The temp file's random name.
  args.output.parent.mkdir(parents=True, exist_ok=True)
  args.output.write_bytes(proto.SerializeToString())
  print(f'Wrote {args.output} ({args.output.stat().st_size} bytes).')


if __name__ == '__main__':
  main()
