"""A draft whose output layer scores only some tokens: most of a small draft's step, cut.

`PrunedHeadDraft` (also `spec_decode.models.PrunedHeadDraft`) wraps a draft
T5Model or LlamaModel; its step scores the ids given (e.g. `drafts.most_frequent_ids`) and
gives every other token PRUNED_LOGIT, q = 0: speculative sampling stays exact.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode import kernels
from spec_decode.llama.network import LlamaNetwork
from spec_decode.models import protocol
from spec_decode.models.llama import LlamaModel
from spec_decode.models.t5 import T5Model, replacing
from spec_decode.t5.network import Transformer


# The logit of a token a PrunedHeadDraft does not score: finite (check_finite
# passes it), and its probability is exactly 0 in float32 at temperatures up
# to ~1e27.
PRUNED_LOGIT = -1e30


@flax.struct.dataclass
class PrunedHeadDraft:
  """A draft T5 or Llama model whose output layer scores only the tokens `ids`.

  A draft step reads the whole output layer, [E, V]: for a small draft over
  a large vocabulary most of its weights, and on a CPU most of c. This draft
  reads the columns of `ids` alone, e.g. the most
  frequent tokens of the task's outputs (`drafts.most_frequent_ids`; FR-Spec,
  Zhao et al. 2025). Every other token gets q = 0: it is never drafted, and
  the residual max(0, p - q) keeps all of the target's mass on it, so
  speculative sampling stays exact; at plain temperature or with top-k, alpha
  drops by at most the target's probability outside `ids` (top-p over fewer
  tokens can cut a different nucleus). A sharded draft
  (`models.sharding.ShardedT5Model`) is not wrapped: this one's cache carries no
  sharding constraints.

  Attributes:
    model: the draft T5Model or LlamaModel (all of it but its output layer
      is used); its `reads` is this draft's.
    ids: [N] int32 distinct token ids, ascending.
    kernel: [E, N] float32, the output layer's columns of `ids`.
    head_panels: None, or `kernels.pack(kernel)` where the CPU kernels use it
      (`with_panels`); keyword-only.
  """

  model: T5Model | LlamaModel
  ids: jax.Array
  kernel: jax.Array
  head_panels: Any = flax.struct.field(default=None, kw_only=True)

  @classmethod
  def create(cls, model: T5Model | LlamaModel, ids) -> 'PrunedHeadDraft':
    """The draft `model` scoring only `ids` ([N] distinct ids in [0, V), N >= 1), `with_panels`.

    Raises:
      TypeError: a model that is neither a T5Model nor a LlamaModel.
      ValueError: ids that are not a non-empty 1-D set of ids of the vocabulary.
    """
    if not isinstance(model, (T5Model, LlamaModel)):
      raise TypeError(f'a PrunedHeadDraft wraps a T5Model or a LlamaModel, not a '
                      f'{type(model).__name__}')
    ids = check_ids(ids, model.vocab_size)
    return cls(model, jnp.asarray(ids), _head_columns(model, ids)).with_panels()

  @property
  def reads(self) -> str:
    return self.model.reads

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def with_panels(self) -> 'PrunedHeadDraft':
    """This draft over `model.with_panels()`, its output layer packed too; cached.

    A model without panels (a LlamaModel) leaves the output layer unpacked.
    """
    if '_with_panels' not in self.__dict__:
      model, head = self.model, self.head_panels
      if hasattr(model, 'with_panels'):
        model = model.with_panels(output_layer=False)  # the head is this draft's own
      if (getattr(model, 'panels', None) is not None and head is None
          and kernels.packing_pays(self.kernel)):
        head = kernels.pack_weights(self.kernel)
      object.__setattr__(self, '_with_panels', self.replace(model=model, head_panels=head))
    return self.__dict__['_with_panels']

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """As the model's `start`; the logits are PRUNED_LOGIT outside `ids`."""
    _, cache = self.model.start(batch, capacity)
    network = self.model.network
    if isinstance(self.model, LlamaModel):
      variables, decode_features = self.model.variables(), LlamaNetwork.decode_features
    else:
      variables, decode_features = self.model.variables(), Transformer.decode_features

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      features, cache = network.apply(variables, tokens, cache, method=decode_features)
      scores = head_scores(features, self.kernel, self.head_panels)
      return scatter_scores(scores, self.ids, self.vocab_size), cache

    return step_fn, cache


PrunedHeadDraft.replace = replacing('kernel', 'head_panels')


def check_ids(ids, vocab_size: int) -> np.ndarray:
  """[N] int32 `ids` sorted; ValueError unless a non-empty 1-D set of ids in [0, vocab_size)."""
  ids = np.asarray(ids)
  if (ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer)
      or ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != ids.size):
    raise ValueError(f'ids must be distinct token ids in [0, {vocab_size}), a non-empty '
                     f'1-D integer array; got {ids.dtype} {ids.shape}')
  return np.sort(ids).astype(np.int32)


def head_scores(features: jax.Array, kernel: jax.Array, panels: jax.Array | None) -> jax.Array:
  """[B, K, N] float32 features [B, K, E] times the output columns [E, N] (packed where given)."""
  features = features.astype(jnp.float32)
  if panels is not None and kernels.panels_apply(features, panels, kernel):
    return kernels.dense_panels(features, panels, kernel)
  return jnp.einsum('bke,en->bkn', features, kernel)


def scatter_scores(scores: jax.Array, ids: jax.Array, vocab_size: int) -> jax.Array:
  """[B, K, V] float32 logits: `scores` [B, K, N] at the sorted `ids`, PRUNED_LOGIT elsewhere."""
  logits = jnp.full(scores.shape[:2] + (vocab_size,), PRUNED_LOGIT, jnp.float32)
  return logits.at[:, :, ids].set(scores, indices_are_sorted=True, unique_indices=True)


def _head_columns(model: T5Model | LlamaModel, ids: np.ndarray) -> jax.Array:
  """[E, N] float32: the columns of `ids` of the model's output layer, unscaled.

  float32 once here, as the output layers compute in float32 (nn.Dense with
  dtype float32, or Llama's tied einsum) and would promote them at every step.
  """
  params = model.params
  if isinstance(model, T5Model):
    columns = params['decoder']['logits_dense']['kernel'][:, ids]
  elif model.config.tie_word_embeddings:  # the head is the token embedding [V, E], transposed
    columns = params['embed_tokens']['embedding'][ids].T
  else:
    columns = params['lm_head']['kernel'][:, ids]
  return jnp.asarray(columns, jnp.float32)
