"""Decoder-only language models in the decoding loops: prompts in, continuations out.

A decoder-only model has `vocab_size`, `min_prompt_length` and

  start(prompt_tokens [B, P], capacity, lengths [B]) -> (step_fn, cache)

whose cache sits behind each row's prompt (spec_decode.cache.PromptState):
the loops then run unchanged, and the logits at loop position 0 are those
after the whole prompt. Two families have one: `DecoderOnlyModel`, T5X's
decoder-only T5 1.1 (spec_decode.t5.decoder_only, its sequences start with
BOS 0, so a prompt may be empty), and spec_decode.llama.LlamaModel (Hugging
Face Llama checkpoints; a prompt starts with the tokenizer's BOS).

  target = DecoderOnlyModel.load(path, config)
  out = speculative_generate(target, draft, prompts, lengths, jax.random.key(0),
                             gamma=4, max_decode_len=128)
  out.tokens  # [B, 128], each row's continuation
"""

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import api_checks
from spec_decode import beam_search
from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import data
from spec_decode import decoding
from spec_decode import drafting
from spec_decode import drafts
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode import speculative_beam
from spec_decode.t5.decoder_only import DecoderOnlyConfig, DecoderOnlyTransformer


@flax.struct.dataclass
class DecoderOnlyModel:
  """A decoder-only T5 1.1 language model's config and parameters (T5X layout).

  Attributes:
    config: the DecoderOnlyConfig; static.
    params: the parameter tree (see spec_decode.t5.decoder_only).
  """

  config: DecoderOnlyConfig = flax.struct.field(pytree_node=False)
  params: Any
  min_prompt_length = 0  # sequences start with BOS 0: a prompt may be empty

  @property
  def network(self) -> DecoderOnlyTransformer:
    return DecoderOnlyTransformer(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @classmethod
  def random(cls, config: DecoderOnlyConfig, rng: jax.Array) -> 'DecoderOnlyModel':
    """Freshly initialised parameters (T5X's initialisers)."""
    return cls(config, _init_params(config, rng))

  @classmethod
  def load(cls, path: str, config: DecoderOnlyConfig, dtype=None) -> 'DecoderOnlyModel':
    """A T5X or orbax checkpoint's parameters, checked against `config` (named arrays)."""
    return cls(config, jax.device_put(checkpoints.load_params(path, config, dtype)))

  def start(self, prompt_tokens: jax.Array, capacity: int,
            lengths: jax.Array | None = None) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """Prefills the prompts; returns the step function and the cache behind them.

    Args:
      prompt_tokens: [B, P] int32, row b's prompt in its first lengths[b]
        entries.
      capacity: static loop positions, e.g. `decoding.cache_length(...)`.
      lengths: [B] int32 in 0..P; None: every row P long.
    """
    network, variables = self.network, {'params': self.params}
    if lengths is None:
      lengths = jnp.full(prompt_tokens.shape[:1], prompt_tokens.shape[1], jnp.int32)
    cache = network.apply(variables, prompt_tokens, lengths, capacity,
                          method=DecoderOnlyTransformer.prefill)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return network.apply(variables, tokens, cache, method=DecoderOnlyTransformer.decode)

    return step_fn, cache


@flax.struct.dataclass
class PromptTableDraft:
  """A unigram or bigram draft (spec_decode.drafts.TableDraft) behind each row's prompt.

  Its bigram q at loop position 0 follows the row's last prompt token (BOS 0
  for an empty prompt of a DecoderOnlyModel).

  Attributes:
    table: the n-gram table.
    min_prompt_length: static, that of the target's family (0 or 1).
  """

  table: drafts.TableDraft
  min_prompt_length: int = flax.struct.field(pytree_node=False, default=0)

  @property
  def vocab_size(self) -> int:
    return self.table.vocab_size

  def start(self, prompt_tokens: jax.Array, capacity: int,
            lengths: jax.Array | None = None) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """As DecoderOnlyModel.start; nothing to prefill."""
    batch, width = prompt_tokens.shape
    bos = 1 - self.min_prompt_length  # a family whose sequences start with BOS 0
    lengths = jnp.full((batch,), width, jnp.int32) if lengths is None else lengths
    sequence = jnp.concatenate([jnp.zeros((batch, bos), jnp.int32),
                                prompt_tokens.astype(jnp.int32)], axis=1)
    cache = cache_lib.prompt_cache(None, sequence, jnp.asarray(lengths) + bos, capacity)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      tokens, _ = cache_lib.behind_prompt(tokens, cache)
      return self.table.logits(tokens), cache.replace(index=cache.index + tokens.shape[1])

    return step_fn, cache


def bundled_config(name: str, dtype: str = 'float32') -> DecoderOnlyConfig:
  """The config of a bundled language model ('lm_target', 'lm_draft': data.LM_SIZES)."""
  if name not in data.LM_SIZES:
    raise ValueError(f'unknown bundled language model {name!r}; expected one of '
                     f'{sorted(data.LM_SIZES)}')
  fields = ('emb_dim', 'num_heads', 'num_layers', 'head_dim', 'mlp_dim')
  return DecoderOnlyConfig(vocab_size=data.VOCAB_SIZE, dtype=dtype, param_dtype=dtype,
                           **dict(zip(fields, data.LM_SIZES[name])))


def load_bundled(name: str, dtype: str = 'float32', path: str | None = None) -> DecoderOnlyModel:
  """A bundled language model ('lm_target' or 'lm_draft', spec_decode/data/models/).

  Args:
    name: which one.
    dtype: its parameters' and activations' dtype.
    path: another checkpoint of the same size (e.g. a retrained one); None:
      the bundled one.

  Raises:
    ValueError: an unknown name, or the bundled vocabulary is not the one the
      checkpoint records (`checkpoints.check_vocabulary`).
  """
  config = bundled_config(name, dtype)
  path = str(data.DATA_DIR / 'models' / name) if path is None else path
  checkpoints.check_vocabulary(path, data.VOCAB_PATH)
  return DecoderOnlyModel.load(path, config)


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: DecoderOnlyConfig, rng: jax.Array) -> Any:
  return DecoderOnlyTransformer(config).init(rng, jnp.ones((1, 1), jnp.int32))['params']


