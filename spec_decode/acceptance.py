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

from spec_decode import drafts
from spec_decode import lm
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import text


ALPHA_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)

# What can stand as M_q: a second T5 model or a provider of `spec_decode.drafts`.
Draft = models.T5Model | drafts.DraftProvider


def teacher_forced_logits(model: Draft, encoder_input_tokens: jax.Array,
                          decoder_input_tokens: jax.Array) -> jax.Array:
  """One full-sequence pass: [B, S] inputs, [B, L] decoder inputs -> [B, L, V].

  A draft provider makes it one call of its step function over all L positions
  (which the step-function contract makes equal to L single calls).
  """
  if isinstance(model, models.T5Model):
    return model.network.apply({'params': model.params}, encoder_input_tokens,
                               decoder_input_tokens)
  step_fn, cache = model.start(encoder_input_tokens, decoder_input_tokens.shape[1])
  return step_fn(decoder_input_tokens, cache)[0]


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
def betas(target: models.T5Model, draft: Draft, encoder_input_tokens: jax.Array,
          tokens: jax.Array, sampling: sampling_lib.SamplingParams,
          draft_sampling: sampling_lib.SamplingParams | None = None) -> jax.Array:
  """beta at every position of given output sequences, one pass per model.

  Args:
    target: M_p.
    draft: M_q, same vocabulary.
    encoder_input_tokens: [B, S] int32, 0 = padding.
    tokens: [B, L] int32 outputs; position j holds token j + 1 of the output.
    sampling: applied to p (and to q unless draft_sampling is given).
    draft_sampling: q's own knobs, as `speculative_generate` takes them
      (e.g. `sampling.untruncated()`); None: `sampling`.

  Returns:
    [B, L] float32 sum_x min(p_j(x), q_j(x)), p_j and q_j the adjusted
    distributions of output token j + 1 given tokens 1..j.
  """
  decoder_input_tokens = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # BOS, shifted right
  p = sampling_lib.adjust(teacher_forced_logits(target, encoder_input_tokens,
                                                decoder_input_tokens), sampling)
  q = sampling_lib.adjust(teacher_forced_logits(draft, encoder_input_tokens,
                                                decoder_input_tokens),
                           sampling if draft_sampling is None else draft_sampling)
  return jnp.sum(jnp.minimum(p, q), axis=-1)


def _batches(n: int, batch_size: int) -> Iterator[np.ndarray]:
  """Row indices of each batch; the last is padded by repeating its last row."""
  for start in range(0, n, batch_size):
    yield np.minimum(np.arange(start, start + batch_size), n - 1)


def generate_sequences(target: models.T5Model, encoder_input_tokens: np.ndarray, *,
                       sampling: sampling_lib.SamplingParams, max_decode_len: int,
                       rng: jax.Array, batch_size: int = 16,
                       progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """The target's own outputs, batched (input i sampled with fold_in(rng, i)).

  Returns:
    tokens [N, max_decode_len] int32 (EOS included, 0 after) and lengths [N].
  """
  n = len(encoder_input_tokens)
  keys = jax.vmap(functools.partial(jax.random.fold_in, rng))(jnp.arange(n))
  tokens, lengths = [], []
  for rows in tqdm.tqdm(list(_batches(n, batch_size)), desc='generate', disable=not progress):
    out = models.generate(target, jnp.asarray(encoder_input_tokens[rows]), keys[rows],
                          max_decode_len=max_decode_len, sampling=sampling, eos_id=text.EOS_ID)
    tokens.append(np.asarray(out.tokens))
    lengths.append(np.asarray(out.lengths))
  return np.concatenate(tokens)[:n], np.concatenate(lengths)[:n]


def measure_alpha(target: models.T5Model, draft: Draft, encoder_input_tokens: np.ndarray,
                  tokens: np.ndarray, lengths: np.ndarray, *,
                  sampling: sampling_lib.SamplingParams, batch_size: int = 16,
                  draft_sampling: sampling_lib.SamplingParams | None = None) -> AlphaStats:
  """alpha of a draft on the target's outputs (from `generate_sequences`).

  Args:
    target: M_p, which generated `tokens` with the same `sampling`.
    draft: M_q, a T5Model or a draft provider.
    encoder_input_tokens: [N, S] int32.
    tokens: [N, L] int32 the target's outputs.
    lengths: [N] their lengths.
    sampling: applied to p (and to q unless draft_sampling is given).
    batch_size: rows per teacher-forced pass.
    draft_sampling: q's own knobs (`betas`); None: `sampling`.
  """
  n = len(tokens)
  per_row = [np.asarray(betas(target, draft, jnp.asarray(encoder_input_tokens[rows]),
                              jnp.asarray(tokens[rows]), sampling, draft_sampling))
             for rows in _batches(n, batch_size)]
  return AlphaStats.from_betas(np.concatenate(per_row)[:n], lengths)


@jax.jit
def lm_betas(target, draft, prompt_tokens: jax.Array, lengths: jax.Array, tokens: jax.Array,
             sampling: sampling_lib.SamplingParams) -> jax.Array:
  """`betas` for decoder-only models (spec_decode.lm): outputs after prompts.

  Each model's step function over the whole output in one call (the
  step-function contract makes it equal to one call per token).

  Args:
    target, draft: decoder-only models (or a draft behind prompts) of one vocabulary.
    prompt_tokens: [B, P] int32 prompts, lengths [B] int32.
    tokens: [B, L] int32 the target's continuations.
    sampling: applied to p and q.

  Returns:
    [B, L] float32 beta of each continuation token.
  """
  inputs = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # loop position 0 reads the prompt's end

  def distribution(model):
    step_fn, cache = model.start(prompt_tokens, tokens.shape[1], lengths)
    return sampling_lib.adjust(step_fn(inputs, cache)[0], sampling)

  return jnp.sum(jnp.minimum(distribution(target), distribution(draft)), axis=-1)


def generate_lm_sequences(target, prompt_tokens: np.ndarray, lengths: np.ndarray, *,
                          sampling: sampling_lib.SamplingParams, max_decode_len: int,
                          rng: jax.Array, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """A decoder-only target's continuations of prompts (prompt i sampled with fold_in(rng, i)).

  Returns:
    tokens [N, max_decode_len] int32 (EOS included, 0 after) and lengths [N].
  """
  n = len(prompt_tokens)
  keys = jax.vmap(functools.partial(jax.random.fold_in, rng))(jnp.arange(n))
  tokens, generated = [], []
  for rows in _batches(n, batch_size):
    out = lm.generate(target, jnp.asarray(prompt_tokens[rows]), jnp.asarray(lengths[rows]),
                      keys[rows], max_decode_len=max_decode_len, eos_id=text.EOS_ID,
                      sampling=sampling)
    tokens.append(np.asarray(out.tokens))
    generated.append(np.asarray(out.generated))
  return np.concatenate(tokens)[:n], np.concatenate(generated)[:n]


def measure_lm_alpha(target, draft, prompt_tokens: np.ndarray, lengths: np.ndarray,
                     tokens: np.ndarray, output_lengths: np.ndarray, *,
                     sampling: sampling_lib.SamplingParams, batch_size: int = 64) -> AlphaStats:
  """alpha of a draft on a decoder-only target's continuations (`lm.generate`'s tokens)."""
  n = len(tokens)
  per_row = [np.asarray(lm_betas(target, draft, jnp.asarray(prompt_tokens[rows]),
                                 jnp.asarray(lengths[rows]), jnp.asarray(tokens[rows]), sampling))
             for rows in _batches(n, batch_size)]
  return AlphaStats.from_betas(np.concatenate(per_row)[:n], output_lengths)
