"""White-box draft distillation (DistillSpec, Zhou et al., ICLR 2024).

The bundled drafts learnt the target's outputs as hard labels (sequence-level
distillation, `spec_decode.training.distill` + `spec_decode.training.train`). Here the draft M_q
learns the target M_p's whole next-token distribution at every position: both
run teacher-forced on the same decoder inputs in one compiled step, the target
forward only, and the draft descends a divergence between
p = softmax(target logits / T) and q = softmax(draft logits / T):

  tvd  1 - sum_x min(p, q) = 0.5 sum_x |p - q|; alpha = 1 - E[tvd], so this
       maximises the acceptance rate itself
  fkl  KL(p || q), the usual distillation loss (covers all of p's mass)
  rkl  KL(q || p) (q seeks p's modes)
  jsd  0.5 KL(p || m) + 0.5 KL(q || m), m = (p + q) / 2

The sequences are a mix (shares of the examples): references of local tasks,
the target's own outputs (records of scripts/distill.py) and on-policy data,
the current draft's own samples for training inputs, drawn anew every
`on_policy_every` steps (DistillSpec found draft-generated data the most
reliable). beta = sum_x min(p, q) over the training positions is a running
alpha estimate; every `eval_every` steps alpha itself is measured as for
Table 3 (scripts/measure_alpha.py): on the target's own samples for
validation inputs, the prefixes speculative sampling meets. Optimizer,
checkpoints and resumption are `spec_decode.training.train`'s; the log is
WORKDIR/log.jsonl.

  python scripts/whitebox.py --gin_file=runs/whitebox.gin ...  (see the gin file)
"""

import dataclasses
import functools
import json
import pathlib
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm

from spec_decode.models import alpha as alpha_lib
from spec_decode import checkpoints
from spec_decode import data
from spec_decode.cli import gin_utils
from spec_decode.cli.gin_utils import ConfigError
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.t5.config import T5Config
from spec_decode.t5.network import Transformer
from spec_decode.training import batches as batches_lib
from spec_decode.training import checks
from spec_decode.training import distill
from spec_decode.training import train as train_lib

DIVERGENCES = ('tvd', 'fkl', 'rkl', 'jsd')


class Stats(NamedTuple):
  """Means over the masked-in positions of a batch (float32 scalars).

  Attributes:
    loss: the divergence between p and q.
    beta: sum_x min(p, q); its mean over the target's own prefixes is alpha.
    agreement: argmax p == argmax q, alpha at temperature 0.
  """

  loss: jax.Array
  beta: jax.Array
  agreement: jax.Array


def divergence(name: str, target_logits: jax.Array, draft_logits: jax.Array, mask: jax.Array,
               temperature: float | jax.Array) -> Stats:
  """A divergence between the target's and the draft's next-token distributions.

  Args:
    name: 'tvd', 'fkl', 'rkl' or 'jsd' (see the module docstring).
    target_logits: [B, L, V] finite logits of M_p.
    draft_logits: [B, L, V] finite logits of M_q.
    mask: [B, L] bool, the positions to average over.
    temperature: T > 0; p = softmax(target_logits / T), q likewise.

  Returns:
    Stats, each the mean over the masked-in positions (0 when there are none),
    in float32 from log-softmaxes.

  Raises:
    ValueError: an unknown name, logits of different shapes or a mask not
      [B, L] (naming the shapes), or a temperature given as a number that is
      not finite and > 0.
  """
  if name not in DIVERGENCES:
    raise ValueError(f'unknown divergence {name!r}; choose one of {DIVERGENCES}')
  checks.divergence_inputs(target_logits, draft_logits, mask, temperature)
  log_p = jax.nn.log_softmax(target_logits.astype(jnp.float32) / temperature, axis=-1)
  log_q = jax.nn.log_softmax(draft_logits.astype(jnp.float32) / temperature, axis=-1)
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  if name == 'tvd':
    per_position = 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
  elif name == 'fkl':
    per_position = jnp.sum(p * (log_p - log_q), axis=-1)
  elif name == 'rkl':
    per_position = jnp.sum(q * (log_q - log_p), axis=-1)
  else:
    log_m = jnp.logaddexp(log_p, log_q) - jnp.log(2.0)
    per_position = 0.5 * jnp.sum(p * (log_p - log_m) + q * (log_q - log_m), axis=-1)
  agreement = jnp.argmax(target_logits, axis=-1) == jnp.argmax(draft_logits, axis=-1)

  def mean(x):  # [B, L] -> [] over the mask (where: padding's values never enter)
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)

  return Stats(mean(per_position), mean(jnp.sum(jnp.minimum(p, q), axis=-1)),
               mean(agreement.astype(jnp.float32)))