def check_prompts(prompt_tokens: Any, lengths: Any, vocab_size: int,
                  min_length: int = 1) -> tuple[jax.Array, jax.Array | None]:
  """Raises ValueError for prompts the models cannot take; returns them as arrays.

  Shapes and dtypes are always checked; token ids (in [0, V)) and lengths
  (in min_length..P) only when concrete.

  Args:
    prompt_tokens: [B, P] integer ids (or a list of equal rows); P >= min_length.
    lengths: None (every row P long), or [B] integers.
    vocab_size: V.
    min_length: the shortest prompt the models take (0 or 1).
  """
  prompt_tokens = api_checks.as_array('prompt_tokens', prompt_tokens)
  shape, dtype = jnp.shape(prompt_tokens), jnp.result_type(prompt_tokens)
  if len(shape) != 2 or shape[1] < min_length or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f'prompt_tokens must be integer token ids [B, P] with P >= {min_length}, '
                     f'got {dtype} {shape}')
  if lengths is not None:
    lengths = api_checks.as_array('lengths', lengths)
    if jnp.shape(lengths) != shape[:1] or not jnp.issubdtype(jnp.result_type(lengths),
                                                              jnp.integer):
      raise ValueError(f'lengths must be [B={shape[0]}] integers, got '
                       f'{jnp.result_type(lengths)} {jnp.shape(lengths)}')
  concrete = lambda x: x is not None and not isinstance(x, jax.core.Tracer)
  if concrete(prompt_tokens) and prompt_tokens.size:
    ids = np.asarray(prompt_tokens)
    width = np.arange(shape[1])[None] < (shape[1] if lengths is None or not concrete(lengths)
                                         else np.asarray(lengths)[:, None])
    bad = width & ((ids < 0) | (ids >= vocab_size))
    if bad.any():
      row, column = np.argwhere(bad)[0]
      raise ValueError(f'prompt_tokens[{row}, {column}] = {ids[row, column]} is outside the '
                       f'vocabulary [0, {vocab_size})')
  if concrete(lengths):
    values = np.asarray(lengths)
    if values.size and (values.min() < min_length or values.max() > shape[1]):
      raise ValueError(f'lengths must lie in {min_length}..P={shape[1]}, got '
                       f'{values.min()}..{values.max()}')
  return prompt_tokens, lengths


