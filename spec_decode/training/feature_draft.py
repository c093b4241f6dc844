"""A draft over a real Llama target's features, trained here (EAGLE's recipe, white-box).

The draft (spec_decode.models.feature_draft) reads token x_t and the
target's final feature f_{t-1} and estimates f_t; the target's tied output
layer, pruned to the `head` ids it writes most, scores the estimate. It
learns from the target's own continuations of training prompts with their
features (`python -m spec_decode.training.llama_draft data --features`):

  loss = forward KL over the target's top-k + w * SmoothL1(f^_t, f_t)

(EAGLE, Li et al. 2024, weighs the token loss 0.1 against the feature loss;
with a few thousand rows and the draft started from one over tokens, the
token loss must lead: w = 0.1 by default). A second pass
feeds the draft its own estimates f^ in place of the target's features along
each continuation (stop-gradient), as it meets them from its second draft
step on; both passes' losses add. Only fc, the layers and the norm train;
the layers start from the target's last ones, the norm from its final norm.

  python -m spec_decode.training.llama_draft data --features --target DIR --out WORK/teacher
  python -m spec_decode.training.feature_draft train --target DIR --data WORK/teacher \\
      --out spec_decode/data/models/smollm2_feature_draft

Every `eval_every` steps the log (OUT/log.jsonl) records on held-out rows
(the last `val_rows`): alpha_t0, the share of greedy positions where the
draft's top token is the target's with the target's features in (its first
draft step), alpha_t0_own with its own estimates in (its later steps), and
alpha_t1_lower, sum_x min(p, q) over the top-k on the sampled rows.
"""

import argparse
import functools
import json
import pathlib
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode.llama import draft as draft_lib
from spec_decode.models.feature_draft import FeatureDraftNetwork
from spec_decode.models.llama import LlamaModel
from spec_decode.training import llama_draft
from spec_decode.training import teacher



def _batch(chunk: teacher.Chunk, seq: np.ndarray, rows: np.ndarray,
           lookup: np.ndarray) -> dict[str, np.ndarray]:
  steps = chunk.tokens.shape[1]
  n = chunk.prompt_length[rows]
  width = seq.shape[1]
  return {'seq': seq[rows], 'features': chunk.features[rows, :width],
          'prompt_length': n,
          'known': np.arange(width) < (n + chunk.length[rows] - 1)[:, None],  # f_t computed
          'mask': np.arange(steps) < chunk.length[rows][:, None],
          'teacher_idx': lookup[chunk.top_ids[rows]],
          'teacher_p': np.exp(chunk.top_logp[rows].astype(np.float32)),
          'greedy': chunk.temperature[rows] == 0}


def _shift(features: jax.Array) -> jax.Array:
  """[B, W, E]: the features before each position (zeros before the first)."""
  return jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :-1]


def _passes(own, frozen, batch, *, network):
  """Both passes' estimates [2, B, W, E]: target's features in, then (along the continuation) its own."""
  params = {**own, 'embed_tokens': {'embedding': frozen['embedding']}}
  apply = lambda previous: network.apply({'params': params}, batch['seq'], previous)
  true = batch['features'].astype(jnp.float32)
  first = apply(_shift(true))
  width = true.shape[1]
  along = (jnp.arange(width)[None, :] >= batch['prompt_length'][:, None])[..., None]  # [B, W, 1]
  second = apply(jnp.where(along, _shift(jax.lax.stop_gradient(first)), _shift(true)))
  return jnp.stack([first, second]), true


def _token_terms(estimate, frozen, batch):
  """Per continuation position: log q over the head [B, S, N], teacher p [B, S, k], its index."""
  steps = batch['teacher_idx'].shape[1]
  where = batch['prompt_length'][:, None] - 1 + jnp.arange(steps)  # [B, S]
  estimate = jnp.take_along_axis(estimate, where[:, :, None], axis=1)
  log_q = jax.nn.log_softmax(estimate.astype(jnp.float32) @ frozen['head'], axis=-1)
  idx = batch['teacher_idx']
  p = jnp.where(idx >= 0, batch['teacher_p'], 0.0)
  p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-9)
  return log_q, p, jnp.maximum(idx, 0)


