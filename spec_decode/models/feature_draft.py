"""A draft that reads its target's features: a layer over the target's last hidden state.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty") drafts from the target's own final features. At
physical position t the draft reads token x_t and the target's feature
f_{t-1} (its final, normed hidden state after x_{t-1}, what its output layer
scores to predict x_t): `fc` maps [embedding(x_t), s * f_{t-1}] to width E
(s: `feature_scale`, per dimension, from 1 / the target's final norm scale: a
unit-sized feature beside the embedding), a
decoder layer or two of the target's shape and a norm give f^_t, an estimate
of f_t, and the target's tied output layer, pruned to `ids`
(models.pruned_head), scores it for x_{t+1}. Past what the target has read,
the draft reads its own f^_{t-1}.

A `FeatureDraft` starts with its target (`start_pair`): the target's step
keeps its features in a buffer of its cache, the draft's cache holds a buffer
of its own (the target's features up to what the target has read, its own
estimates after), and after each verify call `feed` copies the features the
target has just computed into the draft's buffer. Any q keeps speculative
sampling exact; the draft's key/value entries of accepted drafts stay those
it computed from its own estimates (the first call of an iteration rewrites
the last two from the target's features, spec_decode.draft_phase).

  draft = FeatureDraft.create(config, own_params, target, ids)
  out = spec_decode.speculative_generate(target, draft, prompts, key, lengths=lengths,
                                         gamma=4, max_decode_len=128)
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import kernels
from spec_decode.llama.config import LlamaConfig
from spec_decode.llama import network as network_lib
from spec_decode.llama.network import LlamaNetwork
from spec_decode.models import protocol
from spec_decode.models import pruned_head
from spec_decode.models.llama import LlamaModel
from spec_decode.models.t5 import replacing
from spec_decode.t5 import layers


class FeatureDraftNetwork(LlamaNetwork):
  """LlamaNetwork's layers over fc([embedding, s * previous feature]).

  Its parameters add fc/kernel [2E, E] and feature_scale [E] (s).
  """

  def setup(self):
    super().setup()
    cfg = self.config
    self.fc = layers.Dense(cfg.hidden_size, kernel_init=jax.nn.initializers.normal(0.02),
                           dtype=cfg.compute_dtype, param_dtype=cfg.compute_dtype)
    self.feature_scale = self.param('feature_scale', jax.nn.initializers.ones,
                                    (cfg.hidden_size,), cfg.compute_dtype)

  def __call__(self, tokens: jax.Array, previous: jax.Array) -> jax.Array:
    """Full sequences (training): tokens [B, L], previous [B, L, E] -> f^ [B, L, E]."""
    return self.draft_features(tokens, previous)[0]

  def draft_features(self, tokens: jax.Array, previous: jax.Array,
                     buffers: Any = None, index: jax.Array | None = None):
    """f^ [B, K, E] and the buffers, from tokens [B, K] and the features before them [B, K, E].

    buffers / index: as LlamaNetwork.features (None: positions 0..K-1, no cache).
    """
    previous = previous.astype(self.config.compute_dtype) * self.feature_scale
    y = jnp.concatenate([self.embed_tokens(tokens), previous], axis=-1)
    return self.features_from(self.fc(y), buffers, index)


@flax.struct.dataclass
class FeatureBuffers:
  """`PromptState.buffers` of a pair's caches: key/values and final features at physical positions.

  Attributes:
    kv: per layer, KeyValue [B, Hkv, T, Dh].
    features: [B, T, E] the target's final features (the draft's: the
      target's up to what it has read, then the draft's own estimates).
  """

  kv: Any
  features: jax.Array


@flax.struct.dataclass
class FeatureDraft:
  """A draft over its target's features, with the target's pruned, tied output layer.

  Attributes:
    config: the draft's LlamaConfig (the target's but num_hidden_layers); static.
    params: fc, layers_*, norm and the target's embed_tokens.
    ids: [N] int32 ascending: the token ids the output layer scores.
    kernel: [E, N] float32 the target's output columns of `ids`.
    panels, head_panels: packed copies for the CPU kernels (`with_panels`), or None.
  """

  config: LlamaConfig = flax.struct.field(pytree_node=False)
  params: Any
  ids: jax.Array
  kernel: jax.Array
  panels: Any = flax.struct.field(default=None, kw_only=True)
  head_panels: Any = flax.struct.field(default=None, kw_only=True)
  reads = protocol.PROMPT

  @classmethod
  def create(cls, config: LlamaConfig, own: dict[str, Any], target: LlamaModel,
             ids) -> 'FeatureDraft':
    """The draft with parameters `own` (fc, layers_*, norm) over `target`'s embedding, packed.

    Raises:
      ValueError: a target with an untied output layer, a config of another
        width or vocabulary, or ids that are not distinct ids of the vocabulary.
    """
    if not target.config.tie_word_embeddings:
      raise ValueError('a FeatureDraft scores with its target\'s tied output layer; this target '
                       'has an lm_head of its own')
    for name in ('hidden_size', 'vocab_size', 'num_attention_heads', 'num_key_value_heads'):
      if getattr(config, name) != getattr(target.config, name):
        raise ValueError(f'the draft\'s {name} {getattr(config, name)} differs from its '
                         f'target\'s {getattr(target.config, name)}')
    ids = pruned_head.check_ids(ids, target.vocab_size)
    embedding = target.params['embed_tokens']['embedding']
    params = {**own, 'embed_tokens': {'embedding': embedding}}
    kernel = jnp.asarray(embedding[ids].T, jnp.float32)
    return cls(config, params, jnp.asarray(ids), kernel).with_panels()

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def network(self) -> FeatureDraftNetwork:
    return FeatureDraftNetwork(self.config)

  def with_panels(self) -> 'FeatureDraft':
    """This draft with its kernels and output columns packed for the CPU kernels; cached."""
    if '_with_panels' not in self.__dict__:
      packed = self
      own = {k: v for k, v in self.params.items() if k != 'embed_tokens'}
      if self.panels is None and kernels.packing_pays(own):
        packed = self.replace(panels=kernels.pack_tree(own, lambda path: path[-1] == 'kernel'),
                              head_panels=kernels.pack_weights(self.kernel))
      object.__setattr__(self, '_with_panels', packed)
    return self.__dict__['_with_panels']

  def start(self, batch: protocol.Batch, capacity: int):
    """Refused: this draft starts with its target's features (`start_pair`)."""
    raise ValueError('a FeatureDraft reads its target\'s features: it decodes with '
                     'speculative_generate only (not beam search or on its own)')

  def start_pair(self, target: LlamaModel, batch: protocol.Batch, capacity: int):
    """Prefills both models; the target's cache keeps its features, the draft reads them.

    Args:
      target: the LlamaModel this draft was trained for.
      batch: the prompts, as `LlamaModel.start` takes them.
      capacity: static loop positions.

    Returns:
      (target_step_fn, target_cache), (draft_step_fn, draft_cache) as
      `Model.start` returns them, and `feed(draft_cache, target_cache, begin
      [B], width) -> draft_cache` for the loop to call after each verify
      call over loop positions begin .. begin + width - 1.
    """
    t_net, t_vars = target.network, target.variables()
    d_net, d_vars = self.network, self.variables()
    features, cache = t_net.apply(t_vars, batch.tokens, batch.prompt_lengths(), capacity,
                                  method=LlamaNetwork.prefill, with_features=True)
    rows, width = features.shape[:2]
    buffer = jnp.zeros((rows, width + capacity, features.shape[2]), jnp.float32)
    buffer = buffer.at[:, :width].set(features.astype(jnp.float32))
    target_cache = cache.replace(layers=cache.layers.replace(
        buffers=FeatureBuffers(cache.layers.buffers, buffer)))
    kv = network_lib.empty_buffers(self.config, rows, width + capacity)
    if width:  # the prompt but its last token, each after the target's feature before it
      previous = jnp.pad(features, ((0, 0), (1, 0), (0, 0)))[:, :width]
      _, kv = d_net.apply(d_vars, batch.tokens[:, :width], previous, kv,
                          jnp.zeros((rows,), jnp.int32), method=FeatureDraftNetwork.draft_features)
    draft_cache = cache_lib.prompt_cache(FeatureBuffers(kv, buffer), batch.tokens,
                                         batch.prompt_lengths(), capacity)

    def target_step(tokens: jax.Array, cache: cache_lib.Cache):
      tokens, position = cache_lib.behind_prompt(tokens, cache)
      state = cache.layers
      features, kv = t_net.apply(t_vars, tokens, state.buffers.kv, position,
                                 method=LlamaNetwork.features)
      buffers = FeatureBuffers(kv, cache_lib.write(state.buffers.features, features, position))
      logits = t_net.apply(t_vars, features, method=LlamaNetwork.logits)
      return logits, cache.replace(index=cache.index + tokens.shape[1],
                                   layers=state.replace(buffers=buffers))

    def draft_step(tokens: jax.Array, cache: cache_lib.Cache):
      tokens, position = cache_lib.behind_prompt(tokens, cache)
      state = cache.layers
      before = position[:, None] - 1 + jnp.arange(tokens.shape[1])  # [B, K]
      previous = jnp.take_along_axis(state.buffers.features, jnp.maximum(before, 0)[..., None],
                                     axis=1) * (before >= 0)[..., None]
      estimate, kv = d_net.apply(d_vars, tokens, previous, state.buffers.kv, position,
                                 method=FeatureDraftNetwork.draft_features)
      buffers = FeatureBuffers(kv, cache_lib.write(state.buffers.features, estimate, position))
      return self.logits(estimate), cache.replace(index=cache.index + tokens.shape[1],
                                                  layers=state.replace(buffers=buffers))

    return (target_step, target_cache), (draft_step, draft_cache), feed

  def logits(self, estimate: jax.Array) -> jax.Array:
    """[B, K, V] float32: the output columns' scores of f^ [B, K, E], PRUNED_LOGIT elsewhere."""
    return pruned_head.scatter_scores(pruned_head.head_scores(estimate, self.kernel,
                                                              self.head_panels),
                                      self.ids, self.vocab_size)

  def variables(self) -> dict:
    """The variables `network.apply` takes: params, and panels where there are some."""
    return kernels.variables(self.params, self.panels)


FeatureDraft.replace = replacing('params', 'panels', 'kernel', 'head_panels')


def feed(draft_cache: cache_lib.Cache, target_cache: cache_lib.Cache, begin: jax.Array,
         width: int) -> cache_lib.Cache:
  """The draft's cache with the target's features at loop positions begin - 1 .. begin + width - 1.

  The target has just read loop positions begin .. begin + width - 1 (the
  verify call); begin - 1 is there too because the draft's first call of an
  iteration rewrites its own estimate over it. Positions past what the loop
  keeps are stale in both buffers and rewritten before the draft reads them.

  Args:
    draft_cache, target_cache: the pair's caches (FeatureBuffers).
    begin: [B] int32 loop position of the verify call's first token.
    width: static positions the verify call covered.
  """
  source = target_cache.layers.buffers.features
  start = jnp.maximum(target_cache.layers.offset + begin - 1, 0)
  window = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, width + 1))(source, start)
  state = draft_cache.layers
  features = cache_lib.write(state.buffers.features, window, start)
  return draft_cache.replace(layers=state.replace(buffers=state.buffers.replace(
      features=features)))
