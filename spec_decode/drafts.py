"""Draft providers beyond a second model: n-gram tables, prompt lookup, uniform.

A draft provider plugs into the decoding loops exactly as a draft T5 model
does. It exposes what `models.T5Model` exposes to the loops:

  vocab_size                                    V, shared with the target
  start(encoder_input_tokens [B, S], capacity) -> (step_fn, cache)

with `step_fn(tokens [B, K], cache) -> (logits [B, K, V], cache)` honouring the
step-function contract of `spec_decode.decoding` (write K positions at each
row's `cache.index`, return index + K; a K-token call equals K single calls).
The logits define a proper distribution q, adjusted by the same sampling knobs
as p, so speculative sampling stays exact whatever q is: a poor q only lowers
alpha. Every provider here costs next to nothing per step (c ~ 0).

  TableDraft         q = unigram or bigram frequencies of the training targets
  PromptLookupDraft  q = one-hot of the continuation of the longest recent
                     n-gram match in the input or the output so far (copying)
  UniformDraft       q = uniform (the paper's curiosity: alpha > 0 even so)

Providers are pytrees (flax.struct dataclasses, sizes static) so that they
pass through `jax.jit` as arguments, as a T5Model does.
"""

from typing import Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding

BOS_ID, EOS_ID, PAD_ID = decoding.BOS_ID, 1, 0