@dataclasses.dataclass(frozen=True)
class WhiteboxConfig:
  """Settings of one white-box distillation run, each checked when it is built.

  Attributes:
    divergence: 'tvd', 'fkl', 'rkl' or 'jsd'.
    temperature: T of p and q in the training divergence, > 0.
    tasks: (local task, weight > 0) pairs: the inputs of references and
      on-policy samples (train splits, drawn by weight) and of the evaluation
      (validation splits, in proportion).
    distill_dir: a scripts/distill.py folder (its train.jsonl).
    reference_weight, distilled_weight, on_policy_weight: the shares of the
      examples (normalised; each example's source is drawn) that are the
      tasks' references, the records of distill_dir, the draft's samples.
    on_policy_every: steps between fresh pools of draft samples (a pool is
      cycled through until the next).
    on_policy_samples: inputs per pool, one draft sample each.
    on_policy_temperature: the draft's sampling temperature (0: greedy).
    max_decode_len: most tokens of a draft or evaluation sample, EOS
      included; at most target_buckets[-1].
    eval_every: steps between measurements of alpha.
    eval_examples: validation inputs of the measurement (0: none).
    eval_temperature: the temperature of alpha and of the target's samples
      (0: greedy outputs, alpha the argmax agreement).
    log_every: steps between log lines (means over those steps).
    init_checkpoint: the draft's parameters (T5X, orbax or Hugging Face) when
      the workdir holds no checkpoint yet; random ones without it.
    num_steps, batch_tokens, input_buckets, target_buckets, optimizer,
    learning_rate, warmup_steps, weight_decay, checkpoint_every, seed: as in
      `spec_decode.training.train.TrainConfig` (longer outputs are cut to the last
      target bucket).
    train_seconds: a bound on this call's training time (None: none): the
      first step that ends past it is checkpointed, logged ({step,
      stopped_early, time}) and exported like the last, and training ends
      there (the learning-rate schedule stays num_steps' own).
    compile_buckets: compile the step for every bucket shape at once before
      training (`spec_decode.training.batches.compile_buckets`): on an accelerator a
      compile costs hundreds of steps, and the loop would meet the shapes
      one at a time; on a CPU a short run may never meet some of them.
  """

  divergence: str = 'fkl'
  temperature: float = 1.0
  tasks: tuple[tuple[str, float], ...] = (('demo_ende', 2.0), ('demo_multi30k', 2.0),
                                          ('demo_debsum', 1.0))
  distill_dir: str | None = None
  reference_weight: float = 0.5
  distilled_weight: float = 0.0
  on_policy_weight: float = 0.5
  on_policy_every: int = 10
  on_policy_samples: int = 256
  on_policy_temperature: float = 1.0
  max_decode_len: int = 64
  eval_every: int = 50
  eval_examples: int = 200
  eval_temperature: float = 1.0
  log_every: int = 10
  init_checkpoint: str | None = None
  num_steps: int = 500
  batch_tokens: int = 4096
  input_buckets: tuple[int, ...] = (32, 64, 128, 256)
  target_buckets: tuple[int, ...] = (32, 64)
  optimizer: str = 'adafactor'
  learning_rate: float = 1e-3
  warmup_steps: int = 50
  weight_decay: float = 0.01
  checkpoint_every: int = 100
  seed: int = 0
  train_seconds: float | None = None
  compile_buckets: bool = False

  def __post_init__(self):
    checks.whitebox_config(self, DIVERGENCES)

  def train_config(self) -> train_lib.TrainConfig:
    """The fields `spec_decode.training.train.optimizer` and `batches.bucketed_batches` read."""
    return train_lib.TrainConfig(
        num_steps=self.num_steps, batch_tokens=self.batch_tokens,
        input_buckets=self.input_buckets, target_buckets=self.target_buckets,
        optimizer=self.optimizer, learning_rate=self.learning_rate,
        warmup_steps=self.warmup_steps, weight_decay=self.weight_decay, seed=self.seed)


