"""Training decoder-only T5 1.1 language models on the bundled English text.

The text: the English sides of Multi30k and of the Debian package
descriptions (spec_decode.data), one sentence or description per sequence,
tokenized with the bundled vocabulary, EOS appended, cut to `max_len` tokens.
A sequence is fed T5X's way, shifted right behind BOS 0. Batches hold
`batch_tokens` positions, grouped by length into `LENGTH_BUCKETS` so that one
compiled step serves each bucket.

A target learns the text (cross entropy plus z-loss). A draft is distilled
from a target (white-box, on the same text): its loss is the cross entropy
of the target's distribution at every position, H(p, q) = KL(p || q) + H(p),
which pulls q toward p where speculative sampling compares them. Optimizer:
T5's Adafactor under warmup and cosine decay, as `spec_decode.training.train`.
Runs stop after `num_steps` or `max_minutes`, and write a bfloat16 T5X
checkpoint with its vocabulary record and a JSONL log of the losses.
"""

import dataclasses
import functools
import json
import pathlib
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.models import decoder_only
from spec_decode.t5.decoder_only import DecoderOnlyConfig, DecoderOnlyTransformer
from spec_decode.text import EOS_ID
from spec_decode.training import checks

LENGTH_BUCKETS = (16, 32, 64)
# split -> the bundled English files read for it
SPLITS = {'train': ('multi30k_en_de/train.en', 'debian_descriptions_en_de/train.en'),
          'validation': ('multi30k_en_de/val.en', 'debian_descriptions_en_de/validation.en'),
          'test': ('multi30k_en_de/test.en',)}


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
  """One run's settings.

  Attributes:
    num_steps: optimizer steps (the schedule's length).
    max_minutes: stop earlier, after this much training time.
    batch_tokens: positions per batch (rows x bucket length).
    learning_rate: Adafactor's peak (relative) step size.
    warmup_steps: linear warmup before the cosine decay to 10%.
    z_loss: coefficient of mean log(Z)^2 (targets only).
    eval_every: steps between validation losses.
    seed: parameter initialisation and data order.
  """

  num_steps: int = 2000
  max_minutes: float = 60.0
  batch_tokens: int = 2048
  learning_rate: float = 1e-2
  warmup_steps: int = 100
  z_loss: float = 1e-4
  eval_every: int = 250
  seed: int = 0

  def __post_init__(self):
    checks.integer(type(self).__name__, 'num_steps', self.num_steps, 1)
    checks.warmup(type(self).__name__, self.warmup_steps, self.num_steps)


def sequences(split: str, max_len: int = LENGTH_BUCKETS[-1]) -> list[np.ndarray]:
  """Each line of the split's English files as ids with EOS, at most max_len long."""
  vocabulary = data.vocabulary()
  out = []
  for name in SPLITS[split]:
    with data.open_text(data.DATA_DIR / name) as f:
      lines = [line.strip() for line in f if line.strip()]
    out += [np.asarray(vocabulary.encode(line)[:max_len - 1] + [EOS_ID], np.int32)
            for line in lines]
  return out


