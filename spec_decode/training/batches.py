"""Length buckets: batches of fixed shapes, and their steps compiled before training.

Each example goes to the smallest (input, target) bucket that holds it; a
bucket of lengths (Li, Lt) holds `batch_tokens // (Li + Lt)` rows, so one
compiled step serves each bucket shape. The settings (`batch_tokens`,
`input_buckets`, `target_buckets`) are a TrainConfig's or a WhiteboxConfig's.
"""

import concurrent.futures
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

Batch = dict[str, np.ndarray]


def _bucket(length: int, boundaries: tuple[int, ...]) -> int:
  for boundary in boundaries:
    if length <= boundary:
      return boundary
  return boundaries[-1]


def bucketed_batches(examples: Iterator[Batch], cfg: Any) -> Iterator[Batch]:
  """Groups converted examples into length buckets of fixed batch shapes.

  Args:
    examples: single examples from EncDecFeatureConverter, padded to the
      largest buckets (encoder_input_tokens [Si], decoder_* [St]).
    cfg: bucket boundaries and the token budget per batch.

  Yields:
    Batches with arrays [rows, Li] and [rows, Lt] for a bucket (Li, Lt), where
    rows = batch_tokens // (Li + Lt).
  """
  pending: dict[tuple[int, int], list[Batch]] = {}
  for ex in examples:
    in_len = int(np.count_nonzero(ex['encoder_input_tokens']))
    tgt_len = int(np.count_nonzero(ex['decoder_loss_weights']))
    key = (_bucket(in_len, cfg.input_buckets), _bucket(tgt_len, cfg.target_buckets))
    group = pending.setdefault(key, [])
    group.append(ex)
    if len(group) == max(1, cfg.batch_tokens // sum(key)):
      del pending[key]
      yield {name: np.stack([e[name][:key[0] if name.startswith('encoder') else key[1]]
                             for e in group]) for name in group[0]}


def compile_buckets(step: Callable[[Any, Batch], Any], state: Any, cfg: Any) -> None:
  """Compiles `step` for every bucket shape at once, in threads, before training.

  The loop meets the (input, target) bucket shapes one at a time, and each
  first meeting compiles: on an accelerator ~10-40 s per shape against
  ~20 ms per step after it. Here each shape's step runs once, side by side, on
  an all-ones batch and a copy of `state` (the step may donate it); their
  results are dropped. `step` must be the very callable the loop calls, so
  that the loop finds these compiled programs.

  Args:
    step: (state, batch) -> anything; jitted inside.
    state: the state the loop starts from (left untouched).
    cfg: batch_tokens and the buckets.
  """
  shapes = [(li, lt) for li in cfg.input_buckets for lt in cfg.target_buckets]

  def run(shape: tuple[int, int]) -> None:
    li, lt = shape
    rows = max(1, cfg.batch_tokens // (li + lt))
    batch = {'encoder_input_tokens': np.ones((rows, li), np.int32),
             'decoder_input_tokens': np.ones((rows, lt), np.int32),
             'decoder_loss_weights': np.ones((rows, lt), np.int32)}
    jax.block_until_ready(step(jax.tree.map(jnp.copy, state), batch))

  with concurrent.futures.ThreadPoolExecutor(len(shapes)) as pool:
    list(pool.map(run, shapes))  # re-raises a step's error