def _logits(network: Transformer, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
  return network.apply({'params': params}, batch['encoder_input_tokens'],
                       batch['decoder_input_tokens'])  # [B, L, V] float32


@functools.partial(jax.jit, static_argnames=('draft', 'target', 'tx', 'name'), donate_argnums=0)
def train_step(state: train_lib.TrainState, target_params: Any, batch: dict[str, jax.Array],
               temperature: float, *, draft: Transformer, target: Transformer,
               tx: optax.GradientTransformation, name: str):
  """One optimizer step of the draft (`state`, donated) towards the target's distributions.

  Args:
    state: the draft's TrainState.
    target_params: the target's parameters (forward only, no gradients).
    batch: encoder_input_tokens [B, S], decoder_input_tokens [B, L] (outputs
      shifted right after a 0), decoder_loss_weights [B, L].
    temperature: T of p and q.
    draft, target: the two networks.
    tx: the optimizer.
    name: the divergence.

  Returns:
    The new state and the batch's Stats before the step.
  """
  target_logits = jax.lax.stop_gradient(_logits(target, target_params, batch))
  mask = batch['decoder_loss_weights'] > 0

  def loss_fn(params):
    stats = divergence(name, target_logits, _logits(draft, params, batch), mask, temperature)
    return stats.loss, stats

  grads, stats = jax.grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return train_lib.TrainState(step=state.step + 1, params=params, opt_state=opt_state), stats


def evaluation_set(target: models.T5Model,
                   cfg: WhiteboxConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The target's own samples at eval_temperature for seeded validation inputs.

  Returns:
    encoder inputs [N, S], output tokens [N, max_decode_len] and lengths [N]
    for `alpha_lib.measure_alpha`; N ~ eval_examples, by task weight.
  """
  weights = np.array([w for _, w in cfg.tasks]) / sum(w for _, w in cfg.tasks)
  texts = [e['inputs'] for (task, _), w in zip(cfg.tasks, weights) for e in
           distill.select_examples(task, 'validation', max(1, round(w * cfg.eval_examples)),
                                   seed=cfg.seed)]
  inputs = data.vocabulary().encode_batch(texts, cfg.input_buckets[-1])
  tokens, lengths = alpha_lib.generate_sequences(
      target, inputs, sampling=sampling_lib.SamplingParams.create(cfg.eval_temperature),
      max_decode_len=cfg.max_decode_len, rng=jax.random.key(cfg.seed),
      batch_size=min(distill.ROWS, len(texts)))
  return inputs, tokens, lengths


def train(target_config: T5Config, target_checkpoint: str, draft_config: T5Config,
          cfg: WhiteboxConfig, workdir: str, export_dir: str | None = None,
          allow_vocabulary_mismatch: bool = False) -> train_lib.TrainState:
  """Trains (or resumes) a draft on the target's distributions; returns the final state.

  Args:
    target_config: the target's sizes.
    target_checkpoint: its T5X, orbax or Hugging Face checkpoint.
    draft_config: the draft's sizes (same vocabulary; no dropout is used).
    cfg: the run's settings.
    workdir: holds `checkpoints/` (orbax, resumed from) and `log.jsonl`: one
      line per `log_every` steps {step, loss, beta, agreement (means over
      those steps), seconds (since this call's first step), seconds_per_step,
      time}, per measurement {step, eval_alpha, eval_alpha_stderr, time}
      (also at step 0), per on-policy pool {step, on_policy_length,
      on_policy_eos, time}.
    export_dir: where the final draft goes as a bfloat16 T5X checkpoint (none
      without it), with the vocabulary's record; it must not exist or be empty.
    allow_vocabulary_mismatch: warn instead of failing when the target, the
      init_checkpoint, the distill_dir records or a resumed run were recorded
      with another vocabulary than the bundled one, or with different ones.

  Returns:
    The draft's TrainState after `cfg.num_steps` steps (fewer when
    `cfg.train_seconds` ran out).

  Raises:
    ConfigError: a non-empty export_dir, different vocab_sizes, a vocabulary
      larger than a config's vocab_size, or a workdir past `cfg.num_steps`.
    ValueError: a vocabulary mismatch.
  """
  if export_dir and pathlib.Path(export_dir).is_dir() and any(pathlib.Path(export_dir).iterdir()):
    raise ConfigError(f'the export directory {export_dir} is not empty')
  if draft_config.vocab_size != target_config.vocab_size:
    raise ConfigError(f'draft vocab_size {draft_config.vocab_size} != target vocab_size '
                      f'{target_config.vocab_size}')
  vocabulary, allow = data.vocabulary(), allow_vocabulary_mismatch
  checks.model_vocabulary(target_config, vocabulary, 'the target config')
  checks.checkpoint_vocabulary(target_checkpoint, vocabulary, allow)
  if cfg.distilled_weight:
    checks.checkpoint_vocabulary(cfg.distill_dir, vocabulary, allow)
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  manager = train_lib.checkpoint_manager(workdir)
  checks.run_vocabulary(manager.directory, vocabulary, allow)
  if manager.latest_step() is None:
    checks.checkpoint_vocabulary(cfg.init_checkpoint, vocabulary, allow)
  target = models.T5Model(target_config, jax.device_put(
      checkpoints.load_params(target_checkpoint, target_config, dtype=jnp.float32)))
  tx = train_lib.optimizer(cfg.train_config())
  state = train_lib.start_state(manager, draft_config, tx, cfg.seed, cfg.init_checkpoint)
  start = int(state.step)
  if start > cfg.num_steps:
    raise ConfigError(f'num_steps = {cfg.num_steps}, but {workdir} already holds step {start}: '
                      'raise num_steps or start a new WORKDIR')
  print(f'{cfg.divergence} at T = {cfg.temperature}; steps {start} -> {cfg.num_steps}',
        flush=True)
  mixture = distill.Mixture(cfg, seed=cfg.seed + start)
  batches = mixture.batches()
  eval_set = evaluation_set(target, cfg) if cfg.eval_examples else None
  log = open(workdir / 'log.jsonl', 'a')
  bar = tqdm.tqdm(total=cfg.num_steps, initial=start, unit='step', dynamic_ncols=True)

  def record(step: int, fields: dict[str, float]) -> None:
    log.write(json.dumps({'step': step, **fields, 'time': time.time()}) + '\n')
    log.flush()

  def evaluate(step: int, params: Any) -> None:
    alpha = alpha_lib.measure_alpha(
        target, models.T5Model(draft_config, params), *eval_set,
        sampling=sampling_lib.SamplingParams.create(cfg.eval_temperature),
        batch_size=min(distill.ROWS, len(eval_set[0])))
    record(step, {'eval_alpha': alpha.alpha, 'eval_alpha_stderr': alpha.stderr})
    bar.write(f'step {step}: alpha {alpha.alpha:.4f} +- {alpha.stderr:.4f} '
              f'(T = {cfg.eval_temperature})')

  if start == 0 and eval_set is not None:
    evaluate(0, state.params)
  step_fn = lambda state, batch: train_step(  # pylint: disable=unnecessary-lambda-assignment
      state, target.params, batch, cfg.temperature, draft=Transformer(draft_config),
      target=target.network, tx=tx, name=cfg.divergence)
  if cfg.compile_buckets:
    seconds = time.perf_counter()
    batches_lib.compile_buckets(step_fn, state, cfg.train_config())
    bar.write(f'compiled the step for every bucket shape in {time.perf_counter() - seconds:.1f} s')
  t0 = last = time.perf_counter()
  deadline = None if cfg.train_seconds is None else t0 + cfg.train_seconds
  stats = []
  for step in range(start, cfg.num_steps):
    if cfg.on_policy_weight and (step == start or step % cfg.on_policy_every == 0):
      draft = models.T5Model(draft_config, state.params)
      record(step, mixture.refresh(draft, jax.random.fold_in(jax.random.key(cfg.seed), step)))
    state, batch_stats = step_fn(state, next(batches))
    stats.append(batch_stats)
    done = step + 1
    # Checked before the step's logging, so that a stopped run's last step is logged and saved.
    stop = deadline is not None and done < cfg.num_steps and time.perf_counter() > deadline
    if done % cfg.log_every == 0 or done == cfg.num_steps or stop:
      means = dict(zip(Stats._fields, np.mean(jax.device_get(stats), axis=0).tolist()))
      now = time.perf_counter()
      record(done, {**means, 'seconds': now - t0, 'seconds_per_step': (now - last) / len(stats)})
      bar.set_postfix(loss=f'{means["loss"]:.4f}', alpha=f'{means["beta"]:.3f}')
      stats, last = [], now
    if eval_set is not None and (done % cfg.eval_every == 0 or done == cfg.num_steps):
      evaluate(done, state.params)
    if done % cfg.checkpoint_every == 0 or done == cfg.num_steps or stop:
      manager.save(done, args=ocp.args.StandardSave(state))
    bar.update(1)
    if stop:
      record(done, {'stopped_early': True})
      bar.write(f'train_seconds {cfg.train_seconds:g} ran out: stopped after step {done} '
                f'of {cfg.num_steps}', file=sys.stderr)
      break
  bar.close()
  log.close()
  manager.wait_until_finished()
  if export_dir:
    checkpoints.write_t5x(export_dir, jax.device_get(state.params), step=int(state.step),
                          dtype='bfloat16', vocabulary=vocabulary)
    print(f'wrote step {int(state.step)} to {export_dir} (bfloat16)')
  return state


def main(argv=None) -> int:
  """`scripts/whitebox.py`: gin-configured `train` (see gin/runs/whitebox.gin)."""
  return gin_utils.run(
      train, argv, prog='whitebox.py',
      description="Trains a draft on the target's next-token distributions (DistillSpec).",
      example='--gin_file=runs/whitebox.gin --gin_file=models/demo/target.gin '
      '--gin_file=models/demo/draft_small.gin --gin.TARGET_CONFIG="@demo_target/t5.T5Config()" '
      '--gin.TARGET_CHECKPOINT="\'spec_decode/data/models/target\'" '
      '--gin.DRAFT_CONFIG="@demo_draft_small/t5.T5Config()" '
      '--gin.INIT_CHECKPOINT="\'spec_decode/data/models/draft_small\'" '
      '--gin.WORKDIR="\'out/whitebox_small\'"')