def check_pair(target: Any, draft: Any) -> None:
  """Raises ValueError unless the draft proposes the target's tokens from the same prompts."""
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f'draft vocab_size {draft.vocab_size} != target vocab_size '
                     f'{target.vocab_size}: speculative sampling needs a shared vocabulary')
  if target.min_prompt_length != draft.min_prompt_length:
    raise ValueError('the target and the draft read prompts differently (one starts from its own '
                     'BOS, the other from the prompt): one family of models')


def generate(model: Any, prompt_tokens: jax.Array, lengths: jax.Array | None,
             rng: jax.Array, *, max_decode_len: int, eos_id: int,
             sampling: sampling_lib.SamplingParams | None = None,
             check_finite: bool = True) -> decoding.DecodeOutput:
  """Baseline decoding after each row's prompt: one model call per token, compiled.

  Args:
    model: the decoder-only model M_p.
    prompt_tokens: [B, P] int32 prompts, left-aligned.
    lengths: [B] int32 prompt lengths, or None (every row P long).
    rng: one PRNG key, [B] keys (one stream per row), or an int seed.
    max_decode_len: static maximum number of generated tokens per row.
    eos_id: static id that ends a row (-1: none).
    sampling: traced temperature/top-k/top-p; greedy when None.
    check_finite: static; see spec_decode.models.generate.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len]: each row's
    continuation (EOS included), 0 after it.
  """
  prompt_tokens, lengths = check_prompts(prompt_tokens, lengths, model.vocab_size,
                                         model.min_prompt_length)
  options = decoding.LoopOptions(max_decode_len, eos_id=eos_id, check_finite=check_finite)
  return _decode(model, None, prompt_tokens, lengths, api_checks.check_rng(rng), options,
                 sampling=sampling)


def speculative_generate(target: Any, draft: Any, prompt_tokens: jax.Array,
                         lengths: jax.Array | None, rng: jax.Array, *, gamma: int,
                         max_decode_len: int, eos_id: int,
                         sampling: sampling_lib.SamplingParams | None = None,
                         draft_sampling: sampling_lib.SamplingParams | None = None,
                         lenience: float = 1.0, verification: str = 'token',
                         confidence_threshold: float | None = None,
                         verify_lengths: tuple[int, ...] | None = None,
                         check_finite: bool = True) -> decoding.DecodeOutput:
  """Speculative decoding of M_p with draft M_q after each row's prompt, compiled.

  Args:
    target, draft: decoder-only models of one family and vocabulary (`check_pair`).
    prompt_tokens, lengths, rng, max_decode_len, eos_id, sampling,
      check_finite: as `generate`.
    gamma, draft_sampling, lenience, verification, confidence_threshold,
      verify_lengths: as spec_decode.models.speculative_generate.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len]: the continuations.
  """
  check_pair(target, draft)
  prompt_tokens, lengths = check_prompts(prompt_tokens, lengths, target.vocab_size,
                                         target.min_prompt_length)
  speculative.check_lenience(lenience)
  drafting.check_threshold(confidence_threshold)
  options = decoding.LoopOptions(max_decode_len, decoding.check_size('gamma', gamma),
                                 verification, verify_lengths, eos_id, check_finite)
  return _decode(target, draft, prompt_tokens, lengths, api_checks.check_rng(rng), options,
                 sampling=sampling, draft_sampling=draft_sampling, lenience=lenience,
                 confidence_threshold=confidence_threshold)


