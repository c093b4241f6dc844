"""Teacher-forced training of T5 1.1 models with optax (the demo pair, drafts).

Examples come from a seqio task or mixture through seqio's
EncDecFeatureConverter (unpacked). On 2 CPU cores padding is the main waste,
so batches are grouped by length: each example goes to the smallest
(input, target) bucket that holds it, a bucket of lengths (Li, Lt) holds
`batch_tokens // (Li + Lt)` rows, and one compiled step serves each bucket
shape. Checkpoints (params, optimizer state, step) are saved with orbax every
`checkpoint_every` steps and training resumes from the latest one; a new run
may start from the parameters of any checkpoint `load_params` reads
(`init_checkpoint`). The run records its vocabulary (the mixture's) in
WORKDIR/checkpoints/vocabulary.json, and a resumed run or an init_checkpoint
recorded with another one is an error (`ALLOW_VOCABULARY_MISMATCH` in gin). The
optimizer is AdamW or T5's Adafactor. A JSONL log
records train and eval loss for the loss curves.

On the demo pair, Adafactor (relative step 1e-2) lowered the validation loss
where AdamW (1e-3) had stalled: T5's embeddings start at standard deviation 1,
and AdamW's absolute steps of ~1e-3 barely move them (their RMS was still 0.99
after 2700 steps), while Adafactor scales each update by its parameter's RMS.
"""

import dataclasses
import functools
import json
import pathlib
import time
from typing import Any, Iterator

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm

from spec_decode import checkpoints
from spec_decode.cli import gin_utils
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.t5.config import T5Config
from spec_decode.t5.network import Transformer
from spec_decode.training import batches as batches_lib
from spec_decode.training import checks

