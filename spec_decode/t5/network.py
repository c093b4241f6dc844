"""The T5 1.1 encoder-decoder with multi-token cached decoding.

The parameter tree is T5X's minimal T5 (t5x/examples/t5/network.py):

  token_embedder/embedding                                     [V, E]
  encoder/relpos_bias/rel_embedding                            [H, 32]
  encoder/layers_{i}/pre_attention_layer_norm/scale            [E]
  encoder/layers_{i}/attention/{query,key,value}/kernel        [E, H * Dh]
  encoder/layers_{i}/attention/out/kernel                      [H * Dh, E]
  encoder/layers_{i}/pre_mlp_layer_norm/scale                  [E]
  encoder/layers_{i}/mlp/{wi_0,wi_1}/kernel, mlp/wo/kernel     [E, F], [F, E]
  encoder/encoder_norm/scale                                   [E]
  decoder/relpos_bias/rel_embedding                            [H, 32]
  decoder/layers_{i}/pre_{self,cross}_attention_layer_norm, pre_mlp_layer_norm
  decoder/layers_{i}/{self_attention,encoder_decoder_attention}/{query,key,value,out}
  decoder/layers_{i}/mlp/{wi_0,wi_1,wo}
  decoder/decoder_norm/scale                                   [E]
  decoder/logits_dense/kernel                                  [E, V]

Decoding uses an explicit `spec_decode.cache.Cache` whose `layers` is a
`DecoderCache`: per layer, self-attention key/value buffers [B, H, capacity, Dh]
and the cross-attention keys/values of the encoder output, computed once.
`Transformer.decode` feeds K tokens per row at that row's own `cache.index`;
queries are at absolute positions index[b] + 0..K-1 and attend to every buffer
position at or before their own, which is both the causal mask inside the chunk
and the mask of stale entries past a rewound index.
"""

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode.t5.config import T5Config
from spec_decode.t5 import layers


@flax.struct.dataclass
class KeyValue:
  """Keys and values of one attention layer.

  Attributes:
    key: [B, H, T, Dh].
    value: [B, H, T, Dh].
  """

  key: jax.Array
  value: jax.Array


@flax.struct.dataclass
class DecoderCache:
  """T5's `Cache.layers`.

  Attributes:
    self_attention: one KeyValue per decoder layer, [B, H, capacity, Dh].
    cross_attention: one KeyValue per decoder layer, [B, H, S, Dh], the
      projected encoder output.
    encoder_mask: [B, S] bool, False at encoder padding (token id 0).
  """

  self_attention: tuple[KeyValue, ...]
  cross_attention: tuple[KeyValue, ...]
  encoder_mask: jax.Array


def attention(cfg: T5Config) -> layers.MultiHeadAttention:
  return layers.MultiHeadAttention(
      num_heads=cfg.num_heads, head_dim=cfg.head_dim, emb_dim=cfg.emb_dim,
      dropout_rate=cfg.dropout_rate, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)


def norm(cfg: T5Config) -> layers.RMSNorm:
  return layers.RMSNorm(dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)


def mlp(cfg: T5Config) -> layers.MlpBlock:
  return layers.MlpBlock(mlp_dim=cfg.mlp_dim, dropout_rate=cfg.dropout_rate,
                         dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)


def relpos_bias(cfg: T5Config, bidirectional: bool) -> layers.RelativePositionBias:
  return layers.RelativePositionBias(
      num_heads=cfg.num_heads, num_buckets=cfg.num_buckets, max_distance=cfg.max_distance,
      bidirectional=bidirectional, param_dtype=cfg.weight_dtype)


def dropout(cfg: T5Config) -> nn.Dropout:
  return nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))  # one mask for all positions