def loss_fn(own, frozen, batch, *, network, feature_weight):
  estimates, true = _passes(own, frozen, batch, network=network)
  known, mask = batch['known'], batch['mask']
  total = 0.0
  for estimate in estimates:
    feature = optax.huber_loss(estimate, true, delta=1.0).mean(-1)  # SmoothL1, [B, W]
    log_q, p, idx = _token_terms(estimate, frozen, batch)
    cross = -(p * jnp.take_along_axis(log_q, idx, axis=-1)).sum(-1)  # [B, S]
    total += (feature_weight * (feature * known).sum() / jnp.maximum(known.sum(), 1)
              + (cross * mask).sum() / jnp.maximum(mask.sum(), 1))
  return total


@functools.partial(jax.jit, static_argnames=('network', 'tx', 'feature_weight'))
def train_step(own, opt_state, frozen, batch, *, network, tx, feature_weight):
  loss, grads = jax.value_and_grad(loss_fn)(own, frozen, batch, network=network,
                                            feature_weight=feature_weight)
  updates, opt_state = tx.update(grads, opt_state, own)
  return optax.apply_updates(own, updates), opt_state, loss


@functools.partial(jax.jit, static_argnames=('network',))
def eval_step(own, frozen, batch, *, network):
  """Sums: greedy matches (target's features in, own in), greedy positions, T = 1 overlap, positions."""
  estimates, _ = _passes(own, frozen, batch, network=network)
  mask, greedy = batch['mask'], batch['greedy'][:, None]
  first = batch['teacher_idx'][..., 0]
  target_top1 = jnp.where(first >= 0, frozen['ids'][jnp.maximum(first, 0)], -1)
  sums = []
  for estimate in estimates:
    log_q, _, idx = _token_terms(estimate, frozen, batch)
    sums.append(((frozen['ids'][jnp.argmax(log_q, -1)] == target_top1) * mask * greedy).sum())
  log_q, _, idx = _token_terms(estimates[0], frozen, batch)
  q = jnp.where(batch['teacher_idx'] >= 0, jnp.exp(jnp.take_along_axis(log_q, idx, -1)), 0.0)
  overlap = jnp.minimum(q, batch['teacher_p']).sum(-1)
  return (sums[0], sums[1], (mask * greedy).sum(), (overlap * mask * ~greedy).sum(),
          (mask * ~greedy).sum())


def initial_params(target: LlamaModel, network: FeatureDraftNetwork, seed: int,
                   init: Any = None) -> dict[str, Any]:
  """The parameters training starts from.

  The feature scale s is 1 / the target's final norm scale (unit-sized
  features). From scratch: fc at random (normal, 0.02), the layers from the
  target's last ones, the norm from its norm. From `init`, a draft over tokens alone
  (a PrunedHeadDraft of spec_decode.llama.draft): its layers and norm, and fc
  [I; 0], which passes the token's embedding and none of the feature: the
  same draft to begin with, which then learns to read the target's features.
  """
  cfg, layers = target.config, network.config.num_hidden_layers
  width = cfg.hidden_size
  norm_scale = np.asarray(target.params['norm']['scale'], np.float32)
  scale = jnp.asarray(np.where(np.abs(norm_scale) > 1e-6, 1 / norm_scale, 0.0), jnp.float32)
  if init is not None:
    fc = jnp.concatenate([jnp.eye(width), jnp.zeros((width, width))])
    own = {'fc': {'kernel': fc}, 'feature_scale': scale, 'norm': init.model.params['norm']}
    return {**own, **{f'layers_{i}': init.model.params[f'layers_{i}'] for i in range(layers)}}
  fc = 0.02 * jax.random.normal(jax.random.key(seed), (2 * width, width))
  own = {'fc': {'kernel': fc.astype(jnp.float32)}, 'feature_scale': scale,
         'norm': target.params['norm']}
  for i in range(layers):
    own[f'layers_{i}'] = target.params[f'layers_{cfg.num_hidden_layers - layers + i}']
  return own