def beam_generate(target: Any, prompt_tokens: jax.Array, lengths: jax.Array | None, *,
                  beam_size: int, max_decode_len: int, eos_id: int, alpha: float = 0.6,
                  draft: Any = None, draft_width: int = 1, gamma: int = 3,
                  check_finite: bool = True) -> beam_search.BeamOutput:
  """T5X's beam search of the continuations, compiled; with a draft, speculative.

  Args:
    target, draft, prompt_tokens, lengths, eos_id: as `speculative_generate`
      (draft None: plain beam search).
    beam_size, max_decode_len, alpha, draft_width, gamma, check_finite: as
      spec_decode.models.beam_generate.

  Returns:
    beam_search.BeamOutput: tokens [B, W, max_decode_len], scores [B, W], ascending.
  """
  prompt_tokens, lengths = check_prompts(prompt_tokens, lengths, target.vocab_size,
                                         target.min_prompt_length)
  max_decode_len = decoding.check_size('max_decode_len', max_decode_len)
  api_checks.check_alpha(alpha, max_decode_len)
  batch = jnp.shape(prompt_tokens)[0]
  if draft is not None:
    check_pair(target, draft)
  beam_size, draft_width = api_checks.check_beam_settings(
      beam_size, batch=batch, vocab_size=target.vocab_size,
      draft_width=None if draft is None else draft_width)
  return _beam_generate(target, draft, prompt_tokens, lengths, alpha, beam_size=beam_size,
                        max_decode_len=max_decode_len, draft_width=draft_width or 1,
                        gamma=0 if draft is None else decoding.check_size('gamma', gamma),
                        eos_id=eos_id, check_finite=check_finite)


def decode(target: Any, draft: Any, prompt_tokens: jax.Array, lengths: jax.Array | None,
           rng: jax.Array, options: decoding.LoopOptions, *,
           sampling: sampling_lib.SamplingParams | None = None,
           draft_sampling: sampling_lib.SamplingParams | None = None,
           lenience: float | jax.Array = 1.0,
           confidence_threshold: float | jax.Array | None = None) -> decoding.DecodeOutput:
  """Either loop over decoder-only models by one LoopOptions, traced in the caller's jit.

  As spec_decode.models.decode, with prompts in place of encoder inputs.
  """
  capacity = decoding.cache_length(options.max_decode_len, options.gamma)
  target_step_fn, target_cache = target.start(prompt_tokens, capacity, lengths)
  draft_step_fn, draft_cache = (None, None) if draft is None else draft.start(
      prompt_tokens, capacity, lengths)
  return decoding.decode_loop(target_step_fn, target_cache, draft_step_fn, draft_cache, options,
                              rng=rng, sampling=sampling, draft_sampling=draft_sampling,
                              lenience=lenience, confidence_threshold=confidence_threshold)


_decode = jax.jit(decode, static_argnums=5)


@functools.partial(jax.jit, static_argnames=('beam_size', 'max_decode_len', 'draft_width', 'gamma',
                                             'eos_id', 'check_finite'))
def _beam_generate(target, draft, prompt_tokens, lengths, alpha, *, beam_size, max_decode_len,
                   draft_width, gamma, eos_id, check_finite):
  capacity = decoding.cache_length(max_decode_len, gamma)
  target_step_fn, target_cache = target.start(prompt_tokens, capacity, lengths)
  if draft is None:
    return beam_search.beam_search(target_step_fn, target_cache, beam_size=beam_size,
                                   max_decode_len=max_decode_len, alpha=alpha, eos_id=eos_id,
                                   check_finite=check_finite)
  draft_step_fn, draft_cache = draft.start(prompt_tokens, capacity, lengths)
  return speculative_beam.speculative_beam_search(
      target_step_fn, target_cache, draft_step_fn, draft_cache, beam_size=beam_size,
      draft_width=draft_width, gamma=gamma, max_decode_len=max_decode_len, alpha=alpha,
      eos_id=eos_id, check_finite=check_finite)
