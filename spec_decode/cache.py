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
    layers: model-specific pytree; self-attention buffers are [B, capacity, ...].
    capacity: static number of positions each buffer holds.
  """

  index: jax.Array
  layers: Any
  capacity: int = flax.struct.field(pytree_node=False)

  @property
  def batch_size(self) -> int:
    return self.index.shape[0]


def write(buffer: jax.Array, values: jax.Array, index: jax.Array) -> jax.Array:
  """Writes `K` consecutive entries per row, each row at its own position.

  Args:
    buffer: [B, T, ...] the buffer to update.
    values: [B, K, ...] the entries, same trailing shape as `buffer`.
    index: [B] int32 first position to write in each row; index + K <= T.

  Returns:
    [B, T, ...] the buffer with `buffer[b, index[b]:index[b] + K] = values[b]`.
  """

  def write_row(row, vals, start):
    starts = (start,) + (0,) * (row.ndim - 1)
    return jax.lax.dynamic_update_slice(row, vals.astype(row.dtype), starts)

  return jax.vmap(write_row)(buffer, values, index)


def rewind(cache: Cache, index: jax.Array) -> Cache:
  """Sets every row's write position; entries from `index[b]` on become stale.

  Args:
    cache: the cache to rewind.
    index: [B] int32 new write positions.
  """
  return cache.replace(index=jnp.asarray(index, jnp.int32))
