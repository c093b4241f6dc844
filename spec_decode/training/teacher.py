"""The target's own outputs with its next-token distributions: training data for a draft.

`generate_chunk` decodes a batch of prompts with a decoder-only target (a
LlamaModel, say) in one compiled scan and keeps, at every generated position,
the token chosen and the target's top-k log-probabilities at temperature 1.
A row decodes greedily (temperature 0) or samples at temperature 1, as its
`temperature` says: the prefixes the draft will meet at both temperatures
(on-policy for the target). A draft then learns the target's whole
distribution there (white-box, `spec_decode.training.llama_draft`), where
the top-k hold nearly all of its mass.

  chunk = generate_chunk(target, prompts, lengths, temperature, rng, steps=128, top_k=32)
  save_chunk(folder / 'chunk_00000.npz', chunk)
"""

import functools
import os
import pathlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.llama.network import LlamaNetwork
from spec_decode.models import protocol


class Chunk(NamedTuple):
  """A batch of prompts and the target's continuations (numpy arrays).

  Attributes:
    prompt: [B, P] int32 prompts, left-aligned, 0 past `prompt_length`.
    prompt_length: [B] int32.
    temperature: [B] float32, 0 (greedy) or 1.
    tokens: [B, S] int32 the generated tokens.
    length: [B] int32 tokens that count: up to and with the first EOS, else S.
    top_ids: [B, S, k] int32 the target's k most likely next tokens at each step.
    top_logp: [B, S, k] float16 their log-probabilities (temperature 1).
    features: None, or [B, P + S, E] float16 the target's final (normed)
      features after each token of `sequences(prompt, prompt_length, tokens)`
      (0 past the last computed one): what a draft over the target's
      features (spec_decode.llama.feature_draft) learns from.
  """

  prompt: np.ndarray
  prompt_length: np.ndarray
  temperature: np.ndarray
  tokens: np.ndarray
  length: np.ndarray
  top_ids: np.ndarray
  top_logp: np.ndarray
  features: np.ndarray | None = None


@functools.partial(jax.jit, static_argnames=('steps', 'top_k', 'features'))
def _scan(target, prompt, prompt_length, temperature, rng, *, steps: int, top_k: int,
          features: bool):
  batch = protocol.Batch.of(target, prompt, prompt_length)
  if features:  # a LlamaModel's step, its features kept
    network, variables = target.network, target.variables()
    _, cache = target.start(batch, steps)
    step_fn = lambda tokens, cache: network.apply(variables, tokens, cache,
                                                  method=LlamaNetwork.decode_features)
    head = lambda y: network.apply(variables, y, method=LlamaNetwork.logits)
  else:
    step_fn, cache = target.start(batch, steps)
    head = lambda logits: logits
  rows = prompt.shape[0]

  def body(carry, key):
    cache, token = carry
    out, cache = step_fn(token[:, None], cache)
    logp = jax.nn.log_softmax(head(out)[:, 0])  # [B, V]
    top_logp, top_ids = jax.lax.top_k(logp, top_k)
    sampled = jax.random.categorical(key, logp)
    token = jnp.where(temperature > 0, sampled, top_ids[:, 0]).astype(jnp.int32)
    kept = out[:, 0].astype(jnp.float16) if features else None
    return (cache, token), (token, top_ids, top_logp.astype(jnp.float16), kept)

  keys = jax.random.split(rng, steps)
  _, (tokens, top_ids, top_logp, kept) = jax.lax.scan(
      body, (cache, jnp.zeros(rows, jnp.int32)), keys)
  if features:  # the prompt's, then the step's (the first step reads the prompt's last token)
    prompt_features = network.apply(variables, prompt, method=LlamaNetwork.features)[0]
    kept = _lay_out(prompt_features.astype(jnp.float16), jnp.swapaxes(kept, 0, 1),
                    prompt_length)
  return tokens.T, top_ids.transpose(1, 0, 2), top_logp.transpose(1, 0, 2), kept


def _lay_out(prompt_features, step_features, prompt_length):
  """[B, P + S, E]: row b's prompt features [:n], its steps' at n - 1 .. n + S - 2 (n its length)."""
  rows, width, dim = prompt_features.shape
  steps = step_features.shape[1]
  out = jnp.zeros((rows, width + steps, dim), prompt_features.dtype)
  positions = jnp.arange(width + steps)[None, :, None]
  out = out.at[:, :width].set(jnp.where(positions[:, :width] < prompt_length[:, None, None],
                                        prompt_features, 0))
  place = lambda row, x, n: jax.lax.dynamic_update_slice_in_dim(row, x, n - 1, axis=0)
  return jax.vmap(place)(out, step_features, prompt_length)


