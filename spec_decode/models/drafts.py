"""Drafts beyond a second model: n-gram tables, prompt lookup, uniform.

Each is a model of the front ends (spec_decode.models.protocol): `vocab_size`
and `start(batch, capacity) -> (step_fn, cache)`, with `step_fn(tokens [B, K],
cache) -> (logits [B, K, V], cache)` honouring the step-function contract of
`spec_decode.decoding` (write K positions at each row's `cache.index`, return
index + K; a K-token call equals K single calls). They carry no `reads`: each
lines up with the target through `batch.reads`, so they serve every family
(an encoder input, or prompts behind which the loop starts). The logits
define a proper distribution q, adjusted by the same sampling knobs as p, so
speculative sampling stays exact whatever q is: a poor q only lowers alpha.
Every draft here costs next to nothing per step (c ~ 0).

  TableDraft         q = unigram or bigram frequencies (a bigram in bounded
                     memory: the k likeliest next tokens of each token, the
                     rest backed off to the unigram)
  PromptLookupDraft  q = one-hot of the continuation of the longest recent
                     n-gram match in the input or the output so far (copying)
  UniformDraft       q = uniform (the paper's curiosity: alpha > 0 even so)

Drafts are pytrees (flax.struct dataclasses, sizes static) so that they pass
through `jax.jit` as arguments, as a T5Model does.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode.models import protocol
from spec_decode.text import BOS_ID, EOS_ID, PAD_ID


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


def one_hot_logits(token: jax.Array, vocab_size: int) -> jax.Array:
  """[...] ids -> [..., V] float32 logits of the one-hot: 0 at the id, -inf elsewhere."""
  return jnp.where(jnp.arange(vocab_size) == token[..., None], 0.0, -jnp.inf)


def _advance(cache: cache_lib.Cache, tokens: jax.Array) -> cache_lib.Cache:
  return cache.replace(index=cache.index + tokens.shape[1])


def _sequences(batch: protocol.Batch) -> tuple[jax.Array, jax.Array]:
  """A decoder-only batch as the target reads it: [B, L] its start token and prompts, [B] lengths."""
  tokens = jnp.asarray(batch.tokens, jnp.int32)
  lengths = batch.prompt_lengths()
  if batch.start_id is None:
    return tokens, lengths
  start = jnp.full((batch.size, 1), batch.start_id, jnp.int32)
  return jnp.concatenate([start, tokens], axis=1), lengths + 1


@flax.struct.dataclass
class TableDraft:
  """A zero-cost draft M_q whose q depends on at most the current token.

  Unigram: q = `log_probs` everywhere. Bigram: after token t, the tokens
  `next_ids[t]` have log q `next_log_probs[t]` and every other token x has
  `log_probs[x] + rest_log_scale[t]` (the unigram, scaled to the mass left):
  [V, k] arrays instead of a dense [V, V] table (9 GiB in float32 for a
  49,152-token vocabulary), and exact add-k frequencies where k >= V.
  Stateless for an encoder input; behind a decoder-only target's prompts its
  q at loop position 0 follows the row's last prompt token.

  Attributes:
    log_probs: [V] float32 log q of the unigram (the bigram's back-off).
    next_ids: None (unigram), or [V, k] int32; entries equal to V are unused.
    next_log_probs: None, or [V, k] float32.
    rest_log_scale: None, or [V] float32 (-inf: no mass left to back off).
  """

  log_probs: jax.Array
  next_ids: jax.Array | None = None
  next_log_probs: jax.Array | None = None
  rest_log_scale: jax.Array | None = None

  @property
  def vocab_size(self) -> int:
    return self.log_probs.shape[-1]

  @property
  def order(self) -> int:
    return 1 if self.next_ids is None else 2

  @classmethod
  def dense(cls, log_probs) -> 'TableDraft':
    """A bigram from a dense [V, V] table (row t = log q(. | t)), or a unigram from [V]."""
    log_probs = np.asarray(log_probs, np.float32)
    if log_probs.ndim == 1:
      return cls(jnp.asarray(log_probs))
    vocab_size = log_probs.shape[-1]
    if log_probs.shape != (vocab_size, vocab_size):
      raise ValueError(f'a bigram table must be [V, V], got {log_probs.shape}')
    ids = np.broadcast_to(np.arange(vocab_size, dtype=np.int32), log_probs.shape)
    return cls(jnp.full((vocab_size,), -np.log(vocab_size), jnp.float32), jnp.asarray(ids),
               jnp.asarray(log_probs), jnp.full((vocab_size,), -jnp.inf, jnp.float32))

  @classmethod
  def estimate(cls, stream: np.ndarray, vocab_size: int, order: int, add_k: float = 0.01, *,
               top_k: int = 64, bos_id: int = BOS_ID,
               eos_id: int | None = EOS_ID) -> 'TableDraft':
    """Add-k smoothed n-gram frequencies of a token stream.

    Args:
      stream: [T] ids, sequences separated by `eos_id`
        (`harness.loading.target_token_stream`); a sequence's first token
        follows `bos_id`.
      vocab_size: V.
      order: 1 (unigram) or 2 (bigram).
      add_k: pseudo-count added to every (context, token) pair, > 0.
      top_k: the next tokens a bigram keeps per token (the most frequent;
        the rest back off to the unigram); with top_k >= V the table is the
        exact add-k bigram.
      bos_id: the token a sequence starts after (T5: 0).
      eos_id: the token that ends a sequence (T5: 1), or None: one sequence.

    Raises:
      ValueError: an order other than 1 or 2, add_k <= 0, top_k < 1, or ids
        outside [0, V).
    """
    if order not in (1, 2):
      raise ValueError(f'order must be 1 (unigram) or 2 (bigram), got {order}')
    if not add_k > 0:
      raise ValueError(f'add_k must be > 0, got {add_k}')
    if not (isinstance(top_k, int) and top_k >= 1):
      raise ValueError(f'top_k must be an integer >= 1, got {top_k!r}')
    stream = np.asarray(stream, np.int64)
    if stream.size and (stream.min() < 0 or stream.max() >= vocab_size):
      raise ValueError(f'stream holds ids outside the vocabulary [0, {vocab_size})')
    counts = np.bincount(stream, minlength=vocab_size).astype(np.float64) + add_k
    unigram = counts / counts.sum()
    if order == 1:
      return cls(jnp.asarray(np.log(unigram), jnp.float32))
    prev = np.concatenate([[bos_id], stream[:-1]])
    if eos_id is not None:
      prev[prev == eos_id] = bos_id  # A new sequence starts after each EOS.
    pairs, pair_counts = np.unique(prev * vocab_size + stream, return_counts=True)
    rows, cols = pairs // vocab_size, pairs % vocab_size
    totals = np.bincount(rows, weights=pair_counts, minlength=vocab_size) + vocab_size * add_k
    k = min(top_k, vocab_size)
    if k == vocab_size:  # exact: every pair stored
      table = np.full((vocab_size, vocab_size), add_k)
      table[rows, cols] += pair_counts
      return cls.dense(np.log(table / totals[:, None]))
    # The k most frequent next tokens of each token (ties: lower id).
    order_ = np.lexsort((cols, -pair_counts, rows))
    rows, cols, pair_counts = rows[order_], cols[order_], pair_counts[order_]
    rank = np.arange(len(rows)) - np.searchsorted(rows, rows)
    keep = rank < k
    next_ids = np.full((vocab_size, k), vocab_size, np.int32)
    next_probs = np.zeros((vocab_size, k))
    next_ids[rows[keep], rank[keep]] = cols[keep]
    next_probs[rows[keep], rank[keep]] = (pair_counts[keep] + add_k) / totals[rows[keep]]
    used = next_ids < vocab_size
    kept_unigram = np.sum(np.where(used, unigram[np.minimum(next_ids, vocab_size - 1)], 0), -1)
    rest = np.maximum(1.0 - next_probs.sum(-1), 0.0) / (1.0 - kept_unigram)
    with np.errstate(divide='ignore'):
      return cls(jnp.asarray(np.log(unigram), jnp.float32), jnp.asarray(next_ids),
                 jnp.asarray(np.where(used, np.log(np.maximum(next_probs, 1e-300)), 0.0),
                             jnp.float32),
                 jnp.asarray(np.log(rest), jnp.float32))

  def logits(self, tokens: jax.Array) -> jax.Array:
    """[B, L] int32 input tokens -> [B, L, V] float32 log q of the next token."""
    shape = tokens.shape + self.log_probs.shape
    if self.next_ids is None:
      return jnp.broadcast_to(self.log_probs, shape)
    base = self.log_probs + self.rest_log_scale[tokens][..., None]  # [B, L, V]
    rows = base.reshape(-1, self.vocab_size)
    ids = self.next_ids[tokens].reshape(rows.shape[0], -1)
    values = self.next_log_probs[tokens].reshape(ids.shape)
    put = jax.vmap(lambda row, i, v: row.at[i].set(v, mode='drop'))
    return put(rows, ids, values).reshape(shape)

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """A step function and its fresh cache (spec_decode.models.protocol.Model)."""
    if not batch.decoder_only:

      def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
        return self.logits(tokens), _advance(cache, tokens)

      return step_fn, _index_only_cache(batch.size, capacity)

    sequences, lengths = _sequences(batch)
    cache = cache_lib.prompt_cache(None, sequences, lengths, capacity)

    def prompt_step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      tokens, _ = cache_lib.behind_prompt(tokens, cache)
      return self.logits(tokens), _advance(cache, tokens)

    return prompt_step_fn, cache


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

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """A step function and its fresh cache (inputs unused)."""

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return jnp.zeros(tokens.shape + (self.vocab_size,), jnp.float32), _advance(cache, tokens)

    return step_fn, _index_only_cache(batch.size, capacity)


@flax.struct.dataclass
class PromptLookupDraft:
  """Copying as a draft: the continuation of the longest recent n-gram match.

  The row's sequence so far is what the target has read: for an
  encoder-decoder the decoder tokens 0..t (token 0 is BOS), for a decoder-only
  target its prompt (after its start token, if it reads one) then the
  generated tokens. For n = max_ngram down to min_ngram, its last n tokens
  are looked up in

    the sequence itself: tokens j-n+1..j with j < t (continuation: token j + 1);
    an encoder-decoder's input with BOS in front, [BOS, x_1 .. x_S], so that
      BOS lines up with the start of the input and the first proposal is x_1;

  and the proposal is the token after the match: the longest n wins, then the
  sequence over the input, then the latest position. Id 0 (T5's padding) is
  never proposed, so matches running into the input's padding do not count. q is the
  one-hot of the proposal (logits 0 there, -inf elsewhere): the accept test
  keeps it with probability p(proposal) and the residual is p without it, so
  the output is exactly p's. If nothing matches, q is uniform (logits 0).

  Cost per row and position: O(max_ngram * (S + capacity)) comparisons.

  Attributes:
    vocab_size: V (static).
    max_ngram: longest n-gram looked up (static), >= 1.
    min_ngram: shortest n-gram that counts as a match (static), 1..max_ngram.
  """

  vocab_size: int = flax.struct.field(pytree_node=False)
  max_ngram: int = flax.struct.field(pytree_node=False, default=3)
  min_ngram: int = flax.struct.field(pytree_node=False, default=1)

  def __post_init__(self):
    if not isinstance(self.max_ngram, int) or self.max_ngram < 1:
      raise ValueError(f'max_ngram must be an integer >= 1, got {self.max_ngram!r}')
    if not isinstance(self.min_ngram, int) or not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(f'min_ngram must be an integer in 1..max_ngram={self.max_ngram}, got '
                       f'{self.min_ngram!r}')

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """A step function and its fresh cache (spec_decode.models.protocol.Model).

    `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`:
    the one-hot of each position's proposal, uniform where nothing matched.
    The cache as `start_proposals` makes it.
    """
    propose_fn, cache = self.start_proposals(batch, capacity)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      proposal, found, cache = propose_fn(tokens, cache)
      return jnp.where(found[..., None], one_hot_logits(proposal, self.vocab_size), 0.0), cache

    return step_fn, cache

  def start_proposals(self, batch: protocol.Batch, capacity: int):
    """The proposals alone: `propose_fn(tokens [B, K], cache) -> (proposal, found, cache)`.

    Args:
      batch: the target's inputs.
      capacity: static loop positions the history holds.

    Returns:
      `propose_fn` (proposal [B, K] int32 the token after each position's
      match, found [B, K] bool whether an n-gram of min_ngram..max_ngram
      tokens matched, and the cache advanced by K) and the fresh cache, whose
      layers are {'history': [B, L + capacity] int32 the sequence at its
      positions, 'source': [B, S + 1] int32 BOS + encoder input (an
      encoder-decoder's; [B, 0] otherwise), 'offset': [B] int32 the position
      of loop position 0}: every per-row array in the cache, which beam
      search reorders.
    """
    if batch.decoder_only:
      sequences, lengths = _sequences(batch)
      history = jnp.pad(sequences, ((0, 0), (0, capacity)))
      source = jnp.zeros((batch.size, 0), jnp.int32)
      offset = lengths - 1
    else:
      history = jnp.zeros((batch.size, capacity), jnp.int32)
      source = jnp.pad(jnp.asarray(batch.tokens, jnp.int32), ((0, 0), (1, 0)),
                       constant_values=BOS_ID)
      offset = jnp.zeros((batch.size,), jnp.int32)
    layers = dict(history=history, source=source, offset=offset)
    behind_prompt = batch.decoder_only
    cache = cache_lib.Cache(index=jnp.zeros((batch.size,), jnp.int32), layers=layers,
                            capacity=capacity)

    def propose_fn(tokens: jax.Array, cache: cache_lib.Cache):
      layers = dict(cache.layers)
      loop_positions = cache.index[:, None] + jnp.arange(tokens.shape[1])  # [B, K]
      positions = layers['offset'][:, None] + loop_positions
      if behind_prompt:  # loop position 0 stands for the prompt's last token, written already
        last = jnp.take_along_axis(layers['history'], layers['offset'][:, None], axis=1)
        tokens = jnp.where(loop_positions == 0, last, tokens)
      layers['history'] = cache_lib.write(layers['history'], tokens, positions[:, 0])
      proposal, found = self._propose(layers['history'], layers['source'], positions)
      return proposal, found, _advance(cache.replace(layers=layers), tokens)

    return propose_fn, cache

  def _propose(self, history: jax.Array, source: jax.Array,
               positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The proposed next token at each query position.

    Args:
      history: [B, C] the sequence; entries past a query position are
        ignored (they are its future, or stale).
      source: [B, S + 1] BOS + encoder input, or [B, 0].
      positions: [B, K] query positions t in `history`.

    Returns:
      proposal: [B, K] int32 the token after the chosen match.
      found: [B, K] bool, some n-gram matched.
    """
    grams = jnp.arange(self.max_ngram)  # i: offset back from the window's end

    def windows(seq):
      """[B, L] -> [B, N, L]: entry (i, j) = seq[j - i], -1 before the start."""
      ends = jnp.arange(seq.shape[1])[None, :] - grams[:, None]  # [N, L]
      return jnp.where(ends >= 0, seq[:, jnp.maximum(ends, 0)], -1)

    # The last N tokens of every query, newest first: [B, K, N]; -2 before the
    # sequence's start (never equal to a window's -1).
    back = positions[..., None] - grams
    last = jnp.where(back >= 0,
                     jnp.take_along_axis(history, jnp.maximum(back, 0).reshape(
                         back.shape[0], -1), axis=1).reshape(back.shape), -2)

    # Candidate windows over the input's positions, then the sequence's (later
    # wins ties): cand[b, i, j] is the token i places before position j.
    shift = lambda seq: jnp.concatenate([seq[:, 1:], jnp.full_like(seq[:, :1], PAD_ID)], axis=-1)
    cand = jnp.concatenate([windows(source), windows(history)], axis=-1)  # [B, N, L]
    follow = jnp.concatenate([shift(source), shift(history)], axis=-1)  # [B, L]
    # [B, K, N, L]: the last i+1 tokens agree with the window ending at j.
    match = jnp.cumprod(cand[:, None] == last[..., None], axis=2).astype(bool)
    before = jnp.arange(history.shape[1]) < positions[..., None]  # [B, K, C]: ends before t
    known = jnp.concatenate([jnp.ones(positions.shape + source.shape[1:], bool), before],
                            axis=-1)  # [B, K, L]
    match &= (known & (follow != PAD_ID)[:, None, :])[:, :, None, :]

    # Per n, the latest matching window; then the longest n with a match.
    any_n = jnp.any(match, axis=-1) & (grams >= self.min_ngram - 1)  # [B, K, N]
    latest = match.shape[-1] - 1 - jnp.argmax(match[..., ::-1], axis=-1)  # [B, K, N]
    n = self.max_ngram - 1 - jnp.argmax(any_n[..., ::-1], axis=-1)  # [B, K]: n - 1
    end = jnp.take_along_axis(latest, n[..., None], axis=-1)[..., 0]  # [B, K]
    proposal = jnp.take_along_axis(follow, end.reshape(end.shape[0], -1), axis=1).reshape(
        end.shape)
    return proposal.astype(jnp.int32), jnp.any(any_n, axis=-1)
