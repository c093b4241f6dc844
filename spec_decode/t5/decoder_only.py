"""A decoder-only T5 1.1 language model in T5X's layout, with multi-token cached decoding.

T5X's minimal decoder-only Transformer (t5x/examples/decoder_only/network.py)
with T5 1.1's blocks: RMSNorm, gated-GELU MLP, relative position bias,
untied output layer, and no cross-attention. The parameter tree:

  decoder/token_embedder/embedding                          [V, E]
  decoder/relpos_bias/rel_embedding                         [H, 32]
  decoder/layers_{i}/pre_self_attention_layer_norm/scale    [E]
  decoder/layers_{i}/self_attention/{query,key,value}/kernel  [E, H * Dh]
  decoder/layers_{i}/self_attention/out/kernel              [H * Dh, E]
  decoder/layers_{i}/pre_mlp_layer_norm/scale               [E]
  decoder/layers_{i}/mlp/{wi_0,wi_1}/kernel, mlp/wo/kernel  [E, F], [F, E]
  decoder/decoder_norm/scale                                [E]
  decoder/logits_dense/kernel                               [E, V]

As in T5X, a sequence is fed shifted right with 0 (BOS) at position 0, and a
prompt (T5X's "inputs" of a decoder-only task) fills the cache before the
continuation is sampled; attention is causal over the prompt too. Decoding
uses a `spec_decode.cache.Cache` behind each row's prompt
(`spec_decode.cache.PromptState`: one `KeyValue` per layer, [B, H, T, Dh]);
`decode` feeds K tokens per row at that row's index, and a query attends to
the keys at or before its own position, as in the T5 decoder.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import kernels
from spec_decode.t5 import layers
from spec_decode.t5 import network
from spec_decode.t5.config import T5Config
from spec_decode.t5.network import KeyValue


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
  """Sizes and numerics of a decoder-only T5 1.1 language model.

  Attributes:
    vocab_size: V.
    emb_dim: E.
    num_heads: H.
    num_layers: decoder blocks.
    head_dim: Dh.
    mlp_dim: width of the gated-GELU feed-forward block.
    dropout_rate, dtype, param_dtype, num_buckets, max_distance: as T5Config.
  """

  vocab_size: int
  emb_dim: int
  num_heads: int
  num_layers: int
  head_dim: int
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  num_buckets: int = 32
  max_distance: int = 128

  def __post_init__(self):
    self.blocks()  # T5Config's checks of every shared field

  def blocks(self) -> T5Config:
    """The blocks' sizes as a T5Config, what the T5 layers take (its encoder fields unused)."""
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    layers_count = fields.pop('num_layers')
    return T5Config(num_encoder_layers=1, num_decoder_layers=layers_count, **fields)

  @property
  def num_decoder_layers(self) -> int:
    return self.num_layers


class DecoderStack(nn.Module):
  """Tokens -> float32 logits; T5X's `decoder/` scope."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(
        cfg.vocab_size, cfg.emb_dim, embedding_init=nn.initializers.normal(stddev=1.0),
        dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype)
    self.relpos_bias = network.relpos_bias(cfg, bidirectional=False)
    self.layers = [network.DecoderLayer(cfg, cross_attention=False)
                   for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = network.norm(cfg)
    self.logits_dense = nn.Dense(
        cfg.vocab_size, use_bias=False, dtype=jnp.float32, param_dtype=cfg.weight_dtype,
        kernel_init=layers.dense_init, dot_general=kernels.dot_general)
    self.dropout = network.dropout(cfg)

  def __call__(self, tokens: jax.Array, buffers: tuple[KeyValue, ...] | None = None,
               index: jax.Array | None = None, deterministic: bool = True
               ) -> tuple[jax.Array, tuple[KeyValue, ...] | None]:
    """Logits of K tokens per row.

    Args:
      tokens: [B, K] int32.
      buffers: per layer, [B, H, T, Dh] self-attention buffers (cached
        decoding), or None for a whole sequence at positions 0..K-1.
      index: [B] int32 absolute position of tokens[:, 0] (with buffers).
      deterministic: disables dropout.

    Returns:
      [B, K, V] float32 logits and the updated buffers (None without).
    """
    bias = network.causal_bias(self.relpos_bias, tokens.shape[1], buffers, index)
    y = self.dropout(self.token_embedder(tokens), deterministic=deterministic)
    new_buffers = []
    for i, layer in enumerate(self.layers):
      y, kv = layer(y, bias, None, None, None if buffers is None else buffers[i], index,
                    deterministic)
      new_buffers.append(kv)
    y = self.dropout(self.decoder_norm(y), deterministic=deterministic)
    return self.logits_dense(y), None if buffers is None else tuple(new_buffers)


class DecoderOnlyTransformer(nn.Module):
  """The decoder-only LM: teacher forcing (`__call__`) and cached decoding.

    cache = model.apply(v, prompts, lengths, capacity, method='prefill')
    logits, cache = model.apply(v, tokens, cache, method='decode')
  """

  config: DecoderOnlyConfig

  def setup(self):
    self.decoder = DecoderStack(self.config.blocks())

  def __call__(self, decoder_input_tokens: jax.Array, enable_dropout: bool = False) -> jax.Array:
    """[B, L] tokens shifted right (0 first) -> [B, L, V] float32 logits, causal."""
    logits, _ = self.decoder(decoder_input_tokens, deterministic=not enable_dropout)
    return logits

  def prefill(self, prompt_tokens: jax.Array, lengths: jax.Array,
              capacity: int) -> cache_lib.Cache:
    """A cache behind each row's prompt (spec_decode.cache.PromptState).

    The sequence is T5X's: 0 (BOS) and then the prompt; all of it but its
    last token is prefilled in one call.

    Args:
      prompt_tokens: [B, P] int32, row b's prompt in its first lengths[b]
        entries (P may be 0: no prompt).
      lengths: [B] int32 prompt lengths in 0..P.
      capacity: static loop positions the cache holds; the buffers hold P more.

    Returns:
      Cache at loop index 0.
    """
    cfg = self.config
    batch = prompt_tokens.shape[0]
    sequence = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32),
                                prompt_tokens.astype(jnp.int32)], axis=1)  # [B, P + 1]
    shape = (batch, cfg.num_heads, sequence.shape[1] - 1 + capacity, cfg.head_dim)
    zeros = lambda: jnp.zeros(shape, jnp.dtype(cfg.dtype))
    buffers = tuple(KeyValue(zeros(), zeros()) for _ in range(cfg.num_layers))
    if sequence.shape[1] > 1:
      _, buffers = self.decoder(sequence[:, :-1], buffers, jnp.zeros((batch,), jnp.int32))
    return cache_lib.prompt_cache(buffers, sequence, lengths + 1, capacity)

  def decode(self, tokens: jax.Array,
             cache: cache_lib.Cache) -> tuple[jax.Array, cache_lib.Cache]:
    """The step function: [B, K] tokens at each row's loop index -> [B, K, V] logits, cache.

    The token at loop position 0 is replaced by the row's last prompt token
    (spec_decode.cache.behind_prompt).
    """
    state = cache.layers
    tokens, positions = cache_lib.behind_prompt(tokens, cache)
    logits, buffers = self.decoder(tokens, state.buffers, positions)
    return logits, cache.replace(index=cache.index + tokens.shape[1],
                                 layers=state.replace(buffers=buffers))
