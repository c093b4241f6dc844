"""Glue from T5 parameters to the decoding loops' step functions.

A `T5Model` is a config (static) and a parameter tree (traced), on one CPU
device with packed copies of its kernels for the CPU kernels
(`with_panels`): it passes through `jax.jit` whole, so parameters are
arguments of the compiled function, never constants baked into it.
`T5Model.start` runs the encoder once and returns the step function and fresh
cache the loops of `spec_decode.decoding` take; `generate` and
`speculative_generate` are those loops compiled for real T5 models, static in
gamma, max_decode_len and the shapes, traced in the parameters, inputs, PRNG
keys and sampling values.

  target = T5Model(t5_1_1('xxl'), params)
  out = speculative_generate(target, draft, inputs, jax.random.key(0),
                             gamma=4, max_decode_len=128)
  out.tokens  # [B, 128]
"""

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import api_checks
from spec_decode import beam_search
from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode import drafting
from spec_decode import drafts
from spec_decode import kernels
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode import speculative_beam
from spec_decode.t5 import layers
from spec_decode.t5.config import T5Config
from spec_decode.t5.network import Transformer


@flax.struct.dataclass
class T5Model:
  """A T5 1.1 network's config and parameters.

  Attributes:
    config: the T5Config; static (part of the pytree structure).
    params: the parameter tree in T5X layout (see spec_decode.t5.network).
    panels: None, or packed copies of the Dense kernels (`with_panels`);
      keyword-only. `replace(params=...)` drops them.
  """

  config: T5Config = flax.struct.field(pytree_node=False)
  params: Any
  panels: Any = flax.struct.field(default=None, kw_only=True)

  def with_panels(self) -> 'T5Model':
    """This model with `panels` where the CPU kernels would use them, else itself.

    The Dense kernels are packed (`kernels.pack`; those a layer multiplies one
    input by side by side, one product): a decoder step then reads each
    weight matrix as one stream, and the encoder's products of up to 256
    tokens take the kernel too, bitwise the CPU kernel's products (for 17 to
    256 rows an unpacked model takes XLA's, equal to rounding), for a second copy
    of the kernels in memory (half its size in bfloat16, where bfloat16 holds
    the weights: a bfloat16 checkpoint's, or bfloat16 parameters). Only for a
    float32 compute dtype, the kernels' own. Packed once per model and cached.
    """
    if '_with_panels' not in self.__dict__:
      packed = self
      if (self.panels is None and jnp.dtype(self.config.compute_dtype) == jnp.float32
          and kernels.packing_pays(self.params)):
        packed = self.replace(panels=kernels.pack_tree(self.params, is_dense_kernel, _fused))
      object.__setattr__(self, '_with_panels', packed)
    return self.__dict__['_with_panels']

  def variables(self) -> dict:
    """The variables `network.apply` takes: params, and panels where there are some."""
    if self.panels is None:
      return {'params': self.params}
    return {'params': self.params, kernels.PANELS: self.panels}

  @property
  def network(self) -> Transformer:
    return Transformer(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @classmethod
  def random(cls, config: T5Config, rng: jax.Array) -> 'T5Model':
    """Freshly initialised parameters (T5X's initialisers)."""
    return cls(config, _init_params(config, rng)).with_panels()

  @classmethod
  def load(cls, path: str, config: T5Config, dtype=None) -> 'T5Model':
    """A checkpoint's parameters on the default device.

    Args:
      path: a T5X (msgpack + zarr), T5X-orbax or Hugging Face (safetensors)
        checkpoint; `spec_decode.checkpoints.load_params` tells them apart.
      config: the T5Config the parameters must fit (e.g. `t5_1_1('small')`).
      dtype: the parameters' dtype; default config.param_dtype.

    Raises:
      FileNotFoundError: no checkpoint at `path`.
      ValueError: arrays missing, unexpected or of the wrong shape for
        `config`; the message names each.
    """
    return cls(config, jax.device_put(checkpoints.load_params(path, config, dtype))).with_panels()

  def start(self, encoder_input_tokens: jax.Array,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """Encodes the inputs once and returns a step function and its cache.

    Args:
      encoder_input_tokens: [B, S] int32 input tokens, 0 = padding.
      capacity: static decoder positions the cache holds, e.g.
        `decoding.cache_length(max_decode_len, gamma)`.

    Returns:
      `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`
      closed over these parameters, and the fresh cache (index 0).
    """
    network, variables = self.network, self.variables()
    encoded = network.apply(variables, encoder_input_tokens, method=Transformer.encode)
    cache = network.apply(variables, encoded, encoder_input_tokens, capacity,
                          method=Transformer.init_cache)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return network.apply(variables, tokens, cache, method=Transformer.decode)

    return step_fn, cache


def replacing(weights: str, packed: str):
  """A `replace` (dataclasses.replace) for which new `weights` without new `packed` drop them."""

  def replace(self, **updates):
    if weights in updates and packed not in updates:
      updates[packed] = None  # never stale panels
    return dataclasses.replace(self, **updates)

  return replace


# flax.struct.dataclass sets a plain `replace` on the class it decorates.
T5Model.replace = replacing('params', 'panels')


def is_dense_kernel(path: tuple[str, ...]) -> bool:
  """Whether a parameter path names a Dense kernel (`T5Model.with_panels` packs them)."""
  return path[-1] == 'kernel'


# The layers' fused products (t5.layers.FUSED) by the name of the module that makes them;
# cross-attention's query reads the decoder's input, its keys and values the encoder's.
_FUSED_BY_MODULE = {'mlp': 'wi', 'encoder_decoder_attention': 'kv', 'self_attention': 'qkv',
                    'attention': 'qkv'}


def _fused(path: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
  """The kernels of the module at `path` that multiply one input, packed side by side."""
  name = _FUSED_BY_MODULE.get(path[-1]) if path else None
  return {name: layers.FUSED[name]} if name else {}


def _with_panels(model):
  """`model.with_panels()` where the model (or draft provider) has it."""
  return model.with_panels() if hasattr(model, 'with_panels') else model


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: T5Config, rng: jax.Array) -> Any:
  tokens = jnp.ones((1, 1), jnp.int32)
  return Transformer(config).init(rng, tokens, tokens)['params']


def generate(model: T5Model, encoder_input_tokens: jax.Array, rng: jax.Array, *,
             max_decode_len: int, sampling: sampling_lib.SamplingParams | None = None,
             prompt: jax.Array | None = None, eos_id: int = 1,
             check_finite: bool = True) -> decoding.DecodeOutput:
  """Baseline decoding: one model call per token, compiled.

  Args:
    model: the model M_p.
    encoder_input_tokens: [B, S] int32, 0 = padding.
    rng: one PRNG key, or [B] keys (one stream per row), or an int seed in
      the int64 range.
    max_decode_len: static maximum number of output tokens per row.
    sampling: traced temperature/top-k/top-p; greedy when None.
    prompt: optional [B, P] int32 forced decoder tokens, 0-padded.
    eos_id: static end-of-sequence id.
    check_finite: static, on by default; stop rows whose logits are not
      finite and flag them in `nonfinite` (see decoding.DecodeOutput); False
      lets a non-finite logit decode silently as token V - 1.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len].

  Raises:
    ValueError: inputs or prompt of the wrong shape or type, token ids
      outside the vocabulary or an all-padding input row (when not traced),
      a bad max_decode_len.
  """
  encoder_input_tokens, prompt = api_checks.check_inputs(encoder_input_tokens, prompt,
                                                         model.vocab_size)
  options = decoding.LoopOptions(max_decode_len, eos_id=eos_id, check_finite=check_finite)
  return _decode(_with_panels(model), None, encoder_input_tokens, api_checks.check_rng(rng),
                 options, sampling=sampling, prompt=prompt)


def speculative_generate(target: T5Model, draft: T5Model | drafts.DraftProvider,
                         encoder_input_tokens: jax.Array, rng: jax.Array, *, gamma: int,
                         max_decode_len: int, sampling: sampling_lib.SamplingParams | None = None,
                         draft_sampling: sampling_lib.SamplingParams | None = None,
                         lenience: float = 1.0, verification: str = 'token',
                         confidence_threshold: float | None = None,
                         verify_lengths: tuple[int, ...] | None = None,
                         prompt: jax.Array | None = None, eos_id: int = 1,
                         check_finite: bool = True) -> decoding.DecodeOutput:
  """Speculative decoding of target M_p with draft M_q, compiled.

  Both start from the same inputs (they share the vocabulary).

  Args:
    target: the model M_p whose distribution is sampled.
    draft: the approximation M_q: a T5Model or a draft provider of
      spec_decode.drafts (anything with `start` and `vocab_size` that passes
      through jit as a pytree); same vocabulary size as the target.
    encoder_input_tokens: [B, S] int32, 0 = padding.
    rng: one PRNG key, or [B] keys (one stream per row), or an int seed in
      the int64 range.
    gamma: static number of drafted tokens per iteration.
    max_decode_len: static maximum number of output tokens per row.
    sampling: traced temperature/top-k/top-p of p; greedy when None.
    draft_sampling: traced knobs of q; None uses `sampling`'s. Any q keeps
      the output exact (`sampling.untruncated()`: no top-k/top-p work per
      draft step; see decoding.speculative_decode).
    lenience: traced l of Appendix A.5 in (0, 1]; 1 is exact.
    verification: static 'token' or 'block' (see speculative.accept_reject).
    confidence_threshold: None drafts gamma tokens; a traced number in [0, 1]
      drafts adaptively, at most gamma (see spec_decode.drafting).
    verify_lengths: static K values of the verify call (decoding.speculative_decode).
    prompt: optional [B, P] int32 forced decoder tokens, 0-padded.
    eos_id: static end-of-sequence id.
    check_finite: static, on by default; stop rows whose target or draft
      logits are not finite and flag them in `nonfinite` (see
      decoding.DecodeOutput); False lets a non-finite logit decode silently.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len].

  Raises:
    ValueError: as `generate`, and for a draft of another vocabulary size, a
      bad gamma, a lenience outside (0, 1], an unknown verification or a
      confidence_threshold outside [0, 1].
  """
  if target.vocab_size != draft.vocab_size:
    raise ValueError(
        f'draft vocab_size {draft.vocab_size} != target vocab_size {target.vocab_size}: '
        'speculative sampling needs a shared vocabulary')
  encoder_input_tokens, prompt = api_checks.check_inputs(encoder_input_tokens, prompt,
                                                         target.vocab_size)
  speculative.check_lenience(lenience)
  drafting.check_threshold(confidence_threshold)
  options = decoding.LoopOptions(max_decode_len, decoding.check_size('gamma', gamma),
                                 verification, verify_lengths, eos_id, check_finite)
  return _decode(_with_panels(target), _with_panels(draft), encoder_input_tokens,
                 api_checks.check_rng(rng), options,
                 sampling=sampling, draft_sampling=draft_sampling, lenience=lenience,
                 confidence_threshold=confidence_threshold, prompt=prompt)


def beam_generate(target: T5Model, encoder_input_tokens: jax.Array, *, beam_size: int,
                  max_decode_len: int, alpha: float = 0.6,
                  draft: 'T5Model | drafts.DraftProvider | None' = None, draft_width: int = 1,
                  gamma: int = 3, eos_id: int = 1,
                  check_finite: bool = True) -> beam_search.BeamOutput:
  """T5X's beam search of the target, compiled; with a draft, speculative.

  With a draft the beams and scores are the same (spec_decode.speculative_beam)
  and one target call covers 1 to gamma + 1 beam steps.

  Args:
    target: the model M_p whose beam search this is.
    encoder_input_tokens: [B, S] int32, 0 = padding.
    beam_size: static number of beams W (T5X's num_decodes).
    max_decode_len: static most tokens per sequence.
    alpha: traced brevity penalty exponent (T5X's beam_search alpha), a finite
      number in [0, 10]: past 10 the penalty ((5 + length) / 6) ** alpha
      rounds every score to 0 (api_checks.check_alpha).
    draft: None, or a draft model / provider with the target's vocabulary.
    draft_width: static paths the draft proposes from each live beam.
    gamma: static draft steps per target call.
    eos_id: static end-of-sequence id.
    check_finite: static, on by default; flag in `nonfinite` the rows for
      which the target returned non-finite logits (see
      beam_search.BeamOutput).

  Returns:
    beam_search.BeamOutput: tokens [B, W, max_decode_len], scores [B, W],
    ascending (T5X's order; `.best` is the last beam).

  Raises:
    ValueError: as `generate`, and for a bad beam_size, draft_width or gamma,
      beams beyond int32 (api_checks.check_beam_settings), an alpha outside
      [0, 10], or a draft of another vocabulary size.
  """
  encoder_input_tokens, _ = api_checks.check_inputs(encoder_input_tokens, None,
                                                    target.vocab_size)
  max_decode_len = decoding.check_size('max_decode_len', max_decode_len)
  api_checks.check_alpha(alpha, max_decode_len)
  batch = jnp.shape(encoder_input_tokens)[0]
  if draft is None:
    beam_size, _ = api_checks.check_beam_settings(beam_size, batch=batch,
                                                  vocab_size=target.vocab_size)
    return _beam_generate(_with_panels(target), None, encoder_input_tokens, alpha,
                          beam_size=beam_size, max_decode_len=max_decode_len, draft_width=1,
                          gamma=0, eos_id=eos_id, check_finite=check_finite)
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f'draft vocab_size {draft.vocab_size} != target vocab_size '
                     f'{target.vocab_size}: the draft proposes the target\'s tokens')
  beam_size, draft_width = api_checks.check_beam_settings(
      beam_size, batch=batch, vocab_size=target.vocab_size, draft_width=draft_width)
  return _beam_generate(_with_panels(target), _with_panels(draft), encoder_input_tokens, alpha,
                        beam_size=beam_size, max_decode_len=max_decode_len,
                        draft_width=draft_width,
                        gamma=decoding.check_size('gamma', gamma), eos_id=eos_id,
                        check_finite=check_finite)


def decode(target: T5Model, draft: 'T5Model | drafts.DraftProvider | None',
           encoder_input_tokens: jax.Array, rng: jax.Array, options: decoding.LoopOptions, *,
           sampling: sampling_lib.SamplingParams | None = None,
           draft_sampling: sampling_lib.SamplingParams | None = None,
           lenience: float | jax.Array = 1.0,
           confidence_threshold: float | jax.Array | None = None,
           prompt: jax.Array | None = None) -> decoding.DecodeOutput:
  """Either loop over T5 models by one LoopOptions, traced in the caller's jit.

  What `generate` and `speculative_generate` compile (after checking their
  arguments), and what `spec_decode.sharding` compiles over a mesh: the
  models start from the inputs, then `decoding.decode_loop` runs.

  Args:
    target: the model M_p.
    draft: the draft M_q (a T5Model or a draft provider), or None for the
      baseline; options.gamma is 0 exactly then.
    encoder_input_tokens: [B, S] int32, 0 = padding.
    rng: [B] PRNG keys or one key.
    options: the static options.
    sampling, draft_sampling, lenience, confidence_threshold, prompt: the
      traced arguments of `speculative_generate`.

  Returns:
    decoding.DecodeOutput, tokens [B, options.max_decode_len].
  """
  capacity = decoding.cache_length(options.max_decode_len, options.gamma)
  target_step_fn, target_cache = target.start(encoder_input_tokens, capacity)
  draft_step_fn, draft_cache = (None, None) if draft is None else draft.start(
      encoder_input_tokens, capacity)
  return decoding.decode_loop(target_step_fn, target_cache, draft_step_fn, draft_cache, options,
                              rng=rng, sampling=sampling, draft_sampling=draft_sampling,
                              lenience=lenience, confidence_threshold=confidence_threshold,
                              prompt=prompt)


_decode = jax.jit(decode, static_argnums=4)


@functools.partial(jax.jit, static_argnames=('beam_size', 'max_decode_len', 'draft_width', 'gamma',
                                             'eos_id', 'check_finite'))
def _beam_generate(target, draft, encoder_input_tokens, alpha, *, beam_size, max_decode_len,
                   draft_width, gamma, eos_id, check_finite):
  capacity = decoding.cache_length(max_decode_len, gamma)
  target_step_fn, target_cache = target.start(encoder_input_tokens, capacity)
  if draft is None:
    return beam_search.beam_search(target_step_fn, target_cache, beam_size=beam_size,
                                   max_decode_len=max_decode_len, alpha=alpha, eos_id=eos_id,
                                   check_finite=check_finite)
  draft_step_fn, draft_cache = draft.start(encoder_input_tokens, capacity)
  return speculative_beam.speculative_beam_search(
      target_step_fn, target_cache, draft_step_fn, draft_cache, beam_size=beam_size,
      draft_width=draft_width, gamma=gamma, max_decode_len=max_decode_len, alpha=alpha,
      eos_id=eos_id, check_finite=check_finite)


# A draft provider over a T5Model, part of this module's interface (defined after it).
from spec_decode.pruned_head import PRUNED_LOGIT, PrunedHeadDraft  # noqa: E402,F401 (re-exported)