def generate_chunk(target, prompt: np.ndarray, prompt_length: np.ndarray,
                   temperature: np.ndarray, rng: jax.Array, *, steps: int, top_k: int,
                   eos_id: int, features: bool = False) -> Chunk:
  """The target's continuations of `prompt` and its top-k distributions.

  Args:
    target: a decoder-only model (reads a prompt: spec_decode.models.protocol).
    prompt: [B, P] int32 prompts, left-aligned.
    prompt_length: [B] int32 in 1..P.
    temperature: [B] 0 (greedy) or 1 (sampling) per row.
    rng: a PRNG key.
    steps: static tokens generated per row.
    top_k: static log-probabilities kept per position.
    eos_id: the id that ends a row (`length` stops with it; the scan goes on).
    features: also keep the target's features along each row (a LlamaModel's;
      Chunk.features).
  """
  temperature = np.asarray(temperature, np.float32)
  if not np.all((temperature == 0) | (temperature == 1)):
    raise ValueError(f'temperature must be 0 or 1 per row, got {sorted(set(temperature))}')
  tokens, top_ids, top_logp, kept = jax.device_get(_scan(
      target, jnp.asarray(prompt, jnp.int32), jnp.asarray(prompt_length, jnp.int32),
      jnp.asarray(temperature), rng, steps=steps, top_k=top_k, features=features))
  ended = tokens == eos_id
  length = np.where(ended.any(1), ended.argmax(1) + 1, steps).astype(np.int32)
  return Chunk(np.asarray(prompt, np.int32), np.asarray(prompt_length, np.int32), temperature,
               tokens, length, top_ids, top_logp, kept)


def sequences(prompt: np.ndarray, prompt_length: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  """[B, P + S] int32: each row's prompt ([B, P], its first prompt_length [B]) then its tokens [B, S]."""
  seq = np.zeros((prompt.shape[0], prompt.shape[1] + tokens.shape[1]), np.int32)
  for r, n in enumerate(prompt_length):
    seq[r, :n] = prompt[r, :n]
    seq[r, n:n + tokens.shape[1]] = tokens[r]
  return seq


def score_chunk(target, prompt: np.ndarray, prompt_length: np.ndarray, tokens: np.ndarray,
                length: np.ndarray, *, top_k: int, features: bool = False) -> Chunk:
  """The target's top-k distributions along given continuations (teacher forcing; T = 1 rows).

  Args:
    target: a LlamaModel (its full-sequence path).
    prompt: [B, P] int32 prompts, left-aligned; prompt_length: [B].
    tokens: [B, S] int32 continuations (e.g. human answers, EOS after); length: [B] in 1..S.
    top_k: log-probabilities kept per position.
    features: also keep the target's features along each row, laid out as
      `generate_chunk` lays them out (Chunk.features).
  """
  rows, steps = tokens.shape
  top_ids, top_logp, kept = jax.device_get(_top_k_along(
      target, jnp.asarray(sequences(prompt, prompt_length, tokens)),
      jnp.asarray(prompt_length, jnp.int32), steps=steps, top_k=top_k, features=features))
  return Chunk(np.asarray(prompt, np.int32), np.asarray(prompt_length, np.int32),
               np.ones(rows, np.float32), np.asarray(tokens, np.int32),
               np.asarray(length, np.int32), top_ids, top_logp, kept)


@functools.partial(jax.jit, static_argnames=('steps', 'top_k', 'features'))
def _top_k_along(target, sequences, prompt_length, *, steps: int, top_k: int, features: bool):
  variables = {'params': target.params}
  y = target.network.apply(variables, sequences, method=LlamaNetwork.features)[0]  # [B, W, E]
  where = prompt_length[:, None] - 1 + jnp.arange(steps)  # [B, S]: the positions before each token
  logits = target.network.apply(variables, jnp.take_along_axis(y, where[:, :, None], axis=1),
                                method=LlamaNetwork.logits)
  top_logp, top_ids = jax.lax.top_k(jax.nn.log_softmax(logits), top_k)
  kept = None
  if features:  # after each token up to the last one a step reads (n + S - 2), zeros after
    known = jnp.arange(y.shape[1]) < (prompt_length + steps - 1)[:, None]  # [B, W]
    kept = jnp.where(known[:, :, None], y, 0).astype(jnp.float16)
  return top_ids, top_logp.astype(jnp.float16), kept


def save_chunk(path: str | os.PathLike, chunk: Chunk) -> None:
  """Writes `chunk` as an .npz, atomically (a partial file never has the final name)."""
  path = pathlib.Path(path)
  partial = path.with_name(path.name + '.partial')
  with open(partial, 'wb') as f:
    np.savez(f, **{k: v for k, v in chunk._asdict().items() if v is not None})
  os.replace(partial, path)


def concatenate(chunks: list[Chunk]) -> Chunk:
  """Chunks along the batch, prompts and continuations padded to the widest."""
  prompt = max(c.prompt.shape[1] for c in chunks)
  steps = max(c.tokens.shape[1] for c in chunks)
  k = min(c.top_ids.shape[2] for c in chunks)
  pad = lambda x, width: np.pad(x, [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
  keep_features = all(c.features is not None for c in chunks)
  chunks = [c._replace(prompt=pad(c.prompt, prompt), tokens=pad(c.tokens, steps),
                       top_ids=pad(c.top_ids[..., :k], steps),
                       top_logp=pad(c.top_logp[..., :k], steps),
                       features=pad(c.features, prompt + steps) if keep_features else None)
            for c in chunks]
  return Chunk(*(None if parts[0] is None else np.concatenate(parts) for parts in zip(*chunks)))


def load_chunks(folder: str | os.PathLike) -> Chunk:
  """Every chunk_*.npz of `folder`, in name order, concatenated (`concatenate`).

  Raises:
    FileNotFoundError: no chunk in the folder.
  """
  files = sorted(pathlib.Path(folder).glob('chunk_*.npz'))
  if not files:
    raise FileNotFoundError(f'no chunk_*.npz in {folder}: generate the teacher data first')
  return concatenate([Chunk(**dict(np.load(f))) for f in files])
