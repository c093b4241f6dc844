"""The building blocks of T5 1.1: embedding, RMS norm, attention, gated-GELU MLP, position bias.

Parameter names, shapes and initialisers follow T5X's minimal T5
(t5x/examples/t5/layers.py), so that T5X checkpoints load without renaming:
kernels are 2-D, attention projections are (E, H * Dh) and (H * Dh, E), and
the attention's 1/sqrt(Dh) is folded into the query initialiser instead of the
forward pass. Parameters are stored in `param_dtype`, computations run in
`dtype`; attention scores and their softmax are float32.

Shapes: B batch, L query length, T key length, E width, H heads, Dh head width.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels

# Added to the attention scores of masked keys (T5X's value).
NEG_INF = -1e10

attention_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
dense_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
relpos_init = nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform')


def mask_bias(mask: jax.Array) -> jax.Array:
  """Boolean attention mask -> additive float32 bias (0 kept, NEG_INF masked)."""
  return jnp.where(mask, 0.0, NEG_INF).astype(jnp.float32)


class Embed(nn.Embed):
  """nn.Embed (the same parameter) whose rows are looked up first, then cast.

  On a CPU with the kernels, computing in float32, one kernel call copies (a
  float32 table) or widens (bfloat16) the rows (`kernels.embed`): XLA:CPU
  split the gather of a step's few rows across its threads (slices of the
  table instead took a five-token step of the demo target from 0.749 to 0.659
  ms, EPYC, interleaved), and widened a bfloat16 table whole on every call.
  Elsewhere jnp.take's gather, the rows cast after it (nn.Embed casts the
  whole table). Either gives nn.Embed's values: an id outside -V..V-1 a row
  of NaNs, a negative one counting from the end, as jnp.take's default does.
  """

  def __call__(self, inputs: jax.Array) -> jax.Array:
    """[...] integer ids -> [..., E] in `dtype`."""
    if self.num_embeddings == 1 or not jnp.issubdtype(inputs.dtype, jnp.integer):
      return super().__call__(inputs)
    if (self.dtype is not None and jnp.dtype(self.dtype) == jnp.float32
        and kernels.embed_applies(self.embedding, inputs)):
      return kernels.embed(self.embedding,
                           jnp.where(inputs < 0, inputs + self.num_embeddings, inputs))
    (rows,) = self.promote_dtype(jnp.take(self.embedding, inputs, axis=0), dtype=self.dtype,
                                 inexact=False)
    return rows


class RMSNorm(nn.Module):
  """T5's layer norm: scale by the root mean square, no mean, no bias.

  Attributes:
    dtype: output dtype; the statistics are float32.
    param_dtype: dtype of `scale` [E].
    epsilon: added to the mean square.
  """

  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., E] -> [..., E]."""
    x = x.astype(jnp.float32)
    mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = (x * jax.lax.rsqrt(mean_square + self.epsilon)).astype(self.dtype)
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    return y * scale.astype(self.dtype)


