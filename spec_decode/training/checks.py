"""Checks of training settings, of the vocabulary a run trains with, of divergence inputs.

The settings are checked once, when a config object is built: a bad one fails here, before any data is read or anything compiles, with
a ConfigError naming the setting, its value and what is allowed: zero steps
would train nothing and exit 0, a NaN learning rate or temperature would
train on a NaN loss.
"""

import math
import numbers
import os
from typing import Any

import numpy as np

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.cli.gin_utils import ConfigError

OPTIMIZERS = ('adamw', 'adafactor')


def fail(owner: str, name: str, value: Any, allowed: str) -> None:
  """Raises the ConfigError of a bad setting `owner.name = value`."""
  raise ConfigError(f'{owner}.{name} = {value!r}: {allowed}')


def integer(owner: str, name: str, value: Any, minimum: int) -> None:
  """An integer (not a bool) >= minimum."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum):
    fail(owner, name, value, f'must be an integer >= {minimum}')


def number(owner: str, name: str, value: Any, *, positive: bool) -> None:
  """A finite real number, > 0 (positive) or >= 0."""
  ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
        and math.isfinite(value) and (value > 0 if positive else value >= 0))
  if not ok:
    fail(owner, name, value, f'must be a finite number {"> 0" if positive else ">= 0"}')


def warmup(owner: str, warmup_steps: Any, num_steps: int) -> None:
  """An integer in 0..num_steps: the learning rate rises linearly over warmup_steps."""
  integer(owner, 'warmup_steps', warmup_steps, 0)
  if warmup_steps > num_steps:
    fail(owner, 'warmup_steps', warmup_steps,
         f'must be at most num_steps = {num_steps}: the learning rate rises to its peak over '
         f'warmup_steps, so this run would end at {num_steps / warmup_steps:.3g} of it')


def buckets(owner: str, name: str, value: Any) -> None:
  """A non-empty, strictly increasing tuple of positive lengths."""
  ok = isinstance(value, (tuple, list)) and len(value) > 0
  ok = ok and all(not isinstance(x, bool) and isinstance(x, numbers.Integral) and x >= 1
                  for x in value)
  if not ok or any(a >= b for a, b in zip(value, value[1:])):
    fail(owner, name, value, 'must be a non-empty, strictly increasing tuple of lengths >= 1')


def optional_path(owner: str, name: str, value: Any) -> None:
  """None or a non-empty path."""
  if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
    fail(owner, name, value, 'must be None or a non-empty path')


def common(cfg: Any, owner: str) -> None:
  """The settings a TrainConfig and a WhiteboxConfig share.

  Args:
    cfg: has num_steps, batch_tokens, input_buckets, target_buckets,
      optimizer, learning_rate, warmup_steps, weight_decay,
      checkpoint_every, seed and init_checkpoint.
    owner: the config's class name, for the messages.

  Raises:
    ConfigError: the first bad setting.
  """
  integer(owner, 'num_steps', cfg.num_steps, 1)
  buckets(owner, 'input_buckets', cfg.input_buckets)
  buckets(owner, 'target_buckets', cfg.target_buckets)
  largest = cfg.input_buckets[-1] + cfg.target_buckets[-1]
  if (isinstance(cfg.batch_tokens, bool) or not isinstance(cfg.batch_tokens, numbers.Integral)
      or cfg.batch_tokens < largest):
    fail(owner, 'batch_tokens', cfg.batch_tokens,
         f'must be an integer >= input_buckets[-1] + target_buckets[-1] = {largest} (a batch '
         'holds at least one row of the largest bucket)')
  if cfg.optimizer not in OPTIMIZERS:
    fail(owner, 'optimizer', cfg.optimizer, f'unknown optimizer; choose one of {OPTIMIZERS}')
  number(owner, 'learning_rate', cfg.learning_rate, positive=True)
  warmup(owner, cfg.warmup_steps, cfg.num_steps)
  number(owner, 'weight_decay', cfg.weight_decay, positive=False)
  integer(owner, 'checkpoint_every', cfg.checkpoint_every, 1)
  integer(owner, 'seed', cfg.seed, 0)
  optional_path(owner, 'init_checkpoint', cfg.init_checkpoint)


def train_config(cfg: Any) -> None:
  """Every setting of a `spec_decode.training.train.TrainConfig`.

  Raises:
    ConfigError: the first bad setting.
  """
  owner = type(cfg).__name__
  if not isinstance(cfg.mixture, str) or not cfg.mixture:
    fail(owner, 'mixture', cfg.mixture, 'must be the name of a seqio task or mixture')
  common(cfg, owner)
  number(owner, 'z_loss', cfg.z_loss, positive=False)
  integer(owner, 'eval_every', cfg.eval_every, 1)
  integer(owner, 'eval_batches', cfg.eval_batches, 1)


def whitebox_config(cfg: Any, divergences: tuple[str, ...]) -> None:
  """Every setting of a `spec_decode.training.whitebox.WhiteboxConfig`.

  Args:
    cfg: the settings.
    divergences: the known divergence names.

  Raises:
    ConfigError: the first bad setting.
  """
  owner = type(cfg).__name__
  if cfg.divergence not in divergences:
    fail(owner, 'divergence', cfg.divergence, f'unknown divergence; choose one of {divergences}')
  number(owner, 'temperature', cfg.temperature, positive=True)
  number(owner, 'eval_temperature', cfg.eval_temperature, positive=False)
  number(owner, 'on_policy_temperature', cfg.on_policy_temperature, positive=False)
  weights = ('reference_weight', 'distilled_weight', 'on_policy_weight')
  for name in weights:
    number(owner, name, getattr(cfg, name), positive=False)
  if not any(getattr(cfg, name) for name in weights):
    fail(owner, 'reference_weight', cfg.reference_weight,
         f'the weights must be >= 0, one of them > 0; all of {weights} are 0')
  optional_path(owner, 'distill_dir', cfg.distill_dir)
  if cfg.distilled_weight and not cfg.distill_dir:
    fail(owner, 'distill_dir', cfg.distill_dir, 'distilled_weight > 0 needs distill_dir')
  common(cfg, owner)
  _tasks(cfg, owner)
  integer(owner, 'max_decode_len', cfg.max_decode_len, 1)
  if cfg.max_decode_len > cfg.target_buckets[-1]:
    fail(owner, 'max_decode_len', cfg.max_decode_len,
         f'max_decode_len must be in [1, target_buckets[-1]] = [1, {cfg.target_buckets[-1]}]')
  for name in ('on_policy_every', 'on_policy_samples', 'log_every', 'eval_every'):
    integer(owner, name, getattr(cfg, name), 1)
  integer(owner, 'eval_examples', cfg.eval_examples, 0)
  if cfg.train_seconds is not None:
    number(owner, 'train_seconds', cfg.train_seconds, positive=True)
  if not isinstance(cfg.compile_buckets, bool):
    fail(owner, 'compile_buckets', cfg.compile_buckets, 'must be True or False')


def _tasks(cfg: Any, owner: str) -> None:
  """(local task, weight > 0) pairs, needed by references, on-policy samples and evaluation."""
  if not cfg.tasks and (cfg.reference_weight or cfg.on_policy_weight or cfg.eval_examples):
    fail(owner, 'tasks', cfg.tasks, 'references, on-policy samples and evaluation need tasks')
  for task in cfg.tasks:
    ok = isinstance(task, (tuple, list)) and len(task) == 2 and task[0] in data.LOCAL_TASKS
    if ok:
      weight = task[1]
      ok = (not isinstance(weight, bool) and isinstance(weight, numbers.Real)
            and math.isfinite(weight) and weight > 0)
    if not ok:
      fail(owner, 'tasks', cfg.tasks,
           f'tasks are (name, weight > 0) pairs of {data.LOCAL_TASKS}; bad: {task!r}')


# The vocabulary a run trains with.

VOCABULARY_OVERRIDE = '--gin.ALLOW_VOCABULARY_MISMATCH=True'


def model_vocabulary(model_config: Any, vocabulary: Any, what: str) -> None:
  """A network whose embedding holds every id of the vocabulary.

  Raises:
    ConfigError: vocabulary.vocab_size > model_config.vocab_size (ids past
      the embedding would be clamped silently).
  """
  if vocabulary.vocab_size > model_config.vocab_size:
    raise ConfigError(
        f'{what} has vocab_size {model_config.vocab_size}, but the vocabulary '
        f'{vocabulary.sentencepiece_model_file} has {vocabulary.vocab_size} ids: use a config of '
        'vocab_size >= the vocabulary\'s')


def run_vocabulary(checkpoint_dir: str | os.PathLike, vocabulary: Any,
                   allow_mismatch: bool) -> None:
  """Records a run's vocabulary in its checkpoint directory, or checks the recorded one.

  Args:
    checkpoint_dir: the run's orbax checkpoints (WORKDIR/checkpoints); its
      steps take this record (`spec_decode.checkpoints.read_vocabulary`).
    vocabulary: what the run trains with (a Vocabulary or seqio's).
    allow_mismatch: a resumed run recorded with another vocabulary warns
      instead of failing.

  Raises:
    ConfigError: the run was recorded with another vocabulary.
  """
  if checkpoints.read_vocabulary(checkpoint_dir) is None:
    checkpoints.write_vocabulary(checkpoint_dir, vocabulary)
  else:
    checkpoint_vocabulary(checkpoint_dir, vocabulary, allow_mismatch)


def checkpoint_vocabulary(checkpoint: str | None, vocabulary: Any, allow_mismatch: bool) -> None:
  """`spec_decode.checkpoints.check_vocabulary` of a checkpoint a run loads, if any.

  Raises:
    ConfigError: its record names another vocabulary, or is damaged.
  """
  if not checkpoint:
    return
  try:
    checkpoints.check_vocabulary(checkpoint, vocabulary, allow_mismatch=allow_mismatch,
                                 override=VOCABULARY_OVERRIDE)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def divergence_inputs(target_logits: Any, draft_logits: Any, mask: Any, temperature: Any) -> None:
  """The arguments of `spec_decode.training.whitebox.divergence`.

  Args:
    target_logits: must be [B, L, V].
    draft_logits: must have target_logits' shape (one vocabulary, the same
      positions).
    mask: must be [B, L].
    temperature: when a Python or numpy number (not traced), a finite T > 0.

  Raises:
    ValueError: other shapes, naming all three; a bad temperature.
  """
  p, q, m = np.shape(target_logits), np.shape(draft_logits), np.shape(mask)
  if len(p) != 3 or p != q or m != p[:2]:
    raise ValueError(f'divergence needs target and draft logits of one shape [B, L, V] and a '
                     f'mask [B, L]; got target logits {p}, draft logits {q}, mask {m}')
  if isinstance(temperature, numbers.Real) and not (math.isfinite(temperature)
                                                    and temperature > 0):
    raise ValueError(f'divergence temperature = {temperature!r}: must be a finite number > 0')
