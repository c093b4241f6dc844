"""The front ends: one generate, speculative_generate and beam_generate for every model.

Each checks its arguments once (spec_decode.checks), builds the static
`LoopOptions` and the traced `Knobs` (spec_decode.options), wraps the inputs in
a `Batch` the target reads, and runs one compiled program: the models start
from the batch (an encoder pass, or a prefill of the prompts), then a loop of
spec_decode.decoding or spec_decode.beam_search runs. A target that carries a
mesh (spec_decode.models.sharding) is compiled with its in/out shardings; the
program is the same.

  out = speculative_generate(target, draft, inputs, jax.random.key(0), gamma=4,
                             max_decode_len=128)             # T5: encoder inputs
  out = speculative_generate(target, draft, prompts, jax.random.key(0),
                             lengths=lengths, gamma=4, max_decode_len=128)  # decoder-only

Static (recompile when changed): gamma, max_decode_len, verification,
verify_lengths, eos_id, check_finite, the shapes, None or not for a
confidence_threshold. Traced: the parameters, inputs, PRNG keys and knobs.
"""

import functools
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from spec_decode import beam_search
from spec_decode import checks
from spec_decode import decoding
from spec_decode import sampling as sampling_lib
from spec_decode import speculative_beam
from spec_decode.models import llama
from spec_decode.models import protocol
from spec_decode.models import sharding
from spec_decode.options import Knobs, LoopOptions


def generate(model: protocol.Model, inputs: jax.Array, rng: jax.Array, *, max_decode_len: int,
             lengths: jax.Array | None = None, prompt: jax.Array | None = None,
             sampling: sampling_lib.SamplingParams | None = None, eos_id: int | None = None,
             check_finite: bool = True) -> decoding.DecodeOutput:
  """Baseline decoding: one model call per token, compiled.

  Args:
    model: the model M_p (spec_decode.models.protocol.Model).
    inputs: [B, S] int32: an encoder-decoder's input (0 = padding), or a
      decoder-only model's prompts, left-aligned.
    rng: one PRNG key, or [B] keys (one stream per row), or an int seed in
      the int64 range.
    max_decode_len: static maximum number of output tokens per row.
    lengths: [B] int32 prompt lengths of a decoder-only model; None: every
      row S long (an encoder-decoder takes none).
    prompt: [B, P] int32 forced decoder tokens of an encoder-decoder,
      0-padded; they are part of the output.
    sampling: traced temperature/top-k/top-p; greedy when None.
    eos_id: static id that ends a row, -1 for none; None: the model's own
      (T5: 1; Llama: its config's).
    check_finite: static, on by default; stop rows whose logits are not
      finite and flag them in `nonfinite` (see decoding.DecodeOutput); False
      lets a non-finite logit decode silently as token V - 1.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len] (for a decoder-only
    model the generated tokens alone).

  Raises:
    ValueError: inputs, lengths or prompt of the wrong shape, type or range
      (ids outside the vocabulary, an all-padding input row), a bad
      max_decode_len or eos_id; the message names it.
  """
  batch = make_batch(model, inputs, lengths, prompt)
  options = LoopOptions(max_decode_len, eos_id=_eos_id(model, eos_id),
                        check_finite=check_finite)
  return run(_with_panels(model), None, batch, checks.check_rng(rng), options,
              Knobs.create(sampling))