class DraftProvider(Protocol):
  """What the loops and `models.speculative_generate` need of a draft M_q."""

  @property
  def vocab_size(self) -> int:
    ...

  def start(self, encoder_input_tokens: jax.Array,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    ...


def most_frequent_ids(stream: np.ndarray, vocab_size: int, size: int,
                      always: tuple[int, ...] = (BOS_ID, EOS_ID)) -> np.ndarray:
  """The `size` ids most frequent in a token stream, `always` included (ties: lower id).

  The ids a `models.PrunedHeadDraft` scores.

  Args:
    stream: 1-D int token ids (e.g. `harness.loading.target_token_stream`).
    vocab_size: V.
    size: N, in len(always) .. V.
    always: ids kept whatever their count (BOS, EOS).

  Returns:
    [size] int32 ids, ascending.

  Raises:
    ValueError: a size outside len(always) .. V, or ids (in stream or always)
      outside [0, V).
  """
  stream = np.asarray(stream)
  if any(not 0 <= i < vocab_size for i in always):
    raise ValueError(f'always holds ids outside [0, {vocab_size}): {always}')
  if not len(always) <= size <= vocab_size:
    raise ValueError(f'size must lie in {len(always)}..{vocab_size}, got {size}')
  if stream.size and (stream.min() < 0 or stream.max() >= vocab_size):
    raise ValueError(f'stream holds ids outside [0, {vocab_size})')
  counts = np.bincount(stream.astype(np.int64), minlength=vocab_size).astype(np.float64)
  counts[list(always)] = np.inf
  return np.sort(np.argsort(-counts, kind='stable')[:size]).astype(np.int32)


def _index_only_cache(batch: int, capacity: int) -> cache_lib.Cache:
  """The cache of a stateless draft: only the write index the loops rewind."""
  return cache_lib.Cache(index=jnp.zeros((batch,), jnp.int32), layers=None, capacity=capacity)


def _advance(cache: cache_lib.Cache, tokens: jax.Array) -> cache_lib.Cache:
  return cache.replace(index=cache.index + tokens.shape[1])


@flax.struct.dataclass
class TableDraft:
  """A zero-cost draft M_q whose q depends on at most the current token.

  Its step function returns `log_probs` (unigram) or `log_probs[token]`
  (bigram: the distribution of the token after the input token), so it needs
  no state: its cache is only the write index the loops rewind.

  Attributes:
    log_probs: [V] (unigram) or [V, V] (bigram, row t = log q(. | t)) float32.
  """

  log_probs: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.log_probs.shape[-1]

  @classmethod
  def estimate(cls, stream: np.ndarray, vocab_size: int, order: int,
               add_k: float = 0.01) -> 'TableDraft':
    """Add-k smoothed n-gram frequencies of a token stream.

    Args:
      stream: [T] ids, sequences separated by EOS (`harness.loading.target_token_stream`);
        a sequence's first token follows BOS.
      vocab_size: V.
      order: 1 (unigram) or 2 (bigram).
      add_k: pseudo-count added to every (context, token) pair, > 0.
    """
    if order not in (1, 2):
      raise ValueError(f'order must be 1 (unigram) or 2 (bigram), got {order}')
    if not add_k > 0:
      raise ValueError(f'add_k must be > 0, got {add_k}')
    stream = np.asarray(stream, np.int64)
    if order == 1:
      counts = np.bincount(stream, minlength=vocab_size).astype(np.float64) + add_k
    else:
      prev = np.concatenate([[BOS_ID], stream[:-1]])
      prev[prev == EOS_ID] = BOS_ID  # A new sequence starts after each EOS.
      pairs, pair_counts = np.unique(prev * vocab_size + stream, return_counts=True)
      counts = np.full((vocab_size, vocab_size), add_k, np.float32)
      counts.reshape(-1)[pairs] += pair_counts
    log_probs = np.log(counts) - np.log(counts.sum(-1, keepdims=True))
    return cls(jnp.asarray(log_probs, jnp.float32))

  def logits(self, decoder_input_tokens: jax.Array) -> jax.Array:
    """[B, L] int32 input tokens -> [B, L, V] float32 log q of the next token."""
    if self.log_probs.ndim == 1:
      return jnp.broadcast_to(self.log_probs, decoder_input_tokens.shape + self.log_probs.shape)
    return self.log_probs[decoder_input_tokens]

  def start(self, encoder_input_tokens: jax.Array,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """A step function and its fresh cache, as `T5Model.start` (inputs unused)."""

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return self.logits(tokens), _advance(cache, tokens)

    return step_fn, _index_only_cache(encoder_input_tokens.shape[0], capacity)


@flax.struct.dataclass
class UniformDraft:
  """q uniform over the vocabulary, whatever the context.

  Each draft is accepted with probability sum_x min(p(x), 1/V) > 0 (at
  temperature 1). At temperature 0 q is the argmax one-hot of constant logits,
  i.e. token 0: a draft that is (almost) never accepted.

  Attributes:
    vocab_size: V (static).
  """

  vocab_size: int = flax.struct.field(pytree_node=False)

  def start(self, encoder_input_tokens: jax.Array,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """A step function and its fresh cache, as `T5Model.start` (inputs unused)."""

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return jnp.zeros(tokens.shape + (self.vocab_size,), jnp.float32), _advance(cache, tokens)

    return step_fn, _index_only_cache(encoder_input_tokens.shape[0], capacity)


@flax.struct.dataclass
class PromptLookupDraft:
  """Copying as a draft: the continuation of the longest recent n-gram match.

  At decoder position t the row's sequence so far is tokens 0..t (token 0 is
  BOS). For n = max_ngram down to 1, its last n tokens are looked up in

    the output so far: tokens j-n+1..j with j < t (continuation: token j + 1);
    the encoder input with BOS in front, [BOS, x_1 .. x_S], so that BOS lines
      up with the start of the input and the first proposal is x_1;

  and the proposal is the token after the match: the longest n wins, then the
  output over the input, then the latest position. Pad (0) is never proposed,
  so matches running into the input's padding do not count. q is the one-hot
  of the proposal (logits 0 there, -inf elsewhere): the accept test keeps it
  with probability p(proposal) and the residual is p without it, so the output
  is exactly p's. If nothing matches, q is uniform (logits 0 everywhere).

  Cost per row and position: O(max_ngram * (S + capacity)) comparisons.

  Attributes:
    vocab_size: V (static).
    max_ngram: longest n-gram looked up (static), >= 1.
  """

  vocab_size: int = flax.struct.field(pytree_node=False)
  max_ngram: int = flax.struct.field(pytree_node=False, default=3)

  def __post_init__(self):
    if not isinstance(self.max_ngram, int) or self.max_ngram < 1:
      raise ValueError(f'max_ngram must be an integer >= 1, got {self.max_ngram!r}')

  def start(self, encoder_input_tokens: jax.Array,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """A step function and its fresh cache, as `T5Model.start`.

    Args:
      encoder_input_tokens: [B, S] int32, left-aligned, 0 = padding.
      capacity: static decoder positions the token history holds.

    Returns:
      `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`
      and the fresh cache, whose layers are {'history': [B, capacity] int32
      decoder tokens, 'source': [B, S + 1] int32 BOS + encoder input}.
    """
    batch = encoder_input_tokens.shape[0]
    source = jnp.pad(jnp.asarray(encoder_input_tokens, jnp.int32), ((0, 0), (1, 0)),
                     constant_values=BOS_ID)
    layers = dict(history=jnp.zeros((batch, capacity), jnp.int32), source=source)
    cache = cache_lib.Cache(index=jnp.zeros((batch,), jnp.int32), layers=layers,
                            capacity=capacity)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      history = cache_lib.write(cache.layers['history'], tokens, cache.index)  # [B, C]
      positions = cache.index[:, None] + jnp.arange(tokens.shape[1])  # [B, K]
      proposal, found = self._propose(history, cache.layers['source'], positions)
      one_hot = jnp.where(jnp.arange(self.vocab_size) == proposal[..., None], 0.0, -jnp.inf)
      logits = jnp.where(found[..., None], one_hot, 0.0)  # [B, K, V]
      layers = dict(history=history, source=cache.layers['source'])
      return logits, cache.replace(index=cache.index + tokens.shape[1], layers=layers)

    return step_fn, cache

  def _propose(self, history: jax.Array, source: jax.Array,
               positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The proposed next token at each query position.

    Args:
      history: [B, C] decoder tokens; entries past a query position are
        ignored (they are its future, or stale).
      source: [B, S + 1] BOS + encoder input.
      positions: [B, K] query positions t.

    Returns:
      proposal: [B, K] int32 the token after the chosen match.
      found: [B, K] bool, some n-gram matched.
    """
    grams = jnp.arange(self.max_ngram)  # i: offset back from the window's end

    def windows(seq):
      """[B, L] -> [B, N, L]: entry (i, j) = seq[j - i], -1 before the start."""
      ends = jnp.arange(seq.shape[1])[None, :] - grams[:, None]  # [N, L]
      return jnp.where(ends >= 0, seq[:, jnp.maximum(ends, 0)], -1)

    # The last N tokens of every query, newest first: [B, K, N]; -2 before BOS
    # (never equal to a window's -1).
    back = positions[..., None] - grams
    last = jnp.where(back >= 0,
                     jnp.take_along_axis(history, jnp.maximum(back, 0).reshape(
                         back.shape[0], -1), axis=1).reshape(back.shape), -2)

    # Candidate windows over the input's positions, then the output's (later
    # wins ties): cand[b, i, j] is the token i places before position j.
    cand = jnp.concatenate([windows(source), windows(history)], axis=-1)  # [B, N, L]
    follow = jnp.concatenate([source[:, 1:], jnp.full_like(source[:, :1], PAD_ID),
                              history[:, 1:], jnp.full_like(history[:, :1], PAD_ID)],
                             axis=-1)  # [B, L]
    # [B, K, N, L]: the last i+1 tokens agree with the window ending at j.
    match = jnp.cumprod(cand[:, None] == last[..., None], axis=2).astype(bool)
    output_end = jnp.arange(history.shape[1])  # an output window must end before t
    known = jnp.concatenate([jnp.ones(positions.shape + source.shape[1:], bool),
                             output_end < positions[..., None]], axis=-1)  # [B, K, L]
    match &= (known & (follow != PAD_ID)[:, None, :])[:, :, None, :]

    # Per n, the latest matching window; then the longest n with a match.
    any_n = jnp.any(match, axis=-1)  # [B, K, N]
    latest = match.shape[-1] - 1 - jnp.argmax(match[..., ::-1], axis=-1)  # [B, K, N]
    n = self.max_ngram - 1 - jnp.argmax(any_n[..., ::-1], axis=-1)  # [B, K]: n - 1
    end = jnp.take_along_axis(latest, n[..., None], axis=-1)[..., 0]  # [B, K]
    proposal = jnp.take_along_axis(follow, end.reshape(end.shape[0], -1), axis=1).reshape(
        end.shape)
    return proposal.astype(jnp.int32), jnp.any(any_n, axis=-1)
