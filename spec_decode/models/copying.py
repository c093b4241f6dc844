"""A draft that copies where the text repeats itself and asks its model elsewhere.

A small draft is poor at copying: on SmolLM2-135M-Instruct's greedy answers to
held-out prompts, where the last 2-3 tokens occurred before in the prompt or
the answer, the token that followed them then is the target's next token 72%
of the time, the trained draft's top token only 39%
(scripts/studies/copy_agreement.py, docs/decoder_only.md).
`CopyingDraft` proposes that token there (drafts.PromptLookupDraft's
proposal, q its one-hot) and its model's q elsewhere:

  q(. | context) = one-hot(lookup)   where an n-gram of min_ngram..max_ngram
                                      tokens matches,
                   q_model(. | context) elsewhere.

Which of the two applies depends on the context alone, and the model steps on
every token either way (its cache stays whole), so q is a distribution of the
context and speculative sampling stays exact with it: a copy is kept with
probability p(copy).

  draft = CopyingDraft.create(model_draft, min_ngram=2)
  out = spec_decode.speculative_generate(target, draft, prompts, key, lengths=lengths,
                                         gamma=4, max_decode_len=128)

The model draft may be any draft of the target's family: a second model, a
PrunedHeadDraft, or a FeatureDraft (which starts with its target: `start_pair`
passes the target's features through).
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode.models import drafts
from spec_decode.models import protocol


@flax.struct.dataclass
class CopyingDraft:
  """q = one-hot of the prompt-lookup proposal where an n-gram matches, the model's q elsewhere.

  Attributes:
    draft: the model draft (protocol.Model; a FeatureDraft too).
    lookup: the drafts.PromptLookupDraft that finds the copies (static sizes).
  """

  draft: Any
  lookup: drafts.PromptLookupDraft

  @classmethod
  def create(cls, draft: Any, *, min_ngram: int = 2, max_ngram: int = 3) -> 'CopyingDraft':
    """`draft` with copies of n-grams of min_ngram..max_ngram tokens.

    Raises:
      ValueError: n-gram sizes out of range (drafts.PromptLookupDraft), or a
        draft that is a CopyingDraft already.
    """
    if isinstance(draft, CopyingDraft):
      raise ValueError('the draft copies already: wrap its model draft once')
    return cls(draft, drafts.PromptLookupDraft(draft.vocab_size, max_ngram, min_ngram))

  @property
  def vocab_size(self) -> int:
    return self.draft.vocab_size

  @property
  def reads(self) -> str:
    """The model draft's (AttributeError for one without `reads`, as for it)."""
    return self.draft.reads

  @property
  def tokenizer(self) -> Any:
    """The model draft's tokenizer fingerprint (models.llama.check_tokenizers), if any."""
    return getattr(self.draft, 'tokenizer', ())

  def with_panels(self) -> 'CopyingDraft':
    """This draft over its model's packed CPU-kernel weights (where it has them)."""
    if not hasattr(self.draft, 'with_panels'):
      return self
    return self.replace(draft=self.draft.with_panels())

  def start(self, batch: protocol.Batch, capacity: int):
    """The step function and fresh cache (protocol.Model) of a model draft that starts alone."""
    step_fn, cache = self.draft.start(batch, capacity)
    return self._combined(batch, capacity, step_fn, cache)

  def start_pair(self, target: Any, batch: protocol.Batch, capacity: int):
    """Starts with the target (as FeatureDraft.start_pair): both (step, cache) pairs and `feed`.

    A model draft without `start_pair` starts alone and `feed` leaves the cache as it is.
    """
    if hasattr(self.draft, 'start_pair'):
      target_start, (step_fn, cache), feed = self.draft.start_pair(target, batch, capacity)
    else:
      target_start, (step_fn, cache) = target.start(batch, capacity), self.draft.start(batch,
                                                                                       capacity)
      feed = None

    def combined_feed(cache: cache_lib.Cache, target_cache: cache_lib.Cache, begin: jax.Array,
                      width: int) -> cache_lib.Cache:
      if feed is None:
        return cache
      model_cache, lookup_cache = cache.layers
      return cache.replace(layers=(feed(model_cache, target_cache, begin, width), lookup_cache))

    return target_start, self._combined(batch, capacity, step_fn, cache), combined_feed

  def _combined(self, batch, capacity, model_step_fn, model_cache):
    """The step function over both parts; the cache holds both at one index."""
    propose_fn, lookup_cache = self.lookup.start_proposals(batch, capacity)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      model_cache, lookup_cache = cache.layers
      logits, model_cache = model_step_fn(tokens, cache_lib.rewind(model_cache, cache.index))
      proposal, found, lookup_cache = propose_fn(tokens, cache_lib.rewind(lookup_cache,
                                                                          cache.index))
      copy = drafts.one_hot_logits(proposal, self.vocab_size)
      logits = jnp.where(found[..., None], copy, logits.astype(jnp.float32))
      return logits, cache.replace(index=cache.index + tokens.shape[1],
                                   layers=(model_cache, lookup_cache))

    return step_fn, cache_lib.Cache(index=model_cache.index, layers=(model_cache, lookup_cache),
                                    capacity=capacity)