class EncoderLayer(nn.Module):
  """Pre-norm self-attention and MLP blocks with residuals."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_attention_layer_norm = norm(cfg)
    self.attention = attention(cfg)
    self.pre_mlp_layer_norm = norm(cfg)
    self.mlp = mlp(cfg)
    self.dropout = dropout(cfg)

  def __call__(self, inputs: jax.Array, bias: jax.Array, deterministic: bool) -> jax.Array:
    """[B, S, E], bias [B, H, S, S] -> [B, S, E]."""
    x = self.pre_attention_layer_norm(inputs)
    x = self.attention.attend(*self.attention.project_qkv(x), bias, deterministic)
    x = inputs + self.dropout(x, deterministic=deterministic)
    y = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return x + self.dropout(y, deterministic=deterministic)


class Encoder(nn.Module):
  """Embedded inputs -> encoded sequence, bidirectional attention."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.relpos_bias = relpos_bias(cfg, bidirectional=True)
    self.layers = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
    self.encoder_norm = norm(cfg)
    self.dropout = dropout(cfg)

  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
    """Encodes embedded tokens.

    Args:
      x: [B, S, E] embedded encoder tokens.
      mask: [B, S] bool, False at padding.
      deterministic: disables dropout.

    Returns:
      [B, S, E] in the compute dtype.
    """
    positions = jnp.arange(x.shape[1])
    # [1, H, S, S] + [B, 1, 1, S] -> [B, H, S, S]; the same for every layer.
    bias = self.relpos_bias(positions[None], positions) + layers.mask_bias(mask)[:, None, None]
    x = self.dropout(x, deterministic=deterministic)
    for layer in self.layers:
      x = layer(x, bias, deterministic)
    return self.dropout(self.encoder_norm(x), deterministic=deterministic)


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and MLP blocks.

  Attributes:
    config: the sizes.
    cross_attention: False leaves the cross-attention block out (T5X's
      decoder-only layer, spec_decode.t5.decoder_only).
  """

  config: T5Config
  cross_attention: bool = True

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = norm(cfg)
    self.self_attention = attention(cfg)
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = norm(cfg)
      self.encoder_decoder_attention = attention(cfg)
    self.pre_mlp_layer_norm = norm(cfg)
    self.mlp = mlp(cfg)
    self.dropout = dropout(cfg)

  def cross_kv(self, encoded: jax.Array) -> KeyValue:
    """[B, S, E] encoder output -> its cross-attention keys and values [B, H, S, Dh]."""
    return KeyValue(*self.encoder_decoder_attention.project_kv(encoded))

  def __call__(self, inputs: jax.Array, self_bias: jax.Array, cross: KeyValue | None,
               cross_bias: jax.Array | None, buffers: KeyValue | None, index: jax.Array | None,
               deterministic: bool) -> tuple[jax.Array, KeyValue]:
    """One decoder block.

    Args:
      inputs: [B, K, E].
      self_bias: [B, H, K, T] causal mask plus relative position bias.
      cross: the encoder's keys and values, [B, H, S, Dh]; None without
        cross-attention.
      cross_bias: [B, 1, 1, S] encoder padding mask; None without.
      buffers: self-attention buffers [B, H, T, Dh] (cached decoding), or None
        to attend over the K inputs themselves (T = K, full sequence).
      index: [B] int32 position of inputs[:, 0] in `buffers` (with buffers).
      deterministic: disables dropout.

    Returns:
      [B, K, E] outputs and the self-attention keys/values: the updated
      buffers, or those of the K inputs when `buffers` is None.
    """
    x = self.pre_self_attention_layer_norm(inputs)
    query, key, value = self.self_attention.project_qkv(x)  # [B, K, H * Dh], [B, H, K, Dh]
    if buffers is not None:
      key = cache_lib.write(buffers.key, key, index, axis=1)  # [B, H, T, Dh]
      value = cache_lib.write(buffers.value, value, index, axis=1)
    x = self.self_attention.attend(query, key, value, self_bias, deterministic)
    x = inputs + self.dropout(x, deterministic=deterministic)

    y = x
    if self.cross_attention:
      y = self.pre_cross_attention_layer_norm(x)
      y = self.encoder_decoder_attention(y, cross.key, cross.value, cross_bias, deterministic)
      y = x + self.dropout(y, deterministic=deterministic)

    z = self.mlp(self.pre_mlp_layer_norm(y), deterministic)
    return y + self.dropout(z, deterministic=deterministic), KeyValue(key, value)


def causal_bias(relpos_bias: layers.RelativePositionBias, length: int,
                buffers: tuple[KeyValue, ...] | None, index: jax.Array | None) -> jax.Array:
  """Self-attention bias of K queries: relative position bias plus the causal mask.

  Args:
    relpos_bias: the unidirectional relative position bias.
    length: K, the queries.
    buffers: per layer, [B, H, T, Dh] buffers (cached decoding: keys at
      positions 0..T-1), or None (a whole sequence, keys = queries at 0..K-1).
    index: [B] int32 absolute position of the first query (with buffers).

  Returns:
    [B, H, K, T] float32 ([1, H, K, K] without buffers). A key counts only at
    or before its query's position, which also masks stale cache entries.
  """
  steps = jnp.arange(length)
  if buffers is None:
    query_positions, key_positions = steps[None], steps  # [1, K], [K]
  else:
    query_positions = index[:, None] + steps  # [B, K]
    key_positions = jnp.arange(buffers[0].key.shape[2])  # [T]
  causal = key_positions[None, None, :] <= query_positions[:, :, None]  # [B, K, T]
  return relpos_bias(query_positions, key_positions) + layers.mask_bias(causal)[:, None]


class Decoder(nn.Module):
  """Embedded decoder tokens + encoder keys/values -> float32 logits."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.relpos_bias = relpos_bias(cfg, bidirectional=False)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = norm(cfg)
    # Untied output layer; T5 1.1 does not rescale its input.
    self.logits_dense = layers.Dense(
        cfg.vocab_size, kernel_init=layers.dense_init, dtype=jnp.float32,
        param_dtype=cfg.weight_dtype)
    self.dropout = dropout(cfg)

  def cross_kv(self, encoded: jax.Array) -> tuple[KeyValue, ...]:
    """[B, S, E] -> one KeyValue [B, H, S, Dh] per layer."""
    return tuple(layer.cross_kv(encoded) for layer in self.layers)

  def __call__(self, y: jax.Array, cross: tuple[KeyValue, ...], encoder_mask: jax.Array,
               buffers: tuple[KeyValue, ...] | None = None, index: jax.Array | None = None,
               deterministic: bool = True) -> tuple[jax.Array, tuple[KeyValue, ...] | None]:
    """[B, K, V] float32 logits of K embedded tokens per row; see `features`."""
    y, buffers = self.features(y, cross, encoder_mask, buffers, index, deterministic)
    return self.logits(y), buffers

  def logits(self, y: jax.Array) -> jax.Array:
    """The output layer: [B, K, E] features -> [B, K, V] float32 logits."""
    return self.logits_dense(y)

  def features(self, y: jax.Array, cross: tuple[KeyValue, ...], encoder_mask: jax.Array,
               buffers: tuple[KeyValue, ...] | None = None, index: jax.Array | None = None,
               deterministic: bool = True) -> tuple[jax.Array, tuple[KeyValue, ...] | None]:
    """Decodes K embedded tokens per row, up to the output layer.

    Args:
      y: [B, K, E] embedded decoder tokens.
      cross: per layer, the encoder's keys and values.
      encoder_mask: [B, S] bool, False at encoder padding.
      buffers: per layer, self-attention buffers [B, H, T, Dh] to write the K
        new entries into at `index` and attend over; None for a full sequence
        (positions 0..K-1, no cache).
      index: [B] int32 absolute position of y[:, 0] (with buffers).
      deterministic: disables dropout.

    Returns:
      [B, K, E] final features (normed), and the updated buffers (None
      without).
    """
    self_bias = causal_bias(self.relpos_bias, y.shape[1], buffers, index)  # [B, H, K, T]
    cross_bias = layers.mask_bias(encoder_mask)[:, None, None]  # [B, 1, 1, S]

    y = self.dropout(y, deterministic=deterministic)
    new_buffers = []
    for i, layer in enumerate(self.layers):
      y, kv = layer(y, self_bias, cross[i], cross_bias, None if buffers is None else buffers[i],
                    index, deterministic)
      new_buffers.append(kv)
    y = self.dropout(self.decoder_norm(y), deterministic=deterministic)
    return y, None if buffers is None else tuple(new_buffers)