def train(target_dir: str, data_dir: str, out: str, *, num_layers: int, head_size: int,
          steps: int, batch_rows: int, learning_rate: float, val_rows: int, eval_every: int,
          seed: int, init: str | None = None, feature_weight: float = 0.1,
          extra_data: Sequence[str] = ()) -> dict[str, float]:
  """Distils a feature draft of `num_layers` layers and writes it to `out` (draft.save) with its log.

  The last `val_rows` rows of `data_dir` are held out; `extra_data` folders
  (e.g. `llama_draft text --features`') only train. `init`: a folder of a
  draft over tokens alone to start from (its layers, norm and head ids;
  `initial_params`). `feature_weight`: w of the feature loss.

  Raises:
    ValueError: data without the target's features.
  """
  target = LlamaModel.load(target_dir)
  chunk, val, train_rows = llama_draft.training_rows(data_dir, extra_data, val_rows, features=True)
  start_from = draft_lib.load(init, target) if init else None
  if start_from is not None:
    num_layers = start_from.model.config.num_hidden_layers
  lookup, frozen = llama_draft.frozen_head(target, chunk, train_rows, head_size, start_from)
  seq = teacher.sequences(chunk.prompt, chunk.prompt_length, chunk.tokens)
  config = draft_lib.draft_config(target.config, num_layers)
  network = FeatureDraftNetwork(config)
  own = initial_params(target, network, seed, start_from)
  tx = llama_draft.optimizer(learning_rate, steps)
  opt_state = tx.init(own)

  def alphas(own) -> dict[str, float]:
    sums = llama_draft.held_out_sums(
        lambda rows: eval_step(own, frozen, _batch(chunk, seq, rows, lookup), network=network),
        val, batch_rows)
    return {'alpha_t0': sums[0] / max(sums[2], 1), 'alpha_t0_own': sums[1] / max(sums[2], 1),
            'alpha_t1_lower': sums[3] / max(sums[4], 1)}

  def step_fn(own, opt_state, rows):
    return train_step(own, opt_state, frozen, _batch(chunk, seq, rows, lookup), network=network,
                      tx=tx, feature_weight=feature_weight)

  own, record = llama_draft.distil(own, opt_state, step_fn, alphas, train_rows=train_rows,
                                   steps=steps, batch_rows=batch_rows, eval_every=eval_every,
                                   seed=seed, out=out)
  hf_config = json.loads((pathlib.Path(target_dir) / 'config.json').read_text())
  draft_lib.save(out, config, own, np.asarray(frozen['ids']), hf_config)
  return record


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='command', required=True)
  fit = sub.add_parser('train', help='distil the draft and write its folder')
  fit.add_argument('--target', required=True)
  fit.add_argument('--data', required=True, help='teacher data with features')
  fit.add_argument('--out', required=True)
  fit.add_argument('--layers', type=int, default=1)
  fit.add_argument('--head', type=int, default=8192)
  fit.add_argument('--steps', type=int, default=1500)
  fit.add_argument('--batch_rows', type=int, default=8)
  fit.add_argument('--learning_rate', type=float, default=5e-4)
  fit.add_argument('--val_rows', type=int, default=64)
  fit.add_argument('--eval_every', type=int, default=100)
  fit.add_argument('--seed', type=int, default=0)
  fit.add_argument('--init', help='a draft folder over tokens alone to start from')
  fit.add_argument('--feature_weight', type=float, default=0.1)
  fit.add_argument('--extra_data', nargs='*', default=[], help='folders that only train')
  args = parser.parse_args(argv)
  record = train(args.target, args.data, args.out, num_layers=args.layers, head_size=args.head,
                 steps=args.steps, batch_rows=args.batch_rows, learning_rate=args.learning_rate,
                 val_rows=args.val_rows, eval_every=args.eval_every, seed=args.seed,
                 init=args.init, feature_weight=args.feature_weight, extra_data=args.extra_data)
  print(json.dumps(record))
  return 0


if __name__ == '__main__':
  sys.exit(main())