def speculative_generate(target: protocol.Model, draft: protocol.Model, inputs: jax.Array,
                         rng: jax.Array, *, gamma: int, max_decode_len: int,
                         lengths: jax.Array | None = None, prompt: jax.Array | None = None,
                         sampling: sampling_lib.SamplingParams | None = None,
                         draft_sampling: sampling_lib.SamplingParams | None = None,
                         lenience: float = 1.0, verification: str = 'token',
                         confidence_threshold: float | None = None,
                         verify_lengths: tuple[int, ...] | None = None,
                         eos_id: int | None = None, check_finite: bool = True,
                         allow_tokenizer_mismatch: bool = False) -> decoding.DecodeOutput:
  """Speculative decoding of target M_p with draft M_q, compiled.

  Both start from the same inputs and share the vocabulary.

  Args:
    target: the model M_p whose distribution is sampled.
    draft: the approximation M_q: a model of the target's family, or a draft
      of spec_decode.models.drafts / pruned_head; same vocabulary size.
    inputs, rng, max_decode_len, lengths, prompt, sampling, eos_id,
      check_finite: as `generate`.
    gamma: static number of drafted tokens per iteration.
    draft_sampling: traced knobs of q; None uses `sampling`'s. Any q keeps
      the output exact (`sampling.untruncated()`: no top-k/top-p work per
      draft step).
    lenience: traced l of Appendix A.5 in (0, 1]; 1 is exact.
    verification: static 'token' or 'block' (see speculative.accept_reject).
    confidence_threshold: None drafts gamma tokens; a traced number in [0, 1]
      drafts adaptively, at most gamma (see spec_decode.draft_phase).
    verify_lengths: static K values of the verify call (decoding.speculative_decode).
    allow_tokenizer_mismatch: decode even if the checkpoints' tokenizer
      files differ (models that carry their fingerprints, e.g. Llama's).

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len].

  Raises:
    ValueError: as `generate`, and for a draft of another vocabulary size,
      family, mesh or tokenizer, a bad gamma, a lenience outside (0, 1], an
      unknown verification or a confidence_threshold outside [0, 1].
  """
  _check_pair(target, draft, allow_tokenizer_mismatch)
  batch = make_batch(target, inputs, lengths, prompt)
  options = LoopOptions(max_decode_len, checks.check_size('gamma', gamma), verification,
                        verify_lengths, _eos_id(target, eos_id), check_finite)
  knobs = Knobs.create(sampling, draft_sampling, lenience, confidence_threshold)
  return run(_with_panels(target), _with_panels(draft), batch, checks.check_rng(rng), options,
              knobs)


def beam_generate(target: protocol.Model, inputs: jax.Array, *, beam_size: int,
                  max_decode_len: int, lengths: jax.Array | None = None, alpha: float = 0.6,
                  draft: protocol.Model | None = None, draft_width: int = 1, gamma: int = 3,
                  eos_id: int | None = None, check_finite: bool = True,
                  allow_tokenizer_mismatch: bool = False) -> beam_search.BeamOutput:
  """T5X's beam search of the target, compiled; with a draft, speculative.

  With a draft the beams and scores are the same (spec_decode.speculative_beam)
  and one target call covers 1 to gamma + 1 beam steps.

  Args:
    target: the model M_p whose beam search this is.
    inputs, lengths, eos_id, check_finite, allow_tokenizer_mismatch: as
      `speculative_generate`.
    beam_size: static number of beams W (T5X's num_decodes).
    max_decode_len: static most tokens per sequence.
    alpha: traced brevity penalty exponent (T5X's beam_search alpha), a finite
      number in [0, 10]: past 10 the penalty ((5 + length) / 6) ** alpha
      rounds every score to 0 (checks.check_alpha).
    draft: None, or a draft with the target's vocabulary.
    draft_width: static paths the draft proposes from each live beam.
    gamma: static draft steps per target call.

  Returns:
    beam_search.BeamOutput: tokens [B, W, max_decode_len], scores [B, W],
    ascending (T5X's order; `.best` is the last beam).

  Raises:
    ValueError: as `generate`, and for a bad beam_size, draft_width or gamma,
      beams beyond int32 (checks.check_beam_settings), an alpha outside
      [0, 10], or a draft that does not pair with the target.
  """
  batch = make_batch(target, inputs, lengths, None)
  max_decode_len = checks.check_size('max_decode_len', max_decode_len)
  checks.check_alpha(alpha, max_decode_len)
  if draft is not None:
    _check_pair(target, draft, allow_tokenizer_mismatch)
  beam_size, draft_width = checks.check_beam_settings(
      beam_size, batch=batch.size, vocab_size=target.vocab_size,
      draft_width=None if draft is None else draft_width)
  return _beam(_with_panels(target), None if draft is None else _with_panels(draft), batch,
               alpha, beam_size=beam_size, max_decode_len=max_decode_len,
               draft_width=draft_width or 1,
               gamma=0 if draft is None else checks.check_size('gamma', gamma),
               eos_id=_eos_id(target, eos_id), check_finite=check_finite)


def decode(target: protocol.Model, draft: protocol.Model | None, batch: protocol.Batch,
           rng: jax.Array, options: LoopOptions, knobs: Knobs) -> decoding.DecodeOutput:
  """Either loop by its options, traced in the caller's jit: what the front ends compile.

  Args:
    target: the model M_p.
    draft: the draft M_q, or None for the baseline; options.gamma is 0
      exactly then.
    batch: the inputs (checked).
    rng: [B] PRNG keys or one key.
    options: the static options.
    knobs: the traced knobs.

  Returns:
    decoding.DecodeOutput, tokens [B, options.max_decode_len].
  """
  capacity = decoding.cache_length(options.max_decode_len, options.gamma)
  feed = None
  if hasattr(draft, 'start_pair'):  # a draft over the target's features starts with it
    (target_step_fn, target_cache), (draft_step_fn, draft_cache), feed = draft.start_pair(
        target, batch, capacity)
  else:
    target_step_fn, target_cache = target.start(batch, capacity)
    draft_step_fn, draft_cache = (None, None) if draft is None else draft.start(batch, capacity)
  return decoding.decode_loop(target_step_fn, target_cache, draft_step_fn, draft_cache, options,
                              knobs, rng=rng, prompt=batch.prompt, feed=feed)


