"""Distillation data for drafts: the target's own outputs as references.

A draft is only useful where it predicts what the target will say, so the
drafts of the bundled trio are fine-tuned on the target's greedy outputs
(sequence-level knowledge distillation, Kim & Rush 2016) rather than on the
human references: alpha at temperature 0 is the rate at which the draft's
argmax agrees with the target's. Sampled outputs (temperature 1) teach the
target's whole distribution instead, which alpha at temperature 1 rewards.

`distill_examples` decodes text inputs with the target and keeps the outputs
that end with EOS (an output cut at max_decode_len would teach the draft to
stop where the target does not). `write_split` / `read_split` store them as
JSON lines {"inputs", "targets", "source"}; `spec_decode.tasks.distilled_task`
serves a folder of such splits as a seqio task to `spec_decode.train`.
"""

import json
import pathlib
from typing import Sequence

import jax
import numpy as np

from spec_decode import data
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.harness import acceptance
from spec_decode.harness import loading

SPLITS = ('train', 'validation')


def select_examples(task: str, split: str, n: int | None, seed: int = 0) -> list[dict[str, str]]:
  """A seeded random subset of a local task split, in file order.

  Args:
    task: a local task of `spec_decode.data` (e.g. 'demo_ende').
    split: one of its splits.
    n: how many examples; None or more than the split holds keeps them all.
    seed: the subset's seed.

  Returns:
    dict(inputs, targets, source='TASK:SPLIT') per example.
  """
  examples = data.load_examples(task, split)
  if n is not None and n < len(examples):
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), n, replace=False))
    examples = [examples[i] for i in keep]
  return [dict(e, source=f'{task}:{split}') for e in examples]


def distill_examples(target: models.T5Model, examples: Sequence[dict[str, str]], *,
                     max_input_len: int, max_decode_len: int, temperature: float = 0.0,
                     seed: int = 0, batch_size: int = 64,
                     progress: bool = True) -> tuple[list[dict[str, str]], int]:
  """Replaces each example's targets by the target model's output.

  Args:
    target: the model to distill.
    examples: dicts with 'inputs' (task prefix included); other keys are kept.
    max_input_len: longer inputs are cut to this many tokens, EOS kept.
    max_decode_len: most output tokens, EOS included.
    temperature: 0 for greedy outputs (what alpha at T = 0 rewards); 1 for
      samples of p (a draft that matches the whole distribution, T = 1).
    seed: of the samples (temperature > 0).
    batch_size: decoding batch size.
    progress: show a progress bar.

  Returns:
    (records, dropped): the examples whose output ended with EOS within
    max_decode_len, 'targets' replaced by the output text, and how many
    examples were dropped for running out of length.
  """
  # Batches of similar input length finish decoding at similar steps.
  order = np.argsort([len(e['inputs']) for e in examples], kind='stable')
  inputs = loading.encode_texts([examples[i]['inputs'] for i in order], max_input_len)
  sorted_tokens, sorted_lengths = acceptance.generate_sequences(
      target, inputs, sampling=sampling_lib.SamplingParams.create(temperature),
      max_decode_len=max_decode_len, rng=jax.random.key(seed), batch_size=batch_size,
      progress=progress)
  tokens, lengths = np.empty_like(sorted_tokens), np.empty_like(sorted_lengths)
  tokens[order], lengths[order] = sorted_tokens, sorted_lengths
  records = []
  for example, row, length in zip(examples, tokens, lengths):
    if length and row[length - 1] == loading.EOS_ID:
      records.append(dict(example, targets=loading.detokenize(row[:length])))
  return records, len(examples) - len(records)


def write_split(path: str | pathlib.Path, records: Sequence[dict[str, str]]) -> None:
  """Writes records as JSON lines (UTF-8), creating the folder."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + '\n')


def read_split(data_dir: str | pathlib.Path, split: str) -> list[dict[str, str]]:
  """The records of DATA_DIR/SPLIT.jsonl, each with string inputs and targets.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a line without string 'inputs' and 'targets'.
  """
  path = pathlib.Path(data_dir) / f'{split}.jsonl'
  if not path.exists():
    raise FileNotFoundError(f'No distilled split {path} (write it with scripts/distill.py).')
  records = []
  with open(path, encoding='utf-8') as f:
    for number, line in enumerate(f, start=1):
      record = json.loads(line)
      if not all(isinstance(record.get(k), str) for k in ('inputs', 'targets')):
        raise ValueError(f'{path} line {number}: needs string "inputs" and "targets".')
      records.append(record)
  return records
