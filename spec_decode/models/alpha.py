"""alpha (Table 3) without running the algorithm.

The target generates sequences (greedy or sampled, `generate_sequences`),
then ONE teacher-forced pass of each model over them gives p and q at every
generated position, adjusted with the same SamplingParams, and

  beta = sum_x min(p(x), q(x)),   alpha = E[beta]

over all positions (at temperature 0, beta is 1 where the argmaxes agree,
else 0). `AlphaStats` keeps the mean, a cluster-robust standard error and the
per-sequence spread.
"""

import dataclasses
import functools
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from spec_decode import sampling as sampling_lib
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.models.t5 import T5Model

ALPHA_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def teacher_forced_logits(model: protocol.Model, batch: protocol.Batch,
                          decoder_input_tokens: jax.Array) -> jax.Array:
  """One full-sequence pass: a batch, [B, L] loop tokens -> [B, L, V] logits.

  A T5Model runs its whole network at once (T5X's teacher forcing); any other
  model makes one call of its step function over all L positions (which the
  step-function contract makes equal to L single calls). For a decoder-only
  model loop position 0 reads the prompt's last token, whatever is there.
  """
  if isinstance(model, T5Model):
    return model.network.apply({'params': model.params}, batch.tokens, decoder_input_tokens)
  step_fn, cache = model.start(batch, decoder_input_tokens.shape[1])
  return step_fn(decoder_input_tokens, cache)[0]


