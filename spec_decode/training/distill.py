"""Distillation data for drafts: the target's own outputs as references.

A draft is only useful where it predicts what the target will say, so the
drafts of the bundled trio are fine-tuned on the target's greedy outputs
(sequence-level knowledge distillation, Kim & Rush 2016) rather than on the
human references: alpha at temperature 0 is the rate at which the draft's
argmax agrees with the target's. Sampled outputs (temperature 1) teach the
target's whole distribution instead, which alpha at temperature 1 rewards.

`distill_examples` decodes text inputs with the target and keeps the outputs
that end with EOS (an output cut at max_decode_len would teach hard labels to
stop where the target does not). `write_split` / `read_split` store them as
JSON lines {"inputs", "targets", "source"}; `spec_decode.training.tasks.distilled_task`
serves a folder of such splits as a seqio task to `spec_decode.training.train`.
With keep_unfinished the outputs cut at max_decode_len are kept too, as
{..., "target_ids", "finished": false}: white-box distillation learns p on
their prefixes (the target's repetition loops are where a draft trained on
finished outputs only disagrees at every position), the seqio task skips them.

White-box distillation (`spec_decode.training.whitebox`) trains on the target's whole
distributions instead, over a `Mixture` of sequences: the tasks' references,
such records, and the draft's own samples (on-policy), drawn anew as it trains.
"""

import itertools
import json
import pathlib
from typing import Any, Iterator, Sequence

import jax
import numpy as np

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import text as text_lib
from spec_decode.training import batches as batches_lib

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
                     seed: int = 0, batch_size: int = 64, keep_unfinished: bool = False,
                     progress: bool = True) -> tuple[list[dict[str, Any]], int]:
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
    keep_unfinished: keep the outputs that reach max_decode_len without EOS,
      with their ids ('target_ids', no EOS) and 'finished': False.
    progress: show a progress bar.

  Returns:
    (records, unfinished): the examples whose output ended with EOS within
    max_decode_len (all of them with keep_unfinished), 'targets' replaced by
    the output text; and how many outputs ran out of length (dropped unless
    keep_unfinished).
  """
  # Batches of similar input length finish decoding at similar steps.
  order = np.argsort([len(e['inputs']) for e in examples], kind='stable')
  inputs = data.vocabulary().encode_batch([examples[i]['inputs'] for i in order], max_input_len)
  sorted_tokens, sorted_lengths = alpha_lib.generate_sequences(
      target, inputs, sampling=sampling_lib.SamplingParams.create(temperature),
      max_decode_len=max_decode_len, rng=jax.random.key(seed), batch_size=batch_size,
      progress=progress)
  tokens, lengths = np.empty_like(sorted_tokens), np.empty_like(sorted_lengths)
  tokens[order], lengths[order] = sorted_tokens, sorted_lengths
  records, unfinished = [], 0
  for example, row, length in zip(examples, tokens, lengths):
    text = data.vocabulary().decode(row[:length])
    if length and row[length - 1] == text_lib.EOS_ID:
      records.append(dict(example, targets=text))
      continue
    unfinished += 1
    if keep_unfinished:
      records.append(dict(example, targets=text, target_ids=row[:length].tolist(), finished=False))
  return records, unfinished


def write_split(path: str | pathlib.Path, records: Sequence[dict[str, str]]) -> None:
  """Writes records as JSON lines (UTF-8), creating the folder."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + '\n')