class Dense(nn.Module):
  """nn.Dense without a bias, whose product takes the CPU kernels where they apply.

  The parameter is nn.Dense's ('kernel', [in, features]). When the variables
  hold a packed copy of it in the `kernels.PANELS` collection (from
  `models.T5Model.with_panels`), a product of 1..256 rows reads that copy
  (`kernels.dense_panels`, bitwise the same result); otherwise
  `kernels.dot_general` decides between the kernel and XLA's product.

  Attributes:
    features: the output width.
    kernel_init: the kernel's initialiser.
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  features: int
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., in] -> [..., features] in `dtype`."""
    kernel = self.param('kernel', self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    if self.has_variable(kernels.PANELS, 'kernel'):
      panels = self.get_variable(kernels.PANELS, 'kernel')
      if kernels.panels_apply(x, panels, kernel):
        return kernels.dense_panels(x, panels, kernel)
    return kernels.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


# Dense children a module multiplies one input by, packed side by side under a name
# (`models.T5Model.with_panels`, `kernels.pack_tree`'s `fused`): one product each.
FUSED = {'qkv': ('query', 'key', 'value'), 'kv': ('key', 'value'), 'wi': ('wi_0', 'wi_1')}


def fused_product(module: nn.Module, x: jax.Array, name: str) -> list[jax.Array] | None:
  """x times the kernels of `module`'s Dense children FUSED[name], in one product.

  Where the module's variables hold those kernels packed side by side in the
  `kernels.PANELS` collection under `name`, and the kernel applies: one call
  instead of one per part, bitwise the same outputs. Elsewhere None (the
  caller multiplies part by part).

  Args:
    module: a bound module with the Dense children FUSED[name].
    x: [..., in].
    name: a key of FUSED.

  Returns:
    One [..., features] array per part, or None.
  """
  parts = FUSED[name]
  if not module.has_variable(kernels.PANELS, name):
    return None
  params = module.variables['params']
  w = jnp.concatenate([params[part]['kernel'] for part in parts], axis=1)
  x, w = nn.dtypes.promote_dtype(x, w, dtype=module.dtype)
  panels = module.get_variable(kernels.PANELS, name)
  if not kernels.panels_apply(x, panels, w):
    return None
  y = kernels.dense_panels(x, panels, w)
  ends = np.cumsum([params[part]['kernel'].shape[1] for part in parts])[:-1]
  return jnp.split(y, ends, axis=-1)


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention without 1/sqrt(Dh) in the forward pass.

  Keys and values are projected by `project_kv`, separately from the attention
  itself, so that a decoder can cache them (its own, or the encoder's once).

  Attributes:
    num_heads: H.
    head_dim: Dh.
    emb_dim: E, the output width.
    dropout_rate: dropout on the attention weights (one mask for all queries).
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  num_heads: int
  head_dim: int
  emb_dim: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  def setup(self):
    project = lambda features, init: Dense(
        features, kernel_init=init, dtype=self.dtype, param_dtype=self.param_dtype)
    inner = self.num_heads * self.head_dim
    depth_scaling = math.sqrt(self.head_dim)
    self.query = project(inner, lambda *args: attention_init(*args) / depth_scaling)
    self.key = project(inner, attention_init)
    self.value = project(inner, attention_init)
    self.out = project(self.emb_dim, attention_init)
    self.dropout = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))

  def _heads(self, x: jax.Array) -> jax.Array:
    """[B, L, H * Dh] -> [B, H, L, Dh]."""
    return jnp.swapaxes(x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim)), 1, 2)

  def project_kv(self, inputs_kv: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, T, E] -> keys and values, each [B, H, T, Dh] in `dtype`.

    Heads before positions: both attention products then contract the
    buffers in the layout they are stored in, so a cached decoding step never
    copies them into another one. One product where the panels hold both
    kernels packed together ('kv').
    """
    fused = fused_product(self, inputs_kv, 'kv')
    key, value = fused or (self.key(inputs_kv), self.value(inputs_kv))
    return self._heads(key), self._heads(value)

  def project_qkv(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Self-attention's projections: [B, L, E] -> query [B, L, H * Dh], keys and values.

    One product where the panels hold the three kernels packed together
    ('qkv'), else three; keys and values as `project_kv`.
    """
    fused = fused_product(self, x, 'qkv')
    if fused is None:
      return self.query(x), *self.project_kv(x)
    query, key, value = fused
    return query, self._heads(key), self._heads(value)

  def __call__(self, inputs_q: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array,
               deterministic: bool = True) -> jax.Array:
    """Attends from `inputs_q` over given keys and values.

    Args:
      inputs_q: [B, L, E] query inputs.
      key: [B, H, T, Dh] keys.
      value: [B, H, T, Dh] values.
      bias: float32, broadcastable to [B, H, L, T]: masks and position biases.
      deterministic: disables dropout.

    Returns:
      [B, L, E].
    """
    return self.attend(self.query(inputs_q), key, value, bias, deterministic)

  def attend(self, query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array,
             deterministic: bool = True) -> jax.Array:
    """`__call__` from the projected query [B, L, H * Dh] (`project_qkv`'s)."""
    query = query.reshape(query.shape[:-1] + (self.num_heads, self.head_dim))  # [B, L, H, Dh]
    if deterministic or self.dropout_rate == 0:
      bias4 = jnp.reshape(bias, (1,) * (4 - bias.ndim) + bias.shape)
      if kernels.attention_applies(query, key, value, bias4):
        x = kernels.attention(query, key, value, bias4)  # [B, L, H, Dh]
        return self.out(x.reshape(x.shape[:-2] + (-1,)))
    query = jnp.swapaxes(query, 1, 2)  # [B, H, L, Dh]
    scores = jnp.einsum('bhld,bhtd->bhlt', query, key, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(scores + bias, axis=-1)  # [B, H, L, T] float32
    weights = self.dropout(weights, deterministic=deterministic)
    # Heads stay the batch dimension of the product and move after it: XLA:CPU
    # computes 'bhlt,bhtd->blhd' for L > 1 as a transposed batched matmul that
    # cost a 5-position call of the demo target ~0.2 ms more (EPYC).
    x = jnp.swapaxes(jnp.einsum('bhlt,bhtd->bhld', weights.astype(self.dtype), value), 1, 2)
    return self.out(x.reshape(x.shape[:-2] + (-1,)))  # [B, L, H * Dh] -> [B, L, E]


class MlpBlock(nn.Module):
  """Gated-GELU feed-forward: wo(gelu(wi_0 x) * wi_1 x).

  Attributes:
    mlp_dim: intermediate width.
    dropout_rate: dropout on the intermediate activations.
    dtype: compute dtype.
    param_dtype: parameter dtype.
  """

  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    """[B, L, E] -> [B, L, E]."""
    dense = lambda features, name: Dense(
        features, kernel_init=dense_init, dtype=self.dtype, param_dtype=self.param_dtype,
        name=name)
    # One product where the panels hold wi_0 and wi_1 packed together ('wi').
    wi_0, wi_1 = fused_product(self, x, 'wi') or (
        dense(self.mlp_dim, 'wi_0')(x), dense(self.mlp_dim, 'wi_1')(x))
    # nn.gelu is the tanh approximation, as in T5X (and HF's gelu_new).
    h = nn.gelu(wi_0) * wi_1
    h = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(h, deterministic=deterministic)
    return dense(x.shape[-1], 'wo')(h)


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> jax.Array:
  """Buckets `key_position - query_position` as Mesh TensorFlow / T5X do.

  Half of the buckets (per direction) hold exact distances, the other half
  logarithmically wider ranges up to `max_distance`; farther distances share
  the last bucket. Unidirectional (causal) attention maps all future keys to
  bucket 0 (they are masked anyway).

  Args:
    relative_position: int32 array, key position minus query position.
    bidirectional: whether keys after the query get their own buckets.
    num_buckets: number of buckets.
    max_distance: distance from which all positions share a bucket.

  Returns:
    int32 array of the same shape, values in [0, num_buckets).
  """
  n = -relative_position  # query - key: > 0 for keys in the past
  if bidirectional:
    num_buckets //= 2
    offset = (n < 0).astype(jnp.int32) * num_buckets
    n = jnp.abs(n)
  else:
    offset = 0
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  # The epsilon keeps exact powers (e.g. n = 2 * max_exact) from rounding down.
  log_ratio = jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
  large = max_exact + (log_ratio / math.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return offset + jnp.where(n < max_exact, n, large)


class RelativePositionBias(nn.Module):
  """Learned per-head attention biases indexed by relative-position bucket.

  Attributes:
    num_heads: H.
    num_buckets: rows of the table (32 in T5).
    max_distance: see `relative_position_bucket` (128 in T5).
    bidirectional: True in the encoder, False (causal) in the decoder.
    param_dtype: dtype of the table `rel_embedding` [H, num_buckets].
  """

  num_heads: int
  num_buckets: int
  max_distance: int
  bidirectional: bool
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """Biases for absolute query and key positions.

    Args:
      query_positions: [B, L] int32 (B may be 1).
      key_positions: [T] int32.

    Returns:
      [B, H, L, T] float32.
    """
    table = self.param('rel_embedding', relpos_init, (self.num_heads, self.num_buckets),
                       self.param_dtype)
    buckets = relative_position_bucket(
        key_positions[None, None, :] - query_positions[:, :, None], self.bidirectional,
        self.num_buckets, self.max_distance)  # [B, L, T]
    bias = jnp.take(table.astype(jnp.float32), buckets, axis=1)  # [H, B, L, T]
    return jnp.moveaxis(bias, 0, 1)