def batches(seqs: list[np.ndarray], batch_tokens: int, rng: np.random.Generator | None
            ) -> Iterator[dict[str, np.ndarray]]:
  """Batches of one length bucket each: decoder_input_tokens, targets, weights [rows, L].

  With `rng` the sequences are shuffled and every full batch yielded; without,
  every sequence once in order (the last batch of a bucket padded with empty rows).
  """
  order = rng.permutation(len(seqs)) if rng is not None else np.arange(len(seqs))
  pending: dict[int, list[np.ndarray]] = {}
  for i in order:
    length = next(b for b in LENGTH_BUCKETS if len(seqs[i]) <= b)
    group = pending.setdefault(length, [])
    group.append(seqs[i])
    if len(group) == batch_tokens // length:
      yield _batch(pending.pop(length), length)
  if rng is None:
    for length, group in pending.items():
      yield _batch(group, length, rows=batch_tokens // length)


def _batch(group: list[np.ndarray], length: int, rows: int | None = None) -> dict[str, np.ndarray]:
  targets = np.zeros((rows or len(group), length), np.int32)
  for r, ids in enumerate(group):
    targets[r, :len(ids)] = ids
  inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  return {'inputs': inputs, 'targets': targets, 'weights': (targets > 0).astype(np.float32)}


def _logits(params: Any, network: DecoderOnlyTransformer, batch) -> jax.Array:
  return network.apply({'params': params}, batch['inputs'])  # [B, L, V] float32


def loss_fn(params, network, batch, teacher_params, teacher_network, z_loss):
  """Mean loss per target token and (sum of cross entropy with the data, tokens)."""
  logits = _logits(params, network, batch)
  log_q = jax.nn.log_softmax(logits)
  weights = batch['weights']
  data_ce = -jnp.sum(jnp.take_along_axis(log_q, batch['targets'][..., None], -1)[..., 0] * weights)
  tokens = jnp.maximum(jnp.sum(weights), 1.0)
  if teacher_network is None:
    log_z = jax.nn.logsumexp(logits, axis=-1)
    loss = data_ce + z_loss * jnp.sum(log_z**2 * weights)
  else:
    p = jax.nn.softmax(jax.lax.stop_gradient(_logits(teacher_params, teacher_network, batch)))
    loss = -jnp.sum(jnp.sum(p * log_q, axis=-1) * weights)
  return loss / tokens, (data_ce, tokens)


@functools.partial(jax.jit, static_argnames=('network', 'teacher_network', 'tx', 'z_loss'),
                   donate_argnums=(0, 1))
def train_step(params, opt_state, batch, teacher_params, *, network, teacher_network, tx, z_loss):
  grads, (data_ce, tokens) = jax.grad(loss_fn, has_aux=True)(
      params, network, batch, teacher_params, teacher_network, z_loss)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, data_ce / tokens


@functools.partial(jax.jit, static_argnames=('network',))
def _eval_step(params, batch, *, network):
  return loss_fn(params, network, batch, None, None, 0.0)[1]


def evaluate(params: Any, config: DecoderOnlyConfig, seqs: list[np.ndarray],
             batch_tokens: int = 2048) -> float:
  """Mean cross entropy per token of the data (nats)."""
  network = DecoderOnlyTransformer(config)
  totals = np.zeros(2)
  for batch in batches(seqs, batch_tokens, None):
    totals += np.asarray(_eval_step(params, batch, network=network))
  return float(totals[0] / totals[1])


def train(config: DecoderOnlyConfig, cfg: LMTrainConfig, output_dir: str,
          teacher: decoder_only.DecoderOnlyModel | None = None) -> dict:
  """Trains a model (a draft distilled from `teacher` if given); writes it and its log.

  Returns:
    The summary written to output_dir/summary.json: steps, minutes, losses.
  """
  out = pathlib.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  train_seqs, val_seqs = sequences('train'), sequences('validation')
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, cfg.learning_rate, cfg.warmup_steps, max(cfg.num_steps, cfg.warmup_steps + 1),
      0.1 * cfg.learning_rate)
  tx = optax.adafactor(schedule, decay_rate=0.8, multiply_by_parameter_scale=True,
                       clipping_threshold=1.0)
  network = DecoderOnlyTransformer(config)
  params = decoder_only.DecoderOnlyModel.random(config, jax.random.key(cfg.seed)).params
  opt_state = tx.init(params)
  teacher_args = ((None, None) if teacher is None
                  else (teacher.params, DecoderOnlyTransformer(teacher.config)))
  rng, step, start, log = np.random.default_rng(cfg.seed), 0, time.perf_counter(), []
  with (out / 'log.jsonl').open('w') as log_file, tqdm.tqdm(total=cfg.num_steps,
                                                             desc='training') as bar:
    while step < cfg.num_steps and time.perf_counter() - start < 60 * cfg.max_minutes:
      for batch in batches(train_seqs, cfg.batch_tokens, rng):
        params, opt_state, loss = train_step(
            params, opt_state, batch, teacher_args[0], network=network,
            teacher_network=teacher_args[1], tx=tx, z_loss=cfg.z_loss)
        step += 1
        bar.update(1)
        record = {'step': step, 'train_loss': float(loss),
                  'minutes': (time.perf_counter() - start) / 60}
        done = (step >= cfg.num_steps
                or time.perf_counter() - start >= 60 * cfg.max_minutes)
        if step % cfg.eval_every == 0 or done:
          record['eval_loss'] = evaluate(params, config, val_seqs, cfg.batch_tokens)
          bar.set_postfix(eval_loss=f'{record["eval_loss"]:.3f}')
        log.append(record)
        log_file.write(json.dumps(record) + '\n')
        log_file.flush()
        if done:
          break
  checkpoints.write_t5x(str(out / 'checkpoint'), params, dtype='bfloat16',
                        vocabulary=data.vocabulary())
  summary = {'steps': step, 'minutes': log[-1]['minutes'], 'eval_loss': log[-1]['eval_loss'],
             'config': dataclasses.asdict(config), 'train': dataclasses.asdict(cfg),
             'distilled_from': None if teacher is None else dataclasses.asdict(teacher.config)}
  (out / 'summary.json').write_text(json.dumps(summary, indent=1))
  return summary


def prompts_from_test(n: int, prompt_tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """[n, prompt_tokens] int32 prompts, the first tokens of the test sentences, and their lengths."""
  seqs = [s[:-1] for s in sequences('test')][:n]  # EOS dropped
  tokens = np.zeros((len(seqs), prompt_tokens), np.int32)
  lengths = np.asarray([min(len(s), prompt_tokens) for s in seqs], np.int32)
  for i, s in enumerate(seqs):
    tokens[i, :lengths[i]] = s[:lengths[i]]
  return tokens, lengths
