"""The Llama decoder with multi-token cached decoding behind a prompt.

Parameter tree (Hugging Face's LlamaForCausalLM names in spec_decode.llama.hf):

  embed_tokens/embedding                           [V, E]
  layers_{i}/input_layernorm/scale                 [E]
  layers_{i}/self_attn/q_proj/kernel               [E, H * Dh]
  layers_{i}/self_attn/{k_proj,v_proj}/kernel      [E, Hkv * Dh]
  layers_{i}/self_attn/o_proj/kernel               [H * Dh, E]
  layers_{i}/post_attention_layernorm/scale        [E]
  layers_{i}/mlp/{gate_proj,up_proj}/kernel        [E, F]
  layers_{i}/mlp/down_proj/kernel                  [F, E]
  norm/scale                                       [E]
  lm_head/kernel                                   [E, V]  (untied only)

Packed copies for the CPU kernels (`kernels.PANELS`, LlamaModel.with_panels)
mirror the layers' kernels; a tied output layer's is `head`, the table's
transpose.

Prompts and the loops: the cache sits behind each row's prompt
(spec_decode.cache.PromptState, one KeyValue [B, Hkv, T, Dh] per layer at
physical positions). `prefill` runs row b's prompt, all but its last token,
at physical positions 0 .. offset[b] - 1, offset[b] = prompt length - 1;
`decode` feeds loop position i of row b at physical position offset[b] + i,
the row's last prompt token at loop position 0 (cache.behind_prompt). Loop
position 0's logits are then the next-token distribution after the whole
prompt. Rotary positions are the physical ones, as Hugging Face numbers a
prompt from 0. A query attends to the keys at physical positions at or before
its own: the causal mask, and the mask of every stale entry past a rewind or
past a shorter row's prompt, as in the T5 decoder (spec_decode.cache).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import kernels
from spec_decode.llama.config import LlamaConfig
from spec_decode.t5 import layers
from spec_decode.t5.network import KeyValue

HEAD = 'head'  # where the panels collection holds a tied output layer's (LlamaModel.with_panels)

_init = nn.initializers.normal(stddev=0.02)  # HF's initializer_range


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding in Hugging Face's rotate_half convention.

  Args:
    x: [B, L, N, Dh] queries or keys of N heads.
    positions: [B, L] int32 absolute positions.
    theta: the frequencies' base (rope_theta).

  Returns:
    [B, L, N, Dh], dimension j paired with j + Dh / 2, in x's dtype.
  """
  dim = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))  # [Dh / 2]
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, L, Dh / 2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, L, 1, Dh]
  x32 = x.astype(jnp.float32)
  first, second = jnp.split(x32, 2, axis=-1)
  rotated = jnp.concatenate([-second, first], axis=-1)
  return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def _dense(cfg: LlamaConfig, features: int, name: str) -> layers.Dense:
  """A bias-free product that reads packed panels where the variables hold them (`LlamaModel.with_panels`)."""
  return layers.Dense(features, kernel_init=_init, dtype=cfg.compute_dtype,
                      param_dtype=cfg.compute_dtype, name=name)