def pair_logits(target: protocol.Model, draft: protocol.Model, batch: protocol.Batch,
                decoder_input_tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Both models' [B, L, V] logits over [B, L] loop tokens, for a draft over the target's features.

  The target's pass keeps its features at every position, the draft then
  reads them all (models.feature_draft): its q where it drafts from the
  target's features, its first draft step of an iteration.
  """
  length = decoder_input_tokens.shape[1]
  (target_step, target_cache), (draft_step, draft_cache), feed = draft.start_pair(
      target, batch, length + 1)  # one more: feed's window reaches a position past the tokens
  target_logits, target_cache = target_step(decoder_input_tokens, target_cache)
  draft_cache = feed(draft_cache, target_cache, jnp.zeros_like(draft_cache.index), length)
  return target_logits, draft_step(decoder_input_tokens, draft_cache)[0]


@dataclasses.dataclass(frozen=True)
class AlphaStats:
  """alpha = E[beta] over the positions of target-generated sequences.

  Attributes:
    alpha: mean beta over all generated positions (each token weighs the same).
    stderr: its standard error. Positions of one sequence are correlated, so
      it is the ratio estimator's, from per-sequence sums (cluster-robust).
    std: standard deviation of beta over positions.
    betas: each sequence's [length] betas (also for predictions that let
      acceptance vary by position, `theory.expected_calls_along`), from which
      `sequence_alpha` ([N] mean beta of each sequence) and `positions`.
  """

  alpha: float
  stderr: float
  std: float
  betas: tuple[np.ndarray, ...]

  @property
  def sequence_alpha(self) -> np.ndarray:
    return np.array([np.mean(b) for b in self.betas], np.float64)

  @property
  def positions(self) -> int:
    return sum(len(b) for b in self.betas)

  @classmethod
  def from_betas(cls, betas: np.ndarray, lengths: np.ndarray) -> 'AlphaStats':
    """[N, L] beta per position and [N] generated lengths -> the statistics."""
    betas, lengths = np.asarray(betas, np.float64), np.asarray(lengths)
    mask = np.arange(betas.shape[1])[None, :] < lengths[:, None]
    sums = np.sum(np.where(mask, betas, 0.0), axis=1)
    total = int(lengths.sum())
    alpha = float(sums.sum() / total)
    m = len(lengths)
    spread = np.sqrt(m / (m - 1) * np.sum((sums - alpha * lengths)**2)) if m > 1 else np.nan
    return cls(alpha=alpha, stderr=float(spread / total), std=float(np.std(betas[mask])),
               betas=tuple(row[:length] for row, length in zip(betas, lengths)))

  def row(self) -> dict[str, float]:
    """The flat record a report row takes (quantiles of `sequence_alpha`)."""
    quantiles = np.quantile(self.sequence_alpha, ALPHA_QUANTILES)
    return dict(alpha=self.alpha, stderr=self.stderr, std=self.std,
                sequences=len(self.sequence_alpha), positions=self.positions,
                **{f'q{round(100 * q)}': float(v) for q, v in zip(ALPHA_QUANTILES, quantiles)})


@jax.jit
def betas(target: protocol.Model, draft: protocol.Model, batch: protocol.Batch,
          tokens: jax.Array, sampling: sampling_lib.SamplingParams,
          draft_sampling: sampling_lib.SamplingParams | None = None) -> jax.Array:
  """beta at every position of given output sequences, one pass per model.

  Args:
    target: M_p.
    draft: M_q, same vocabulary.
    batch: the inputs (`front_ends.make_batch`).
    tokens: [B, L] int32 outputs; position j holds output token j + 1.
    sampling: applied to p (and to q unless draft_sampling is given).
    draft_sampling: q's own knobs, as `speculative_generate` takes them
      (e.g. `sampling.untruncated()`); None: `sampling`.

  Returns:
    [B, L] float32 sum_x min(p_j(x), q_j(x)), p_j and q_j the adjusted
    distributions of output token j + 1 given tokens 1..j.
  """
  inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # BOS (or the prompt's end), shifted right
  if hasattr(draft, 'start_pair'):
    target_logits, draft_logits = pair_logits(target, draft, batch, inputs)
  else:
    target_logits = teacher_forced_logits(target, batch, inputs)
    draft_logits = teacher_forced_logits(draft, batch, inputs)
  p = sampling_lib.adjust(target_logits, sampling)
  q = sampling_lib.adjust(draft_logits, sampling if draft_sampling is None else draft_sampling)
  return jnp.sum(jnp.minimum(p, q), axis=-1)


def _batches(n: int, batch_size: int) -> Iterator[np.ndarray]:
  """Row indices of each batch; the last is padded by repeating its last row."""
  for start in range(0, n, batch_size):
    yield np.minimum(np.arange(start, start + batch_size), n - 1)


def _rows(array: np.ndarray | None, rows: np.ndarray) -> jax.Array | None:
  return None if array is None else jnp.asarray(array[rows])


def generate_sequences(target: protocol.Model, inputs: np.ndarray, *,
                       sampling: sampling_lib.SamplingParams, max_decode_len: int,
                       rng: jax.Array, lengths: np.ndarray | None = None, batch_size: int = 16,
                       eos_id: int | None = None,
                       progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """The target's own outputs, batched (input i sampled with fold_in(rng, i)).

  Args:
    target: M_p.
    inputs: [N, S] int32 encoder inputs or prompts; lengths: [N] prompt
      lengths of a decoder-only target (None: every row S long).
    sampling, max_decode_len, eos_id: as `generate` takes them.
    rng: one PRNG key.
    batch_size: rows per call.
    progress: show a progress bar.

  Returns:
    tokens [N, max_decode_len] int32 (EOS included, 0 after) and the
    generated lengths [N].
  """
  n = len(inputs)
  keys = jax.vmap(functools.partial(jax.random.fold_in, rng))(jnp.arange(n))
  tokens, generated = [], []
  for rows in tqdm.tqdm(list(_batches(n, batch_size)), desc='generate', disable=not progress):
    out = front_ends.generate(target, jnp.asarray(inputs[rows]), keys[rows],
                                lengths=_rows(lengths, rows), max_decode_len=max_decode_len,
                                sampling=sampling, eos_id=eos_id)
    tokens.append(np.asarray(out.tokens))
    generated.append(np.asarray(out.generated))
  return np.concatenate(tokens)[:n], np.concatenate(generated)[:n]


def measure_alpha(target: protocol.Model, draft: protocol.Model, inputs: np.ndarray,
                  tokens: np.ndarray, output_lengths: np.ndarray, *,
                  sampling: sampling_lib.SamplingParams, lengths: np.ndarray | None = None,
                  batch_size: int = 16,
                  draft_sampling: sampling_lib.SamplingParams | None = None) -> AlphaStats:
  """alpha of a draft on the target's outputs (from `generate_sequences`).

  Args:
    target: M_p, which generated `tokens` with the same `sampling`.
    draft: M_q, a model or a draft of spec_decode.models.drafts.
    inputs: [N, S] int32 encoder inputs or prompts.
    tokens: [N, L] int32 the target's outputs.
    output_lengths: [N] their lengths.
    sampling: applied to p (and to q unless draft_sampling is given).
    lengths: [N] prompt lengths of a decoder-only target, or None.
    batch_size: rows per teacher-forced pass.
    draft_sampling: q's own knobs (`betas`); None: `sampling`.
  """
  n = len(tokens)
  per_row = []
  for rows in _batches(n, batch_size):
    batch = front_ends.make_batch(target, jnp.asarray(inputs[rows]), _rows(lengths, rows))
    per_row.append(np.asarray(betas(target, draft, batch, jnp.asarray(tokens[rows]), sampling,
                                    draft_sampling)))
  return AlphaStats.from_betas(np.concatenate(per_row)[:n], output_lengths)
