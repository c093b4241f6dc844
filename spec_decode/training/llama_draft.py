"""A draft for a real Llama target, trained here: white-box distillation on the target's outputs.

The draft (spec_decode.llama.draft) is a Llama of the target's width with a
few layers, started from the target's first layers, reading the target's
token embedding and scoring with its tied output layer pruned to the `head`
ids the target writes most. Only its layers and final norm train. It learns
the target's next-token distribution (forward KL over the target's top-k,
renormalised over the head's ids) on the target's own continuations of
training prompts (spec_decode.llama.prompts, split 'train'), half greedy and
half sampled at T = 1 (spec_decode.training.teacher): the prefixes it will
meet when drafting.

  python -m spec_decode.training.llama_draft data --target DIR --out WORK/teacher
  python -m spec_decode.training.llama_draft train --target DIR --data WORK/teacher \\
      --out spec_decode/data/models/smollm2_draft
  python -m spec_decode.training.llama_draft curve --log OUT/log.jsonl --out curve.png

Every `eval_every` steps the log (OUT/log.jsonl) records alpha on held-out
rows (the last `val_rows` of the data): at T = 0 the share of greedy
positions where the draft's top token is the target's, at T = 1
sum_x min(p, q) over the target's top-k on the sampled rows (a lower bound of
alpha there).
"""

import argparse
import functools
import json
import pathlib
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from spec_decode.llama import draft as draft_lib
from spec_decode.llama import prompts as prompts_lib
from spec_decode.llama.network import LlamaNetwork
from spec_decode.llama.tokenizer import Tokenizer
from spec_decode.models.llama import LlamaModel
from spec_decode.training import teacher