class Attention(nn.Module):
  """Grouped-query self-attention with rotary positions over a key/value buffer."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, bias: jax.Array,
               buffers: KeyValue | None, index: jax.Array | None) -> tuple[jax.Array, KeyValue]:
    """Attends from K inputs per row.

    Args:
      x: [B, K, E] normed inputs.
      positions: [B, K] int32 their physical positions.
      bias: [B, K, T] float32 mask bias over the keys.
      buffers: [B, Hkv, T, Dh] buffers to write the K new keys/values into at
        `index` and attend over, or None to attend over the K inputs (T = K).
      index: [B] int32 physical position of x[:, 0] (with buffers).

    Returns:
      [B, K, E] and the keys/values attended over.
    """
    cfg = self.config
    batch, length, _ = x.shape
    heads, kv_heads, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    query = _dense(cfg, heads * dim, 'q_proj')(x).reshape(batch, length, heads, dim)
    key = _dense(cfg, kv_heads * dim, 'k_proj')(x).reshape(batch, length, kv_heads, dim)
    value = _dense(cfg, kv_heads * dim, 'v_proj')(x).reshape(batch, length, kv_heads, dim)
    query = rotary(query, positions, cfg.rope_theta)
    key = jnp.swapaxes(rotary(key, positions, cfg.rope_theta), 1, 2)  # [B, Hkv, K, Dh]
    value = jnp.swapaxes(value, 1, 2)
    if buffers is not None:
      key = cache_lib.write(buffers.key, key, index, axis=1)  # [B, Hkv, T, Dh]
      value = cache_lib.write(buffers.value, value, index, axis=1)
    # Query head h reads key/value head h // groups (HF's repeat_kv).
    query = query.reshape(batch, length, kv_heads, cfg.groups, dim).transpose(0, 2, 3, 1, 4)
    scores = jnp.einsum('bhgkd,bhtd->bhgkt', query, key, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(scores * dim**-0.5 + bias[:, None, None], axis=-1)
    out = jnp.einsum('bhgkt,bhtd->bkhgd', weights.astype(cfg.compute_dtype), value)
    out = _dense(cfg, x.shape[-1], 'o_proj')(out.reshape(batch, length, heads * dim))
    return out, KeyValue(key, value)


class Mlp(nn.Module):
  """SwiGLU feed-forward: down_proj(silu(gate_proj x) * up_proj x)."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, K, E] -> [B, K, E]."""
    cfg = self.config
    hidden = (nn.silu(_dense(cfg, cfg.intermediate_size, 'gate_proj')(x))
              * _dense(cfg, cfg.intermediate_size, 'up_proj')(x))
    return _dense(cfg, cfg.hidden_size, 'down_proj')(hidden)


def _norm(cfg: LlamaConfig, name: str | None = None) -> layers.RMSNorm:
  return layers.RMSNorm(dtype=cfg.compute_dtype, param_dtype=cfg.compute_dtype,
                        epsilon=cfg.rms_norm_eps, name=name)


class DecoderLayer(nn.Module):
  """Pre-norm self-attention and MLP blocks with residuals."""

  config: LlamaConfig

  @nn.compact
  def __call__(self, x: jax.Array, positions: jax.Array, bias: jax.Array,
               buffers: KeyValue | None, index: jax.Array | None) -> tuple[jax.Array, KeyValue]:
    """[B, K, E] -> [B, K, E] and the layer's keys/values; see Attention."""
    cfg = self.config
    y, kv = Attention(cfg, name='self_attn')(_norm(cfg, 'input_layernorm')(x), positions, bias,
                                             buffers, index)
    x = x + y
    return x + Mlp(cfg, name='mlp')(_norm(cfg, 'post_attention_layernorm')(x)), kv


def empty_buffers(cfg: LlamaConfig, batch: int, length: int) -> tuple[KeyValue, ...]:
  """Per layer, zero key/value buffers [batch, Hkv, length, Dh]."""
  shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
  return tuple(KeyValue(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))
               for _ in range(cfg.num_hidden_layers))


