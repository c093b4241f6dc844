"""What the decoding front ends need of a model: a batch to start from, and the Model protocol.

Every family (T5 1.1 encoder-decoders, T5X's decoder-only T5, Llama) and every
draft kind (a second model, a pruned head, prompt lookup, n-gram tables) is a
`Model`: a pytree that passes through `jax.jit` whole and turns a `Batch` into
the step function and cache the loops of `spec_decode.decoding` take.
"""

from typing import Protocol

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode.decoding import StepFn

# How a model reads its inputs (`Model.reads`); a pair must agree.
ENCODER_INPUT = 'an encoder input'
PROMPT_AFTER_BOS = 'a prompt after its start token 0'
PROMPT = 'a prompt that starts with its own start token'
READS = (ENCODER_INPUT, PROMPT_AFTER_BOS, PROMPT)


@flax.struct.dataclass
class Batch:
  """The inputs of one decode, as the target reads them.

  Attributes:
    tokens: [B, S] int32: the encoder input (0 = padding) of an
      encoder-decoder, or the prompts of a decoder-only model, row b's in its
      first lengths[b] entries.
    lengths: [B] int32 prompt lengths (decoder-only); None for an encoder input.
    prompt: [B, P] int32 forced decoder tokens of an encoder-decoder,
      0-padded, or None.
    reads: static, the target's `Model.reads`: what a draft that is no model
      (an n-gram table, prompt lookup) needs to line up with it.
  """

  tokens: jax.Array
  lengths: jax.Array | None = None
  prompt: jax.Array | None = None
  reads: str = flax.struct.field(pytree_node=False, default=ENCODER_INPUT)

  @classmethod
  def of(cls, model, tokens: jax.Array, lengths: jax.Array | None = None,
         prompt: jax.Array | None = None) -> 'Batch':
    """`tokens` as `model` reads them, unchecked (`front_ends.make_batch` checks).

    A draft without `reads` (an n-gram table, prompt lookup) is taken to read
    an encoder input; an encoder-decoder drops `lengths`.
    """
    reads = getattr(model, 'reads', ENCODER_INPUT)
    return cls(tokens, None if reads == ENCODER_INPUT else lengths, prompt, reads)

  @property
  def size(self) -> int:
    return self.tokens.shape[0]

  @property
  def decoder_only(self) -> bool:
    return self.reads != ENCODER_INPUT

  def prompt_lengths(self) -> jax.Array:
    """[B] int32 each row's prompt length: `lengths`, or every row S long."""
    if self.lengths is not None:
      return jnp.asarray(self.lengths, jnp.int32)
    return jnp.full(self.tokens.shape[:1], self.tokens.shape[1], jnp.int32)

  @property
  def start_id(self) -> int | None:
    """The token a decoder-only target reads before each prompt (None: the prompt has its own)."""
    return 0 if self.reads == PROMPT_AFTER_BOS else None


class Model(Protocol):
  """A target or draft of the front ends (spec_decode.models.front_ends).

  Attributes:
    vocab_size: V; a draft's must equal its target's.
    reads: one of READS (models only; a draft without it adapts to the batch).
    eos_id: the id that ends a row by default (-1: none; targets only).
  """

  vocab_size: int

  def start(self, batch: Batch, capacity: int) -> tuple[StepFn, cache_lib.Cache]:
    """Encodes or prefills the batch; returns the step function and the fresh cache.

    Args:
      batch: the inputs.
      capacity: static loop positions the cache holds, e.g.
        `decoding.cache_length(max_decode_len, gamma)`.

    Returns:
      `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`
      and the cache at loop position 0, whose logits there are those after
      the whole input (a decoder-only model's prompt).
    """
    ...