def run(target: protocol.Model, draft: protocol.Model | None, batch: protocol.Batch,
        rng: jax.Array, options: LoopOptions, knobs: Knobs) -> decoding.DecodeOutput:
  """`decode` compiled: over the target's mesh with its shardings if it has one.

  For callers that hold checked arguments already (the command line, the
  measurement harness); the front ends above check theirs, then call it.
  """
  if getattr(target, 'mesh', None) is None:
    return _decode(target, draft, batch, rng, options, knobs)
  replicated = NamedSharding(target.mesh, PartitionSpec())
  batch_shardings, rng_sharding = sharding.input_shardings(target, batch, rng)
  # A draft without a mesh of its own (an n-gram table, prompt lookup, a small model) is
  # replicated on every device of the target's.
  draft_shardings = (None if draft is None
                     else draft.shardings() if hasattr(draft, 'shardings') else replicated)
  # in_shardings name the traced arguments only: options (static) has none.
  in_shardings = (target.shardings(), draft_shardings, batch_shardings, rng_sharding, replicated)
  jitted = jax.jit(decode, static_argnums=4, in_shardings=in_shardings,
                   out_shardings=sharding.output_shardings(target, batch.size, options))
  return jitted(target, draft, batch, rng, options, knobs)


_decode = jax.jit(decode, static_argnums=4)


@functools.partial(jax.jit, static_argnames=('beam_size', 'max_decode_len', 'draft_width', 'gamma',
                                             'eos_id', 'check_finite'))
def _beam(target, draft, batch, alpha, *, beam_size, max_decode_len, draft_width, gamma, eos_id,
          check_finite):
  capacity = decoding.cache_length(max_decode_len, gamma)
  target_step_fn, target_cache = target.start(batch, capacity)
  common = dict(beam_size=beam_size, max_decode_len=max_decode_len, alpha=alpha, eos_id=eos_id,
                check_finite=check_finite)
  if draft is None:
    return beam_search.beam_search(target_step_fn, target_cache, **common)
  draft_step_fn, draft_cache = draft.start(batch, capacity)
  return speculative_beam.speculative_beam_search(
      target_step_fn, target_cache, draft_step_fn, draft_cache, draft_width=draft_width,
      gamma=gamma, **common)


def make_batch(model: protocol.Model, inputs: Any, lengths: Any = None,
               prompt: Any = None) -> protocol.Batch:
  """The checked `Batch` of `inputs` as `model` reads them.

  Raises:
    ValueError: lengths for an encoder-decoder, a prompt for a decoder-only
      model, or inputs the model cannot take (checks.check_inputs /
      checks.check_prompts name the problem).
  """
  reads = getattr(model, 'reads', None)
  if reads not in protocol.READS:
    raise TypeError(f'{type(model).__name__} is not a model of the front ends (it has no '
                    '`reads`): a target is a T5Model, DecoderOnlyModel or LlamaModel')
  if reads == protocol.ENCODER_INPUT:
    if lengths is not None:
      raise ValueError('lengths are prompt lengths of a decoder-only model; an encoder-decoder '
                       'reads its inputs whole (0 = padding)')
    inputs, prompt = checks.check_inputs(inputs, prompt, model.vocab_size)
    return protocol.Batch(inputs, None, prompt, reads)
  if prompt is not None:
    raise ValueError('prompt (forced decoder tokens) is for an encoder-decoder; a decoder-only '
                     "model's prompt is its inputs")
  min_length = 1 if reads == protocol.PROMPT else 0
  inputs, lengths = checks.check_prompts(inputs, lengths, model.vocab_size, min_length)
  return protocol.Batch(inputs, lengths, None, reads)


def _eos_id(model, eos_id) -> int:
  return checks.check_eos(model.eos_id if eos_id is None else eos_id, model.vocab_size)


def _check_pair(target, draft, allow_tokenizer_mismatch: bool) -> None:
  checks.check_pair(target, draft)
  if not allow_tokenizer_mismatch:
    llama.check_tokenizers(target, draft)


def _with_panels(model):
  """`model.with_panels()` where the model has it (packed CPU-kernel weights), else itself."""
  return model.with_panels() if hasattr(model, 'with_panels') else model