class LlamaNetwork(nn.Module):
  """Llama: the full-sequence path (`__call__`) and the prompt-cached decoding path.

    cache = net.apply(v, prompt_tokens, lengths, capacity, method='prefill')
    logits, cache = net.apply(v, tokens, cache, method='decode')
    features, cache = net.apply(v, tokens, cache, method='decode_features')
  """

  config: LlamaConfig

  def setup(self):
    cfg = self.config
    self.embed_tokens = layers.Embed(cfg.vocab_size, cfg.hidden_size, embedding_init=_init,
                                     dtype=cfg.compute_dtype, param_dtype=cfg.compute_dtype)
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)]
    self.norm = _norm(cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = nn.Dense(cfg.vocab_size, use_bias=False, dtype=jnp.float32,
                              param_dtype=cfg.compute_dtype, kernel_init=_init,
                              dot_general=kernels.dot_general)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """[B, L] int32 tokens at positions 0..L-1 -> [B, L, V] float32 logits, no cache."""
    return self.logits(self.features(tokens)[0])

  def logits(self, y: jax.Array) -> jax.Array:
    """The output layer: [B, K, E] features -> [B, K, V] float32 logits."""
    if self.config.tie_word_embeddings:
      y, table = y.astype(jnp.float32), self.embed_tokens.embedding.astype(jnp.float32)
      if self.has_variable(kernels.PANELS, HEAD):  # the table's transpose, packed
        panels = self.get_variable(kernels.PANELS, HEAD)
        if kernels.panels_apply(y, panels, table.T):
          return kernels.dense_panels(y, panels, table.T)
      return jnp.einsum('bke,ve->bkv', y, table)
    return self.lm_head(y)

  def features(self, tokens: jax.Array, buffers: tuple[KeyValue, ...] | None = None,
               index: jax.Array | None = None) -> tuple[jax.Array, tuple[KeyValue, ...] | None]:
    """Runs K tokens per row up to the output layer.

    Args:
      tokens: [B, K] int32.
      buffers: per layer, key/value buffers [B, Hkv, T, Dh] to write the K
        new entries into at `index` and attend over; None for a full
        sequence (positions 0..K-1, no cache).
      index: [B] int32 physical position of tokens[:, 0] (with buffers).

    Returns:
      [B, K, E] final (normed) features and the updated buffers (None
      without).
    """
    return self.features_from(self.embed_tokens(tokens), buffers, index)

  def features_from(self, y: jax.Array, buffers: tuple[KeyValue, ...] | None = None,
                    index: jax.Array | None = None
                    ) -> tuple[jax.Array, tuple[KeyValue, ...] | None]:
    """`features` from inputs y [B, K, E] in place of the tokens' embeddings."""
    steps = jnp.arange(y.shape[1])
    if buffers is None:
      positions = jnp.broadcast_to(steps, y.shape[:2])  # [B, K]
      key_positions = steps  # [K]
    else:
      positions = index[:, None] + steps  # [B, K]
      key_positions = jnp.arange(buffers[0].key.shape[2])  # [T]
    bias = layers.mask_bias(key_positions[None, None, :] <= positions[:, :, None])  # [B, K, T]
    new_buffers = []
    for i, layer in enumerate(self.layers):
      y, kv = layer(y, positions, bias, None if buffers is None else buffers[i], index)
      new_buffers.append(kv)
    return self.norm(y), None if buffers is None else tuple(new_buffers)

  def prefill(self, prompt_tokens: jax.Array, lengths: jax.Array, capacity: int,
              with_features: bool = False):
    """A cache holding every row's prompt but its last token.

    Args:
      prompt_tokens: [B, P] int32, row b's prompt in its first lengths[b]
        entries (the rest is ignored).
      lengths: [B] int32 prompt lengths in 1..P.
      capacity: static loop positions the cache holds (Cache.capacity); the
        buffers hold P - 1 more.
      with_features: static; also return the prompt's final (normed)
        features [B, P - 1, E] at physical positions 0..P-2.

    Returns:
      Cache at loop index 0, layers a cache.PromptState (after the features
      with `with_features`).
    """
    cfg = self.config
    batch, width = prompt_tokens.shape
    buffers = empty_buffers(cfg, batch, width - 1 + capacity)
    features = jnp.zeros((batch, 0, cfg.hidden_size), cfg.compute_dtype)
    if width > 1:
      features, buffers = self.features(prompt_tokens[:, :-1], buffers,
                                        jnp.zeros((batch,), jnp.int32))
    cache = cache_lib.prompt_cache(buffers, prompt_tokens, lengths, capacity)
    return (features, cache) if with_features else cache

  def decode(self, tokens: jax.Array,
             cache: cache_lib.Cache) -> tuple[jax.Array, cache_lib.Cache]:
    """The step function: K tokens per row at each row's loop index.

    Args:
      tokens: [B, K] int32 at loop positions cache.index[b] + 0..K-1; the
        token at loop position 0 is replaced by the row's last prompt token.
      cache: from `prefill` or a previous `decode`; index + K <= capacity.

    Returns:
      [B, K, V] float32 logits (of the token after each input) and the cache
      with the K entries written and index + K.
    """
    features, cache = self.decode_features(tokens, cache)
    return self.logits(features), cache

  def decode_features(self, tokens: jax.Array,
                      cache: cache_lib.Cache) -> tuple[jax.Array, cache_lib.Cache]:
    """`decode` without the output layer: [B, K, E] final (normed) features and the cache.

    For a head of one's own over the features (models.PrunedHeadDraft).
    """
    tokens, positions = cache_lib.behind_prompt(tokens, cache)
    features, buffers = self.features(tokens, cache.layers.buffers, positions)
    return features, cache.replace(
        index=cache.index + tokens.shape[1], layers=cache.layers.replace(buffers=buffers))