Batch = batches_lib.Batch


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Hyperparameters of one training run, each checked when it is built.

  Attributes:
    mixture: seqio task or mixture name (e.g. 'demo_mix').
    num_steps: total optimizer steps.
    batch_tokens: input + target positions per batch (padding included).
    input_buckets: increasing input lengths; the last is the maximum.
    target_buckets: increasing target lengths; the last is the maximum.
    optimizer: 'adamw', or 'adafactor' as T5 (factored second moments,
      updates relative to each parameter's scale, no momentum).
    learning_rate: peak learning rate (Adafactor's is relative: T5 uses 1e-2).
    warmup_steps: linear warmup, then cosine decay to 10% of the peak.
    weight_decay: decoupled AdamW weight decay (AdamW only).
    z_loss: coefficient of T5X's log(Z)^2 auxiliary loss.
    eval_every: steps between validation-loss evaluations.
    eval_batches: batches of the validation split per evaluation.
    checkpoint_every: steps between orbax checkpoints.
    seed: parameter init, dropout and data shuffling seed.
    init_checkpoint: a T5X, orbax or Hugging Face checkpoint whose parameters
      start a run whose workdir holds no checkpoint yet (fine-tuning, or a
      change of optimizer); the optimizer state starts fresh, at step 0.
  """

  mixture: str = 'demo_mix'
  num_steps: int = 10_000
  batch_tokens: int = 4096
  input_buckets: tuple[int, ...] = (32, 64, 128, 256)
  target_buckets: tuple[int, ...] = (32, 64, 128)
  optimizer: str = 'adamw'
  learning_rate: float = 1e-3
  warmup_steps: int = 500
  weight_decay: float = 0.01
  z_loss: float = 1e-4
  eval_every: int = 500
  eval_batches: int = 20
  checkpoint_every: int = 500
  seed: int = 0
  init_checkpoint: str | None = None

  def __post_init__(self):
    checks.train_config(self)


OPTIMIZERS = checks.OPTIMIZERS


@flax.struct.dataclass
class TrainState:
  """Parameters and optimizer state.

  Attributes:
    step: [] int32 optimizer steps taken.
    params: the T5X-layout parameter tree.
    opt_state: optax state of the same structure.
  """

  step: jax.Array
  params: Any
  opt_state: Any


def optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """The run's optimizer under warmup + cosine decay to 10% of the peak.

  AdamW clips the global gradient norm at 1; Adafactor clips each update's
  RMS at 1, as T5 does.
  """
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
      decay_steps=max(cfg.num_steps, cfg.warmup_steps + 1), end_value=0.1 * cfg.learning_rate)
  if cfg.optimizer == 'adamw':
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay))
  return optax.adafactor(schedule, decay_rate=0.8, multiply_by_parameter_scale=True,
                         clipping_threshold=1.0)


def loss_fn(params: Any, model: Transformer, batch: Batch, z_loss: float, dropout_rng=None):
  """Token-weighted cross entropy plus z-loss.

  Args:
    params: the parameter tree.
    model: the network.
    batch: encoder_input_tokens [B, S], decoder_input_tokens [B, L],
      decoder_target_tokens [B, L], decoder_loss_weights [B, L].
    z_loss: coefficient of mean log(Z)^2.
    dropout_rng: enables dropout when given.

  Returns:
    (loss, (sum of token cross entropy, number of target tokens)).
  """
  logits = model.apply(
      {'params': params}, batch['encoder_input_tokens'], batch['decoder_input_tokens'],
      enable_dropout=dropout_rng is not None,
      rngs=None if dropout_rng is None else {'dropout': dropout_rng})  # [B, L, V] float32
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, L]
  target_logit = jnp.take_along_axis(logits, batch['decoder_target_tokens'][..., None],
                                     axis=-1)[..., 0]
  weights = batch['decoder_loss_weights'].astype(jnp.float32)
  cross_entropy = jnp.sum((log_z - target_logit) * weights)
  tokens = jnp.maximum(jnp.sum(weights), 1.0)
  loss = (cross_entropy + z_loss * jnp.sum(log_z**2 * weights)) / tokens
  return loss, (cross_entropy, tokens)


@functools.partial(jax.jit, static_argnames=('model', 'tx', 'z_loss'), donate_argnums=0)
def train_step(state: TrainState, batch: Batch, rng: jax.Array, *, model: Transformer,
               tx: optax.GradientTransformation, z_loss: float):
  """One optimizer step; returns the new state and the batch's mean cross entropy."""
  grad_fn = jax.grad(loss_fn, has_aux=True)
  grads, (cross_entropy, tokens) = grad_fn(state.params, model, batch, z_loss,
                                           jax.random.fold_in(rng, state.step))
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return (TrainState(step=state.step + 1, params=params, opt_state=opt_state),
          cross_entropy / tokens)


@functools.partial(jax.jit, static_argnames=('model',))
def eval_step(params: Any, batch: Batch, *, model: Transformer):
  """(sum of cross entropy, target tokens) of one batch, no dropout."""
  return loss_fn(params, model, batch, 0.0)[1]


def dataset(cfg: TrainConfig, split: str, *, shuffle: bool, seed: int) -> Iterator[Batch]:
  """Bucketed batches of a seqio task/mixture split (repeats when shuffled)."""
  # Imported here: seqio loads TensorFlow (~7 s), which spec_decode.training.whitebox,
  # reading text without seqio, does not need.
  import seqio  # pylint: disable=g-import-not-at-top
  lengths = {'inputs': cfg.input_buckets[-1], 'targets': cfg.target_buckets[-1]}
  ds = seqio.get_mixture_or_task(cfg.mixture).get_dataset(
      sequence_length=lengths, split=split, shuffle=shuffle, seed=seed,
      num_epochs=None if shuffle else 1)
  ds = seqio.EncDecFeatureConverter(pack=False)(ds, lengths)
  return batches_lib.bucketed_batches(ds.prefetch(1024).as_numpy_iterator(), cfg)


def init_state(model: Transformer, tx: optax.GradientTransformation, seed: int) -> TrainState:
  tokens = jnp.ones((1, 1), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(seed), tokens, tokens)['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def train(model_config: T5Config, cfg: TrainConfig, workdir: str,
          allow_vocabulary_mismatch: bool = False) -> TrainState:
  """Trains (or resumes) a model; returns the final state.

  Args:
    model_config: the network's sizes (dropout_rate applies in training).
    cfg: the run's hyperparameters.
    workdir: holds `checkpoints/` (orbax, and the run's vocabulary.json) and
      `log.jsonl` (losses).
    allow_vocabulary_mismatch: a resumed run or an init_checkpoint recorded
      with another vocabulary than the mixture's warns instead of failing.

  Returns:
    The TrainState after `cfg.num_steps` steps.

  Raises:
    ConfigError: a vocabulary larger than model_config.vocab_size, or a
      workdir already past `cfg.num_steps`.
    ValueError: a vocabulary mismatch (see `checks.run_vocabulary`).
  """
  import seqio  # pylint: disable=g-import-not-at-top  (loads TensorFlow, see `dataset`)
  vocabulary = seqio.get_mixture_or_task(cfg.mixture).output_features['targets'].vocabulary
  checks.model_vocabulary(model_config, vocabulary, 'the model config')
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  model, tx = Transformer(model_config), optimizer(cfg)
  manager = checkpoint_manager(workdir)
  checks.run_vocabulary(manager.directory, vocabulary, allow_vocabulary_mismatch)
  if manager.latest_step() is None:
    checks.checkpoint_vocabulary(cfg.init_checkpoint, vocabulary, allow_vocabulary_mismatch)
  state = start_state(manager, model_config, tx, cfg.seed, cfg.init_checkpoint)
  start = int(state.step)
  if start > cfg.num_steps:
    raise ConfigError(f'num_steps = {cfg.num_steps}, but {workdir} already holds step {start}: '
                      'raise num_steps or start a new WORKDIR')
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(f'{n_params / 1e6:.1f}M parameters; steps {start} -> {cfg.num_steps}', flush=True)

  rng = jax.random.key(cfg.seed + 1)
  batches = dataset(cfg, 'train', shuffle=True, seed=cfg.seed + start)
  log = open(workdir / 'log.jsonl', 'a')
  bar = tqdm.tqdm(total=cfg.num_steps, initial=start, unit='step', dynamic_ncols=True)
  tokens_seen, t0, losses = 0, time.perf_counter(), []
  for step in range(start, cfg.num_steps):
    batch = next(batches)
    state, loss = train_step(state, batch, rng, model=model, tx=tx, z_loss=cfg.z_loss)
    tokens_seen += int(np.count_nonzero(batch['encoder_input_tokens'])
                       + np.count_nonzero(batch['decoder_loss_weights']))
    losses.append(loss)
    done = step + 1
    if done % 20 == 0 or done == cfg.num_steps:
      train_loss = float(np.mean(jax.device_get(losses)))
      losses = []
      rate = tokens_seen / (time.perf_counter() - t0)
      bar.set_postfix(loss=f'{train_loss:.3f}', tok_s=f'{rate:.0f}')
      log.write(json.dumps({'step': done, 'train_loss': train_loss, 'tokens_per_s': rate,
                            'time': time.time()}) + '\n')
    if done % cfg.eval_every == 0 or done == cfg.num_steps:
      eval_loss = evaluate(state.params, model, cfg)
      bar.write(f'step {done}: eval loss {eval_loss:.4f}')
      log.write(json.dumps({'step': done, 'eval_loss': eval_loss, 'time': time.time()}) + '\n')
    if done % cfg.checkpoint_every == 0 or done == cfg.num_steps:
      manager.save(done, args=ocp.args.StandardSave(state))
    log.flush()
    bar.update(1)
  bar.close()
  manager.wait_until_finished()
  return state


def checkpoint_manager(workdir: pathlib.Path) -> ocp.CheckpointManager:
  """The orbax checkpoints of a run, WORKDIR/checkpoints (the latest two kept)."""
  return ocp.CheckpointManager(workdir / 'checkpoints',
                               options=ocp.CheckpointManagerOptions(max_to_keep=2))


def start_state(manager: ocp.CheckpointManager, model_config: T5Config,
                tx: optax.GradientTransformation, seed: int,
                init_checkpoint: str | None = None) -> TrainState:
  """Where a run starts or resumes.

  Args:
    manager: the run's checkpoints (see `checkpoint_manager`).
    model_config: the trained network's sizes.
    tx: the run's optimizer.
    seed: of a fresh initialisation.
    init_checkpoint: a T5X, orbax or Hugging Face checkpoint to start from.

  Returns:
    The latest saved state; when nothing was saved yet, the parameters of
    `init_checkpoint` (float32) with a fresh optimizer state at step 0, or
    without it a fresh initialisation.
  """
  if manager.latest_step() is None and init_checkpoint:
    params = jax.tree.map(jnp.asarray, checkpoints.load_params(
        init_checkpoint, model_config, dtype=jnp.float32))
    print(f'parameters from {init_checkpoint}', flush=True)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  return _restore_or_init(manager, Transformer(model_config), tx, seed)


def _restore_or_init(manager: ocp.CheckpointManager, model: Transformer,
                     tx: optax.GradientTransformation, seed: int) -> TrainState:
  """The latest saved state, or a fresh one when nothing was saved yet."""
  state = init_state(model, tx, seed)
  if manager.latest_step() is None:
    return state
  return manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(state))


def export(model_config: T5Config, cfg: TrainConfig, workdir: str, output_dir: str | None,
           dtype: str = 'bfloat16') -> None:
  """Writes the latest parameters of a run as a T5X checkpoint.

  Args:
    model_config: the trained network's sizes.
    cfg: the run's hyperparameters (for the optimizer state's structure).
    workdir: the run's directory (see `train`).
    output_dir: the T5X checkpoint directory to write, with the run's
      vocabulary record when it has one.
    dtype: stored parameter dtype ('bfloat16' halves the size).
  """
  if output_dir is None:
    raise ConfigError('export needs an output directory: bind OUTPUT_DIR')
  manager = checkpoint_manager(pathlib.Path(workdir).absolute())
  if manager.latest_step() is None:
    raise ConfigError(f'no checkpoint to export in {workdir}/checkpoints')
  state = _restore_or_init(manager, Transformer(model_config), optimizer(cfg), cfg.seed)
  checkpoints.write_t5x(output_dir, jax.device_get(state.params), step=int(state.step),
                        dtype=dtype, vocabulary=checkpoints.read_vocabulary(manager.directory))
  print(f'wrote step {int(state.step)} to {output_dir} ({dtype})')


def main(argv=None) -> int:
  """`scripts/train.py`: gin-configured `train` (see gin/runs/train.gin)."""
  return gin_utils.run(train, argv, prog='train.py', description='Trains a T5 1.1 model.',
                       example='--gin_file=runs/train.gin --gin_file=models/demo/target.gin '
                       '--gin.MODEL_CONFIG="@demo_target/t5.T5Config()" '
                       '--gin.WORKDIR="\'out/demo_target\'"')


def export_main(argv=None) -> int:
  """`scripts/export_t5x.py`: gin-configured `export` (see gin/runs/train.gin)."""
  return gin_utils.run(export, argv, prog='export_t5x.py',
                       description='Exports a training run as a T5X checkpoint.',
                       example='--gin_file=runs/train.gin --gin_file=models/demo/target.gin '
                       '--gin.MODEL_CONFIG="@demo_target/t5.T5Config()" '
                       '--gin.WORKDIR="\'out/demo_target\'" '
                       '--gin.OUTPUT_DIR="\'spec_decode/data/models/target\'"')


def evaluate(params: Any, model: Transformer, cfg: TrainConfig) -> float:
  """Mean token cross entropy over the first `eval_batches` validation batches."""
  total, tokens = 0.0, 0.0
  batches = dataset(cfg, 'validation', shuffle=False, seed=0)
  for _, batch in zip(range(cfg.eval_batches), batches):
    ce, n = eval_step(params, batch, model=model)
    total, tokens = total + float(ce), tokens + float(n)
  return total / max(tokens, 1.0)
