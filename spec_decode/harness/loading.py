"""Configs, models, the bundled vocabulary and texts for the measurements.

`parse_config` reads a `t5_1_1` size or a JSON file of T5Config fields,
`load_model` a checkpoint onto it; `encode_texts` turns texts into one-shape
encoder inputs (`trim_padding` cuts one back to its own length bucket),
`detokenize` output ids back into text, and
`target_token_stream` a task's targets into the id stream table drafts are
estimated from. A `Draft` is a T5Model or any provider of `spec_decode.models.drafts`.
"""

import dataclasses
import functools
import json
import pathlib
from typing import Sequence

import numpy as np
import sentencepiece as spm

from spec_decode import data
from spec_decode.models import drafts
from spec_decode import models
from spec_decode.t5.config import T5Config, of_size, t5_1_1

from spec_decode.text import EOS_ID

# Batch-1 timing decodes each input in the smallest length bucket that holds it:
# 32, 64, 128, ... tokens (`trim_padding`), one compile per bucket and decoder (the
# demo took 114 s with buckets from 16, 85 s from 32: EPYC, one run each).
INPUT_BUCKET = 32


def parse_config(spec: str, vocab_size: int = 8192, dtype: str | None = None) -> T5Config:
  """A T5Config from a size name of `t5_1_1`, a bundled model's, or a JSON file.

  Args:
    spec: e.g. 'small' (with `vocab_size`, default the bundled 8k vocabulary),
      'demo_target' ('demo_' + a name of data.MODEL_SIZES), or 'target.json'
      holding {"vocab_size": 8192, "emb_dim": 512, ...}.
    vocab_size: vocab_size of a size name; a JSON file has its own.
    dtype: activation dtype override ('float32' or 'bfloat16'), None keeps it.
  """
  if spec.endswith('.json'):
    config = T5Config(**json.loads(pathlib.Path(spec).read_text()))
  elif spec.startswith('demo_') and spec.removeprefix('demo_') in data.MODEL_SIZES:
    config = of_size(data.MODEL_SIZES[spec.removeprefix('demo_')], vocab_size=vocab_size)
  else:
    config = t5_1_1(spec, vocab_size=vocab_size)
  return config if dtype is None else dataclasses.replace(config, dtype=dtype)


def load_model(spec: str, checkpoint: str, vocab_size: int = 8192,
               dtype: str | None = None) -> models.T5Model:
  """A T5Model from a config spec (see `parse_config`) and a checkpoint path."""
  config = parse_config(spec, vocab_size, dtype)
  return models.T5Model.load(checkpoint, config)


@functools.cache
def tokenizer() -> spm.SentencePieceProcessor:
  """The bundled SentencePiece vocabulary (pad 0, EOS 1)."""
  return spm.SentencePieceProcessor(model_file=str(data.VOCAB_PATH))


def encode(text: str, max_len: int) -> list[int]:
  """Text -> ids ending with EOS, cut to max_len tokens (EOS kept): the bundled vocabulary's."""
  return data.vocabulary().encode_input(text, max_len)


def encode_texts(texts: Sequence[str], max_input_len: int, multiple: int = 16) -> np.ndarray:
  """[N, S] int32 encoder inputs of one shape: `text.Vocabulary.encode_batch` (bundled)."""
  return data.vocabulary().encode_batch(texts, max_input_len, multiple)


def trim_padding(tokens: np.ndarray, smallest: int = INPUT_BUCKET) -> np.ndarray:
  """One encoder input without the padding beyond its own length bucket.

  A batch-1 decoder need not run its encoder over the padding of a batch's
  longest input: the encoder's cost grows with the padded length, and the
  padding is masked anyway, so the outputs are the same. The buckets are
  smallest, 2 x smallest, 4 x smallest, ... tokens, so that inputs of up to
  S tokens need at most log2(S / smallest) + 1 compiled shapes.

  Args:
    tokens: [S] int32 ids, 0-padded at the end (a row of `encode_texts`).
    smallest: the smallest bucket.

  Returns:
    [S'] the first S' ids: S' is the smallest bucket that holds the input up
    to its last nonzero id, or S where that is shorter.

  Raises:
    ValueError: tokens that are not one row, or a smallest bucket below 1.
  """
  tokens = np.asarray(tokens)
  if tokens.ndim != 1:
    raise ValueError(f'trim_padding takes one input [S], got shape {tokens.shape}')
  if smallest < 1:
    raise ValueError(f'the smallest bucket must be >= 1, got {smallest}')
  length, bucket = int(np.max(np.nonzero(tokens)[0], initial=-1)) + 1, smallest
  while bucket < length:
    bucket *= 2
  return tokens[:min(len(tokens), bucket)]


def detokenize(ids: Sequence[int]) -> str:
  """Output ids -> text, cut at the first EOS: the bundled vocabulary's `decode`."""
  return data.vocabulary().decode(ids)


def target_token_stream(task: str, split: str = 'train', *, limit: int | None = None,
                        cache_dir: str | pathlib.Path | None = None) -> np.ndarray:
  """Every target of a local task split tokenized, each followed by EOS.

  Args:
    task: a local task of `spec_decode.data` ('demo_ende', 'demo_debsum').
    split: its split.
    limit: only the first `limit` examples.
    cache_dir: if given, the stream is saved there as .npy and read back later.

  Returns:
    [T] int32, the concatenated id sequences (EOS separates them).
  """
  path = None
  if cache_dir is not None:
    name = f'{task}_{split}_{limit or "all"}_{data.VOCAB_PATH.stem}_targets.npy'
    path = pathlib.Path(cache_dir) / name
    if path.exists():
      return np.load(path)
  targets = [e['targets'] for e in data.load_examples(task, split, limit)]
  stream = np.asarray([t for ids in tokenizer().encode(targets) for t in ids + [EOS_ID]],
                      np.int32)
  if path is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, stream)
  return stream


Draft = models.Model  # a model, or a draft of spec_decode.models.drafts


def pruned_head(draft: models.T5Model, task: str, size: int) -> models.PrunedHeadDraft:
  """`draft` scoring only the `size` tokens most frequent in `task`'s training targets.

  q = 0 for every other token (`models.PrunedHeadDraft`: still exact).

  Raises:
    ValueError: a size outside 2..the vocabulary (`drafts.most_frequent_ids`).
  """
  ids = drafts.most_frequent_ids(target_token_stream(task, 'train'), draft.vocab_size, size)
  return models.PrunedHeadDraft.create(draft, ids)