def teacher_data(target_dir: str, out: str, *, num_prompts: int, steps: int, top_k: int,
                 batch: int, seed: int, chunks: tuple[int, int] | None = None,
                 features: bool = False) -> None:
  """Writes the target's continuations of `num_prompts` training prompts as chunks of `batch`.

  Resumable: chunks already in `out` are kept. Rows alternate greedy and T = 1;
  a last part of fewer than `batch` prompts is left out. `chunks` = (start,
  stop) writes those chunk indices alone (e.g. one range per core, in two
  processes: XLA runs this loop on one). `features`: keep the target's
  features too (for a draft over them, spec_decode.llama.feature_draft).
  """
  out_dir = pathlib.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  tokenizer, target = Tokenizer(target_dir), LlamaModel.load(target_dir).with_panels()
  prompt, length = prompts_lib.pad(
      [tokenizer.encode(t) for t in prompts_lib.prompts('train', num_prompts, seed=seed)])
  start, stop = chunks or (0, len(prompt) // batch)
  for c in tqdm.tqdm(range(start, min(stop, len(prompt) // batch)), desc='teacher chunks'):
    path = out_dir / f'chunk_{c:05d}.npz'
    if path.exists():
      continue
    rows = slice(c * batch, (c + 1) * batch)
    chunk = teacher.generate_chunk(target, prompt[rows], length[rows], np.arange(batch) % 2,
                                   jax.random.key(c), steps=steps, top_k=top_k,
                                   eos_id=target.eos_id, features=features)
    teacher.save_chunk(path, chunk)


def text_data(target_dir: str, out: str, *, num_texts: int, steps: int, top_k: int, batch: int,
              seed: int, features: bool = False) -> None:
  """Writes the target's top-k along human answers: Debian package descriptions (split
  'train') after the chat prompt asking for them, teacher forced (many times faster than
  generating). Rows count as T = 1 rows; resumable as `teacher_data`. `features`: keep
  the target's features too (for a draft over them).
  """
  out_dir = pathlib.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  tokenizer, target = Tokenizer(target_dir), LlamaModel.load(target_dir)
  items = prompts_lib.package_answers('train', num_texts, seed=seed)
  prompt, prompt_length = prompts_lib.pad([tokenizer.encode(p) for p, _ in items])
  tokens, length = prompts_lib.pad(
      [tokenizer.encode(a)[:steps - 1] + [target.eos_id] for _, a in items], width=steps)
  for c in tqdm.tqdm(range(len(items) // batch), desc='teacher-forced chunks'):
    path = out_dir / f'chunk_{c:05d}.npz'
    if path.exists():
      continue
    rows = slice(c * batch, (c + 1) * batch)
    chunk = teacher.score_chunk(target, prompt[rows], prompt_length[rows], tokens[rows],
                                length[rows], top_k=top_k, features=features)
    teacher.save_chunk(path, chunk)


def head_ids(chunk: teacher.Chunk, size: int, vocab_size: int, eos_id: int) -> np.ndarray:
  """The `size` ids with the most target mass over the chunk's counted positions, EOS kept.

  Ids the target never ranks fill the rest, lowest first (a BPE vocabulary's
  earliest merges); all of them where `size` >= `vocab_size`.
  """
  size = min(size, vocab_size)
  mask = np.arange(chunk.tokens.shape[1]) < chunk.length[:, None]  # [R, S]
  mass = np.zeros(vocab_size, np.float64)
  np.add.at(mass, chunk.top_ids[mask].ravel(),
            np.exp(chunk.top_logp[mask].astype(np.float64)).ravel())
  if eos_id >= 0:
    mass[eos_id] = np.inf
  return np.sort(np.argsort(-mass, kind='stable')[:size]).astype(np.int32)  # ties: lowest first


def _batch(chunk: teacher.Chunk, seq: np.ndarray, rows: np.ndarray,
           lookup: np.ndarray) -> dict[str, jax.Array]:
  steps = chunk.tokens.shape[1]
  return {'seq': seq[rows], 'prompt_length': chunk.prompt_length[rows],
          'mask': np.arange(steps) < chunk.length[rows][:, None],
          'teacher_idx': lookup[chunk.top_ids[rows]],
          'teacher_p': np.exp(chunk.top_logp[rows].astype(np.float32)),
          'greedy': chunk.temperature[rows] == 0}


def _forward(own: Any, frozen: dict[str, jax.Array], batch: dict[str, jax.Array], *,
             network: LlamaNetwork) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Draft log q over the head [B, S, N], teacher p over the head [B, S, k], its index."""
  params = {**own, 'embed_tokens': {'embedding': frozen['embedding']}}
  features = network.apply({'params': params}, batch['seq'], method=LlamaNetwork.features)[0]
  steps = batch['teacher_idx'].shape[1]
  where = batch['prompt_length'][:, None] - 1 + jnp.arange(steps)  # [B, S]
  features = jnp.take_along_axis(features, where[:, :, None], axis=1)  # [B, S, E]
  log_q = jax.nn.log_softmax(features.astype(jnp.float32) @ frozen['head'], axis=-1)
  idx = batch['teacher_idx']
  p = jnp.where(idx >= 0, batch['teacher_p'], 0.0)
  p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-9)
  return log_q, p, jnp.maximum(idx, 0)


def loss_fn(own, frozen, batch, *, network):
  log_q, p, idx = _forward(own, frozen, batch, network=network)
  cross = -(p * jnp.take_along_axis(log_q, idx, axis=-1)).sum(-1)  # [B, S]
  mask = batch['mask']
  return (cross * mask).sum() / jnp.maximum(mask.sum(), 1)


@functools.partial(jax.jit, static_argnames=('network', 'tx'))
def train_step(own, opt_state, frozen, batch, *, network, tx):
  loss, grads = jax.value_and_grad(loss_fn)(own, frozen, batch, network=network)
  updates, opt_state = tx.update(grads, opt_state, own)
  return optax.apply_updates(own, updates), opt_state, loss


@functools.partial(jax.jit, static_argnames=('network',))
def eval_step(own, frozen, batch, *, network):
  """Sums over counted positions: greedy matches and positions, T = 1 overlap and positions."""
  log_q, _, idx = _forward(own, frozen, batch, network=network)
  mask, greedy = batch['mask'], batch['greedy'][:, None]
  top1 = frozen['ids'][jnp.argmax(log_q, -1)]  # [B, S]
  target_top1 = jnp.where(batch['teacher_idx'][..., 0] >= 0,
                          frozen['ids'][jnp.maximum(batch['teacher_idx'][..., 0], 0)], -1)
  q = jnp.where(batch['teacher_idx'] >= 0, jnp.exp(jnp.take_along_axis(log_q, idx, -1)), 0.0)
  overlap = jnp.minimum(q, batch['teacher_p']).sum(-1)  # [B, S]
  return ((top1 == target_top1) * mask * greedy).sum(), (mask * greedy).sum(), \
      (overlap * mask * ~greedy).sum(), (mask * ~greedy).sum()


def train(target_dir: str, data_dir: str, out: str, *, num_layers: int, head_size: int,
          steps: int, batch_rows: int, learning_rate: float, val_rows: int, eval_every: int,
          seed: int, extra_data: Sequence[str] = (), init: str | None = None) -> dict[str, float]:
  """Distils a draft of `num_layers` layers and writes it to `out` (draft.save) with its log.

  The last `val_rows` rows of `data_dir` are held out; `extra_data` folders
  (e.g. `text_data`'s) only train. `init`: a draft folder to start from (its
  layers and head ids) instead of the target's first layers.
  """
  target = LlamaModel.load(target_dir)
  chunk, val, train_rows = training_rows(data_dir, extra_data, val_rows)
  start_from = draft_lib.load(init, target) if init else None
  if start_from is not None:
    num_layers = start_from.model.config.num_hidden_layers
  lookup, frozen = frozen_head(target, chunk, train_rows, head_size, start_from)
  seq = teacher.sequences(chunk.prompt, chunk.prompt_length, chunk.tokens)
  config = draft_lib.draft_config(target.config, num_layers)
  network = LlamaNetwork(config)
  source = start_from.model.params if init else target.params
  own = {f'layers_{i}': source[f'layers_{i}'] for i in range(num_layers)}
  own['norm'] = source['norm']
  tx = optimizer(learning_rate, steps)
  opt_state = tx.init(own)

  def alphas(own) -> dict[str, float]:
    sums = held_out_sums(lambda rows: eval_step(own, frozen, _batch(chunk, seq, rows, lookup),
                                                network=network), val, batch_rows)
    return {'alpha_t0': sums[0] / max(sums[1], 1), 'alpha_t1_lower': sums[2] / max(sums[3], 1)}

  def step_fn(own, opt_state, rows):
    return train_step(own, opt_state, frozen, _batch(chunk, seq, rows, lookup), network=network,
                      tx=tx)

  own, record = distil(own, opt_state, step_fn, alphas, train_rows=train_rows, steps=steps,
                       batch_rows=batch_rows, eval_every=eval_every, seed=seed, out=out)
  hf_config = json.loads((pathlib.Path(target_dir) / 'config.json').read_text())
  draft_lib.save(out, config, own, np.asarray(frozen['ids']), hf_config)
  return record


def training_rows(data_dir: str, extra_data: Sequence[str], val_rows: int,
                  features: bool = False) -> tuple[teacher.Chunk, np.ndarray, np.ndarray]:
  """Teacher rows for training: the chunks, held-out rows (`data_dir`'s last), training rows.

  `extra_data` folders only train. `features`: every folder must hold the
  target's features (else a ValueError naming it).
  """
  folders = (data_dir, *extra_data)
  parts = [teacher.load_chunks(d) for d in folders]
  for folder, part in zip(folders, parts):
    if features and part.features is None:
      raise ValueError(f'{folder} holds no features: write it with `llama_draft data --features` '
                       'or `llama_draft text --features`')
  rows = parts[0].prompt.shape[0]
  chunk = teacher.concatenate(parts)
  val = np.arange(rows - val_rows, rows)
  return chunk, val, np.setdiff1d(np.arange(chunk.prompt.shape[0]), val)


def frozen_head(target: LlamaModel, chunk: teacher.Chunk, train_rows: np.ndarray, head_size: int,
                start_from: Any = None) -> tuple[np.ndarray, dict[str, jax.Array]]:
  """The draft's head ids (`start_from`'s, or the training rows' most likely) and what stays frozen.

  Returns:
    lookup [V] int32 (an id's place in the head, -1 outside) and {'embedding':
    the target's [V, E], 'head': [E, N], 'ids': [N]}.
  """
  if start_from is not None:
    ids = np.asarray(start_from.ids)
  else:
    ids = head_ids(teacher.Chunk(*(None if a is None else a[train_rows] for a in chunk)),
                   head_size, target.vocab_size, target.eos_id)
  lookup = np.full(target.vocab_size, -1, np.int32)
  lookup[ids] = np.arange(ids.size)
  embedding = target.params['embed_tokens']['embedding']
  return lookup, {'embedding': embedding, 'head': embedding[ids].T, 'ids': jnp.asarray(ids)}


def optimizer(learning_rate: float, steps: int) -> optax.GradientTransformation:
  """AdamW (no weight decay), warmup over a tenth of the steps (at most 100), cosine to 0, clipped at 1."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(100, steps // 10), steps)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))


def held_out_sums(eval_fn, val: np.ndarray, batch_rows: int) -> np.ndarray:
  """eval_fn(rows) -> a tuple of sums, added over the held-out rows `val` in parts of ~batch_rows."""
  sums = 0.0
  for part in np.array_split(val, max(1, val.size // batch_rows)):
    sums = sums + np.asarray(jax.device_get(eval_fn(part)), np.float64)
  return sums


def distil(own: Any, opt_state: Any, step_fn, alphas, *, train_rows: np.ndarray, steps: int,
           batch_rows: int, eval_every: int, seed: int, out: str) -> tuple[Any, dict[str, float]]:
  """The loop both draft kinds train with: batches of `batch_rows` random training rows.

  Args:
    own, opt_state: the trained parameters and the optimizer's state.
    step_fn: (own, opt_state, rows [batch_rows]) -> (own, opt_state, loss).
    alphas: own -> {name: alpha on the held-out rows}, logged at step 0, every
      `eval_every` steps and at the end (OUT/log.jsonl, with the loss and the minutes).
    train_rows, steps, batch_rows, eval_every, seed: what and how long it trains.
    out: the folder of the log (created).

  Returns:
    The trained parameters and the last log entry.
  """
  out_dir = pathlib.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  rng, start = np.random.default_rng(seed), time.time()
  with open(out_dir / 'log.jsonl', 'w', encoding='utf-8') as log:

    def evaluate(step: int, loss: float) -> dict[str, float]:
      entry = {'step': step, 'loss': loss, **alphas(own), 'minutes': (time.time() - start) / 60}
      log.write(json.dumps(entry) + '\n')
      log.flush()
      return entry

    record = evaluate(0, float('nan'))
    bar = tqdm.tqdm(range(1, steps + 1), desc='distilling')
    for step in bar:
      rows = rng.choice(train_rows, batch_rows, replace=False)
      own, opt_state, loss = step_fn(own, opt_state, rows)
      if step % eval_every == 0 or step == steps:
        record = evaluate(step, float(loss))
        bar.set_postfix(alpha_t0=f'{record["alpha_t0"]:.3f}')
  return own, record


def plot_curve(log_file: str, png: str) -> None:
  """alpha at T = 0 and T = 1 (lower bound) on the held-out rows against steps (matplotlib)."""
  import matplotlib  # pylint: disable=g-import-not-at-top; the harness extra
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  log = [json.loads(line) for line in open(log_file, encoding='utf-8')]
  fig, ax = plt.subplots(figsize=(7, 4))
  for key, label in (('alpha_t0', 'T = 0 (top-1 agreement)'),
                     ('alpha_t1_lower', 'T = 1 (sum of min(p, q) over the top-k)')):
    ax.plot([r['step'] for r in log], [r[key] for r in log], 'o-', ms=3, label=label)
  ax.set(xlabel='step', ylabel='alpha on held-out rows', ylim=(0, 1),
         title='Draft distillation from the target')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(png, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='command', required=True)
  data = sub.add_parser('data', help="the target's continuations of training prompts")
  data.add_argument('--target', required=True)
  data.add_argument('--out', required=True)
  data.add_argument('--prompts', type=int, default=2048)
  data.add_argument('--steps', type=int, default=128)
  data.add_argument('--top_k', type=int, default=32)
  data.add_argument('--batch', type=int, default=32)
  data.add_argument('--seed', type=int, default=1)
  data.add_argument('--chunks', help='START:STOP, the chunk indices to write (default all)')
  data.add_argument('--features', action='store_true', help="keep the target's features too")
  text = sub.add_parser('text', help="the target's distributions along human answers")
  text.add_argument('--target', required=True)
  text.add_argument('--out', required=True)
  text.add_argument('--texts', type=int, default=4096)
  text.add_argument('--steps', type=int, default=128)
  text.add_argument('--top_k', type=int, default=32)
  text.add_argument('--batch', type=int, default=16)
  text.add_argument('--seed', type=int, default=2)
  text.add_argument('--features', action='store_true', help="keep the target's features too")
  fit = sub.add_parser('train', help='distil the draft and write its folder')
  fit.add_argument('--target', required=True)
  fit.add_argument('--data', required=True)
  fit.add_argument('--out', required=True)
  fit.add_argument('--layers', type=int, default=2)
  fit.add_argument('--head', type=int, default=8192)
  fit.add_argument('--steps', type=int, default=2000)
  fit.add_argument('--batch_rows', type=int, default=8)
  fit.add_argument('--learning_rate', type=float, default=3e-4)
  fit.add_argument('--val_rows', type=int, default=64)
  fit.add_argument('--eval_every', type=int, default=100)
  fit.add_argument('--seed', type=int, default=0)
  fit.add_argument('--extra_data', nargs='*', default=[], help='folders that only train')
  fit.add_argument('--init', help='a draft folder to start from')
  curve = sub.add_parser('curve', help="plot a run's alpha against steps")
  curve.add_argument('--log', required=True, help='the log.jsonl of a train run')
  curve.add_argument('--out', required=True, help='the PNG to write')
  args = parser.parse_args(argv)
  if args.command == 'curve':
    plot_curve(args.log, args.out)
  elif args.command == 'text':
    text_data(args.target, args.out, num_texts=args.texts, steps=args.steps, top_k=args.top_k,
              batch=args.batch, seed=args.seed, features=args.features)
  elif args.command == 'data':
    chunks = tuple(int(x) for x in args.chunks.split(':')) if args.chunks else None
    teacher_data(args.target, args.out, num_prompts=args.prompts, steps=args.steps,
                 top_k=args.top_k, batch=args.batch, seed=args.seed, chunks=chunks,
                 features=args.features)
  else:
    record = train(args.target, args.data, args.out, num_layers=args.layers, head_size=args.head,
                   steps=args.steps, batch_rows=args.batch_rows,
                   learning_rate=args.learning_rate, val_rows=args.val_rows,
                   eval_every=args.eval_every, seed=args.seed, extra_data=args.extra_data,
                   init=args.init)
    print(json.dumps(record))
  return 0


if __name__ == '__main__':
  sys.exit(main())