def read_split(data_dir: str | pathlib.Path, split: str) -> list[dict[str, Any]]:
  """The records of DATA_DIR/SPLIT.jsonl, each with string inputs and targets.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a line without string 'inputs' and 'targets', or with
      'target_ids' that are not a list of token ids.
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
      ids = record.get('target_ids', [])
      if not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
        raise ValueError(f'{path} line {number}: "target_ids" must be a list of token ids.')
      records.append(record)
  return records


# White-box distillation (spec_decode.training.whitebox) trains on a mix of sequences:
# references, the target's outputs (records above) and the draft's own samples.

ROWS = 64  # rows per decoding or scoring call of on-policy and evaluation samples
Example = tuple[list[int], list[int]]  # (input ids, output ids), each ending with EOS unless cut


def _shuffled(items: Sequence[Any], rng: np.random.Generator) -> Iterator[Any]:
  """Endless passes over `items`, each in a fresh random order."""
  while True:
    yield from (items[i] for i in rng.permutation(len(items)))


def _weighted(streams: Sequence[Iterator[Any]], weights: Sequence[float],
              rng: np.random.Generator) -> Iterator[Any]:
  """Each item from streams[i] with probability weights[i] / sum(weights)."""
  shares = np.asarray(weights, np.float64) / np.sum(weights)
  while True:
    yield next(streams[rng.choice(len(streams), p=shares)])


def _features(example: Example, input_len: int, output_len: int) -> dict[str, np.ndarray]:
  """A padded example: encoder inputs [input_len], decoder inputs and mask [output_len]."""
  inputs, outputs = example
  features = {'encoder_input_tokens': np.zeros(input_len, np.int32),
              'decoder_input_tokens': np.zeros(output_len, np.int32),
              'decoder_loss_weights': np.zeros(output_len, np.int32)}
  features['encoder_input_tokens'][:len(inputs)] = inputs
  features['decoder_input_tokens'][1:len(outputs)] = outputs[:-1]  # shifted right after 0
  features['decoder_loss_weights'][:len(outputs)] = 1
  return features


def _samples(model: models.T5Model, inputs: Sequence[list[int]], cfg: Any,
             temperature: float, rng: jax.Array) -> list[Example]:
  """One sample of `model` per input, cut at max_decode_len if it has no EOS.

  Inputs are decoded by input bucket, padded to it (one compiled loop per
  bucket, and short inputs do not pay for long ones), ROWS at a time.
  """
  samples = [None] * len(inputs)
  buckets = {}
  for i, x in enumerate(inputs):
    buckets.setdefault(next(b for b in cfg.input_buckets if b >= len(x)), []).append(i)
  for length, members in buckets.items():
    tokens = np.zeros((len(members), length), np.int32)
    for row, i in enumerate(members):
      tokens[row, :len(inputs[i])] = inputs[i]
    outputs, lengths = alpha_lib.generate_sequences(
        model, tokens, sampling=sampling_lib.SamplingParams.create(temperature),
        max_decode_len=cfg.max_decode_len, rng=jax.random.fold_in(rng, length),
        batch_size=min(ROWS, len(inputs)))  # one batch shape whatever the bucket holds
    for i, output, n in zip(members, outputs, lengths):
      samples[i] = (inputs[i], output[:n].tolist())
  return samples


class Mixture:
  """A run's training sequences: references, the target's outputs, the draft's samples.

  Attributes:
    examples: endless Examples, each one's source drawn by weight.
    pool: the on-policy Examples, cycled through; `refresh` replaces them
      (and must come first when on_policy_weight > 0).
  """

  def __init__(self, cfg: Any, seed: int):
    self.cfg, self.pool = cfg, []
    rng = np.random.default_rng(seed)
    self._references = _weighted([_shuffled(data.load_examples(task, 'train'), rng)
                                  for task, _ in cfg.tasks], [w for _, w in cfg.tasks], rng)
    sources = {}
    if cfg.reference_weight:
      sources[self._tokenized(self._references)] = cfg.reference_weight
    if cfg.distilled_weight:
      records = _shuffled(read_split(cfg.distill_dir, 'train'), rng)
      sources[self._tokenized(records)] = cfg.distilled_weight
    if cfg.on_policy_weight:
      sources[(self.pool[i % len(self.pool)] for i in itertools.count())] = cfg.on_policy_weight
    self.examples = _weighted(list(sources), list(sources.values()), rng)

  def _tokenized(self, records: Iterator[dict[str, Any]]) -> Iterator[Example]:
    encode = data.vocabulary().encode_input
    for record in records:
      inputs = encode(record['inputs'], self.cfg.input_buckets[-1])
      if 'target_ids' in record:  # an unfinished output: its own ids, no EOS
        yield inputs, record['target_ids'][:self.cfg.target_buckets[-1]]
      else:
        yield inputs, encode(record['targets'], self.cfg.target_buckets[-1])

  def refresh(self, draft: models.T5Model, rng: jax.Array) -> dict[str, float]:
    """Makes the pool the draft's samples for the next on_policy_samples inputs.

    Returns:
      The samples' mean length and the share that ends with EOS.
    """
    inputs = [data.vocabulary().encode_input(next(self._references)['inputs'],
                                             self.cfg.input_buckets[-1])
              for _ in range(self.cfg.on_policy_samples)]
    self.pool = _samples(draft, inputs, self.cfg, self.cfg.on_policy_temperature, rng)
    return {'on_policy_length': float(np.mean([len(y) for _, y in self.pool])),
            'on_policy_eos': float(np.mean([y[-1:] == [text_lib.EOS_ID] for _, y in self.pool]))}

  def batches(self) -> Iterator[dict[str, np.ndarray]]:
    """The examples in length buckets (`spec_decode.training.batches.bucketed_batches`).

    Yields:
      encoder_input_tokens [rows, Li], decoder_input_tokens and
      decoder_loss_weights [rows, Lt].
    """
    sizes = (self.cfg.input_buckets[-1], self.cfg.target_buckets[-1])
    return batches_lib.bucketed_batches((_features(e, *sizes) for e in self.examples),
                                      self.cfg.train_config())
