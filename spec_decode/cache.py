"""Explicit key/value buffers with one write index per row.

The decoding loops never look inside a model. They see a `Cache`: a pytree whose
`index[b]` is the next position row `b` will write, plus whatever buffers the
model keeps in `layers`. A step function that consumes `K` tokens writes them at
`index .. index + K - 1` (per row) and returns the cache with `index + K`.
Rewinding after a rejected draft is `rewind(cache, new_index)`: entries at or
past the new index become stale. They are never read, because attention masks
keys by absolute position (key position <= query position), and every stale
position a later query could see is overwritten by the chunk that query is in.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Cache:
  """Decoder state of one model for a batch of rows.

  Attributes:
    index: [B] int32, the next write position of each row.
    layers: model-specific pytree; self-attention buffers hold `capacity`
      positions per row (T5: [B, H, capacity, Dh]).
    capacity: static number of positions each buffer holds.
  """

  index: jax.Array
  layers: Any
  capacity: int = flax.struct.field(pytree_node=False)

  @property
  def batch_size(self) -> int:
    return self.index.shape[0]


def write(buffer: jax.Array, values: jax.Array, index: jax.Array, axis: int = 0) -> jax.Array:
  """Writes `K` consecutive entries per row, each row at its own position.

  Args:
    buffer: [B, ...] the buffer to update, positions [T] on axis `axis` of a
      row (e.g. [B, T] tokens: 0; [B, H, T, Dh] keys: 1).
    values: [B, ...] the entries, as `buffer` but K positions on that axis.
    index: [B] int32 first position to write in each row; index + K <= T.

  Returns:
    The buffer with row b's positions index[b] .. index[b] + K - 1 set to
    values[b].
  """
  values = values.astype(buffer.dtype)
  if values.shape[axis + 1] == 1:
    # One position: a select over the buffer, which XLA fuses and updates in
    # place. XLA:CPU turns a one-position dynamic-update-slice of a loop-carried
    # buffer into a fusion that copies the whole buffer, several times a step.
    positions = jax.lax.broadcasted_iota(jnp.int32, buffer.shape, axis + 1)
    return jnp.where(positions == index.reshape((-1,) + (1,) * (buffer.ndim - 1)), values, buffer)

  def write_row(row, vals, start):
    starts = tuple(start if i == axis else 0 for i in range(row.ndim))
    return jax.lax.dynamic_update_slice(row, vals, starts)

  return jax.vmap(write_row)(buffer, values, index)


def rewind(cache: Cache, index: jax.Array) -> Cache:
  """Sets every row's write position; entries from `index[b]` on become stale.

  Args:
    cache: the cache to rewind.
    index: [B] int32 new write positions.
  """
  return cache.replace(index=jnp.asarray(index, jnp.int32))


@flax.struct.dataclass
class PromptState:
  """`Cache.layers` of a decoder-only model whose loop starts behind a prompt.

  The loops start every row at loop position 0 with the decoder start token
  (id 0) in a fresh cache. A decoder-only model instead prefills row b's
  prompt, all but its last token, at physical positions 0 .. offset[b] - 1,
  and maps loop position i to physical position offset[b] + i, feeding the
  row's last prompt token in place of the loop's token at loop position 0
  (`behind_prompt`). Loop position 0's logits are then those after the whole
  prompt, and `Cache.index` stays the loop position the loops advance and
  rewind.

  Attributes:
    buffers: the model's key/value buffers at physical positions.
    offset: [B] int32 physical position of loop position 0 (prompt length - 1).
    last_token: [B] int32 each row's last prompt token.
  """

  buffers: Any
  offset: jax.Array
  last_token: jax.Array


def prompt_cache(buffers: Any, sequences: jax.Array, lengths: jax.Array,
                 capacity: int) -> Cache:
  """The Cache at loop index 0 behind each row's sequence (a PromptState).

  Args:
    buffers: the model's buffers, holding each row's sequence but its last token.
    sequences: [B, L] int32, what the model reads before the loop (a BOS the
      model adds, then the prompt).
    lengths: [B] int32 in 1..L, each row's sequence length.
    capacity: static loop positions (Cache.capacity).
  """
  offset = lengths.astype(jnp.int32) - 1
  last_token = jnp.take_along_axis(sequences, offset[:, None], axis=1)[:, 0].astype(jnp.int32)
  return Cache(index=jnp.zeros(offset.shape, jnp.int32),
               layers=PromptState(buffers, offset, last_token), capacity=capacity)


def behind_prompt(tokens: jax.Array, cache: Cache) -> tuple[jax.Array, jax.Array]:
  """The tokens a decoder-only model reads, and their physical start positions.

  Args:
    tokens: [B, K] int32 at loop positions cache.index[b] + 0..K-1.
    cache: a Cache whose layers are a PromptState.

  Returns:
    tokens with each row's last prompt token at loop position 0, and [B]
    int32 physical positions of tokens[:, 0].
  """
  state = cache.layers
  loop_positions = cache.index[:, None] + jnp.arange(tokens.shape[1])  # [B, K]
  tokens = jnp.where(loop_positions == 0, state.last_token[:, None], tokens)
  return tokens, state.offset + cache.index