class Transformer(nn.Module):
  """T5 1.1: the training path (`__call__`) and the cached decoding path.

  Decoding: `encode` once per input, `init_cache` once per input, then
  `decode` for each chunk of K tokens, e.g.

    encoded = model.apply(v, inputs, method='encode')
    cache = model.apply(v, encoded, inputs, capacity, method='init_cache')
    logits, cache = model.apply(v, tokens, cache, method='decode')
  """

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(
        cfg.vocab_size, cfg.emb_dim, embedding_init=nn.initializers.normal(stddev=1.0),
        dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)
    self.encoder = Encoder(cfg)
    self.decoder = Decoder(cfg)

  def encode(self, encoder_input_tokens: jax.Array, enable_dropout: bool = False) -> jax.Array:
    """[B, S] int32 tokens (0 = padding) -> [B, S, E] encoded."""
    return self.encoder(self.token_embedder(encoder_input_tokens), encoder_input_tokens > 0,
                        deterministic=not enable_dropout)

  def init_cache(self, encoded: jax.Array, encoder_input_tokens: jax.Array,
                 capacity: int) -> cache_lib.Cache:
    """A fresh decoder cache for one batch of encoded inputs.

    Args:
      encoded: [B, S, E] from `encode`.
      encoder_input_tokens: [B, S] the encoded tokens (for the padding mask).
      capacity: static number of decoder positions the buffers hold.

    Returns:
      Cache with index zeros [B], zero self-attention buffers and the
      cross-attention keys/values of `encoded`.
    """
    cfg = self.config
    batch = encoded.shape[0]
    shape = (batch, cfg.num_heads, capacity, cfg.head_dim)
    zeros = lambda: jnp.zeros(shape, cfg.compute_dtype)
    state = DecoderCache(
        self_attention=tuple(KeyValue(zeros(), zeros()) for _ in range(cfg.num_decoder_layers)),
        cross_attention=self.decoder.cross_kv(encoded),
        encoder_mask=encoder_input_tokens > 0)
    return cache_lib.Cache(index=jnp.zeros((batch,), jnp.int32), layers=state,
                           capacity=capacity)

  def decode(self, decoder_input_tokens: jax.Array,
             cache: cache_lib.Cache) -> tuple[jax.Array, cache_lib.Cache]:
    """The step function: K tokens per row at each row's cache index.

    Args:
      decoder_input_tokens: [B, K] int32; row b's tokens sit at positions
        cache.index[b] .. cache.index[b] + K - 1.
      cache: from `init_cache` or a previous `decode`; index + K <= capacity.

    Returns:
      [B, K, V] float32 logits (of the token after each input) and the cache
      with the K entries written and index + K.
    """
    features, cache = self.decode_features(decoder_input_tokens, cache)
    return self.decoder.logits(features), cache

  def decode_features(self, decoder_input_tokens: jax.Array,
                      cache: cache_lib.Cache) -> tuple[jax.Array, cache_lib.Cache]:
    """`decode` without the output layer: [B, K, E] features and the cache.

    For a head of one's own over the features (models.PrunedHeadDraft).
    """
    state = cache.layers
    features, buffers = self.decoder.features(
        self.token_embedder(decoder_input_tokens), state.cross_attention, state.encoder_mask,
        buffers=state.self_attention, index=cache.index)
    state = state.replace(self_attention=buffers)
    return features, cache.replace(index=cache.index + decoder_input_tokens.shape[1],
                                   layers=state)

  def __call__(self, encoder_input_tokens: jax.Array, decoder_input_tokens: jax.Array,
               enable_dropout: bool = False) -> jax.Array:
    """Teacher forcing: [B, S] inputs, [B, L] decoder inputs -> [B, L, V] float32 logits.

    Decoder inputs are the targets shifted right with a leading 0 (BOS).
    """
    encoded = self.encode(encoder_input_tokens, enable_dropout)
    logits, _ = self.decoder(
        self.token_embedder(decoder_input_tokens), self.decoder.cross_kv(encoded),
        encoder_input_tokens > 0, deterministic=not enable_dropout)
    return logits
