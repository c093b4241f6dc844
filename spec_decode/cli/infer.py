r"""Decodes a text file with a target model, sped up by a draft model if given.

The command line is T5X's: gin files and `--gin.NAME=VALUE` bindings.

  python scripts/decode.py --gin_file=runs/t5_1_1_xxl_small.gin \
      --gin.TEMPERATURE=0.5 < inputs.txt > outputs.jsonl

`--gin_file` is looked up in the working directory, then in `--gin_search_path`
folders, then in this repository's gin/ folder (so `runs/decode.gin` works, and
so do `include` lines inside gin files). Values are gin expressions: strings
need quotes, `--gin.TARGET_CHECKPOINT="'/ckpt/xxl'"`.

`infer` takes plain arguments; gin binds them only in `main`. It reads one
example per line (LF, CRLF or CR), plain text or a JSON object with an "inputs"
field (a blank line is an error: spec_decode.cli.jsonl), tokenizes it with EOS
appended as T5 does, decodes in batches of `batch_size` (the last one padded by
repeating its last example) with one compiled function, and writes one JSON
record per example, in order:

  line                    the example's line number in the input file
  inputs                  its text (any other JSON fields are copied too)
  output                  the decoded text
  output_ids              the generated token ids, EOS included if emitted
  generated_tokens        len(output_ids)
  target_calls            target model calls while the example was decoding
  draft_calls             draft model calls (0 without a draft)
  tokens_per_target_call  generated_tokens / target_calls (eq. (1) measured)
  batch                   index of the example's batch
  batch_walltime_s        seconds the batch took to decode
  batch_accept_histogram  how often 0..gamma drafts were accepted in the batch
                          (padding rows included); [target calls] without a
                          draft

With DECODE = 'beam' (T5X's beam search, speculative with a draft) `output`,
`output_ids` are the best beam's, and the record also holds
  score                   its score, log P / ((5 + length) / 6) ** BEAM_ALPHA
  beams                   every beam, best first: {output, output_ids, score}
  beam_steps              beam search steps of the batch
while target_calls and draft_calls count the batch's calls (all its rows step
together) and batch_accept_histogram is left out.

Progress and a summary (compile time apart from decode time) go to stderr.

Every setting, the vocabulary, the inputs and the output path are checked
before any model is loaded; a bad one is an `error: ...` line naming it and
exit status 1. Records go to `<OUTPUT_FILE>.incomplete`, renamed to
OUTPUT_FILE once the last one is written (spec_decode.cli.jsonl): a failed run
(exit 1; NaN or infinite logits are a failure with CHECK_FINITE, the default)
or an interrupted one (SIGINT or SIGTERM: exit 130 or 143) leaves no
OUTPUT_FILE and says on stderr what the `.incomplete` file holds.
"""

import functools
import sys
import time
import traceback
from typing import Any, Sequence

import jax
import numpy as np
import tqdm

from spec_decode import beam_search
from spec_decode import checkpoints
from spec_decode.cli import devices
from spec_decode.cli import gin_utils
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.cli import jsonl
from spec_decode.cli import memory
from spec_decode.cli import processes
from spec_decode.cli.jsonl import Example, read_examples
from spec_decode.cli import settings as infer_settings
from spec_decode import decoding
from spec_decode import kernels
from spec_decode import multihost
from spec_decode import sampling as sampling_lib
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.options import Knobs
from spec_decode.t5.config import T5Config


def infer(*, target_config: T5Config, target_checkpoint: str, vocabulary: Any,
          draft_config: T5Config | None = None, draft_checkpoint: str | None = None,
          input_file: str = '-', output_file: str = '-', input_prefix: str = '',
          gamma: int = 4, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
          lenience: float = 1.0, verification: str = 'token',
          confidence_threshold: float | None = None,
          verify_lengths: Sequence[int] | None = None, max_input_len: int = 512,
          truncate_inputs: bool = False,
          max_decode_len: int = 128, batch_size: int = 8, seed: int = 0,
          model_parallel: int = 0, check_finite: bool = True, decode: str = 'sample',
          beam_size: int = 4, beam_alpha: float = 0.6, draft_width: int = 4,
          draft_temperature: float | None = None, draft_top_k: int | None = None,
          draft_top_p: float | None = None, memory_limit_gb: float | None = None,
          allow_vocabulary_mismatch: bool = False, coordinator_address: str | None = None,
          num_processes: int = 1, process_id: int = 0, process_timeout_s: float = 300.0,
          heartbeat_timeout_s: float = 100.0, eos_id: int | None = None) -> dict[str, Any]:
  """Decodes every line of `input_file` and writes JSONL to `output_file`.

  Parameters are loaded in each config's `param_dtype`. The settings, the
  vocabulary, the checkpoints' presence, the inputs and the output path are
  all checked before any model is loaded.

  Args:
    target_config: the target model M_p: a T5Config; or a decoder-only
      model's, a DecoderOnlyConfig or a LlamaConfig
      (spec_decode.llama, e.g. LlamaConfig.from_hf(folder)), whose inputs
      are prompts it continues (no EOS appended; `output` is the
      continuation).
    target_checkpoint: its T5X, Hugging Face or orbax checkpoint (a Llama
      model's: a Hugging Face folder).
    vocabulary: a seqio.Vocabulary (encode, decode, vocab_size) shared by both
      models, e.g. seqio.SentencePieceVocabulary; the models' vocab_size is
      its size, or that size padded up to a multiple of
      infer_settings.VOCAB_PADDING. A Llama pair's: the target folder's
      tokenizer (spec_decode.llama.tokenizer.Tokenizer), no larger than
      vocab_size.
    draft_config: the draft model M_q; None decodes with the target alone.
    draft_checkpoint: its checkpoint; given exactly when draft_config is.
    input_file: text or JSONL path, '-' for stdin.
    output_file: JSONL path, '-' for stdout. Records go to
      `<output_file>.incomplete`, renamed to output_file once all are in.
    input_prefix: prepended to every input, e.g. 'translate English to German: '.
    gamma: draft tokens per target call.
    temperature: 0 decodes greedily.
    top_k: keep the k most likely tokens; 0 disables.
    top_p: nucleus mass; 1 disables.
    lenience: l of Appendix A.5 in (0, 1]; 1 samples exactly from the target.
    verification: 'token' (Algorithm 1) or 'block' (Sun et al. 2025: the
      drafted block judged jointly; also exact, accepts at least as many).
    confidence_threshold: None drafts gamma tokens per target call; a number
      in [0, 1] makes gamma a maximum: a row stops drafting after a token its
      draft gave probability below it (spec_decode.draft_phase; exact).
    verify_lengths: None verifies gamma + 1 positions per target call; else
      static K values: each call covers the smallest K that holds its drafts
      (faster on CPUs with confidence_threshold; each K compiles the target).
    max_input_len: longest input in tokens, EOS included.
    truncate_inputs: cut longer inputs to max_input_len (EOS kept) instead of
      raising ConfigError.
    max_decode_len: most tokens generated per input.
    batch_size: inputs decoded together.
    seed: example i is sampled with key fold_in(key(seed), i), whatever the
      batch size.
    model_parallel: 0 decodes on one device. n >= 1 lays both models over all
      devices as a (devices / n, n) mesh (spec_decode.models.sharding): the target's
      parameters split n ways (STANDARD_RULES), the draft's replicated
      (DATA_PARALLEL_RULES), batch rows split over the data axis.
    check_finite: fail when a model returns a NaN or +inf logit, or a
      position whose logits are all -inf, instead of writing what such logits
      decode to (-inf alone is a mask and passes).
    decode: 'sample' (greedy or sampling, with the knobs above) or 'beam':
      T5X's beam search of the target (spec_decode.beam_search), speculative
      with a draft (spec_decode.speculative_beam: the same beams).
    beam_size: beams W of decode='beam' (T5X's num_decodes).
    beam_alpha: brevity penalty exponent of decode='beam' (T5X's alpha).
    draft_width: decode='beam' with a draft: paths drafted from each live
      beam (its m most likely next tokens, each continued greedily to gamma
      tokens); one target call covers W * draft_width paths.
    draft_temperature, draft_top_k, draft_top_p: the knobs that turn the
      draft's logits into q, each None for the target's (the output follows
      p exactly for any q: e.g. draft_top_k=0, draft_top_p=1.0 spare the
      draft its truncation work; spec_decode.speculative_generate's draft_sampling).
    memory_limit_gb: the memory the run may use, in GB; None: the device's
      limit (an accelerator) or MemAvailable (a CPU host). A run whose buffers
      (spec_decode.cli.memory: parameters, encoder outputs, KV caches) exceed
      it fails before compiling; set it higher to skip the check.
    allow_vocabulary_mismatch: decode even when a checkpoint records another
      vocabulary than `vocabulary` (`checkpoints.check_vocabulary`: our
      checkpoints carry the sha256 of theirs; T5X's and Hugging Face's do not,
      and are not checked).
    coordinator_address: None decodes in this process alone (unless the
      environment sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
      JAX_PROCESS_ID); 'host:port' of process 0 joins `num_processes`
      processes, one per host, over one mesh (model_parallel >= 1; see
      spec_decode.cli.devices); 'auto' lets JAX find them (a Cloud TPU pod
      slice). Process 0 writes the output; the others write nothing.
    num_processes: processes in the run.
    process_id: this process, in [0, num_processes).
    process_timeout_s: how long the processes wait for each other to arrive.
    heartbeat_timeout_s: a process silent this long (dead) ends the others
      with an error naming it.
    eos_id: the id that ends a row; None: the target's own (T5's 1, a Llama
      config.json's eos_token_id; one that lists several needs eos_id); -1:
      none does.

  Returns:
    The summary printed to stderr, as a dict.

  Raises:
    ConfigError: a bad setting, a missing file, mismatched vocabularies, a bad
      input line, an unwritable output, a failed write or non-finite logits.
    gin_utils.Interrupted: SIGINT or SIGTERM (under `main`).
  """
  speculate = draft_config is not None or draft_checkpoint is not None
  if speculate and (draft_config is None or draft_checkpoint is None):
    raise ConfigError('a draft needs both draft_config and draft_checkpoint')
  settings = dict(locals())
  try:  # Every check that needs no device; a failure stops the other processes too.
    infer_settings.check_settings(settings)
    configs, paths, examples = _check_files(settings)
  except ConfigError as e:
    processes.stop_others(settings, e.message)
    raise
  # Before anything starts JAX's backend; the processes agree on settings and inputs.
  processes.join(settings, fingerprint=processes.fingerprint(settings, vocabulary, examples))
  try:
    sampling = sampling_lib.SamplingParams.create(temperature, top_k, top_p)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  draft_knobs = (draft_temperature, draft_top_k, draft_top_p)
  try:
    draft_sampling = None if draft_knobs == (None, None, None) else (
        sampling_lib.SamplingParams.create(*(t if d is None else d for d, t in zip(
            draft_knobs, (temperature, top_k, top_p)))))
  except ValueError as e:
    raise ConfigError(f'the draft\'s knobs (DRAFT_TEMPERATURE, DRAFT_TOP_K, DRAFT_TOP_P in gin): '
                      f'{e}') from None
  if not model_parallel:  # A mesh splits the buffers over its devices.
    rows = memory.cache_rows(batch_size=batch_size, decode=decode, beam_size=beam_size,
                             draft_width=draft_width, speculate=speculate)
    needed = memory.estimate(configs, rows=rows, input_len=max(len(e.tokens) for e in examples),
                             max_decode_len=max_decode_len, gamma=gamma if speculate else 0,
                             panels=kernels.in_use())
    memory.check(needed, memory_limit_gb)
  if decode == 'beam':
    options = dict(beam_size=beam_size, alpha=beam_alpha, draft_width=draft_width, gamma=gamma,
                   max_decode_len=max_decode_len, check_finite=check_finite,
                   eos_id=infer_settings.stop_id(settings))
  else:
    options = dict(loop=infer_settings.loop_options(settings, speculate=speculate))
  try:
    knobs = (Knobs.create(sampling, draft_sampling, lenience, confidence_threshold) if speculate
             else Knobs.create(sampling))
  except ValueError as e:
    raise ConfigError(str(e)) from None
  output = (jsonl.Output(output_file, input_file) if devices.is_writer()
            else jsonl.Discard(jax.process_index()))
  processes.writing(output, len(examples))
  with jsonl.writing(output, len(examples)) as out:
    summary = _run(out, examples, configs, paths, vocabulary, knobs, options, beam=decode == 'beam', batch_size=batch_size, seed=seed,
                   model_parallel=model_parallel)
  if devices.is_writer():
    _print_summary(summary, speculate and decode == 'sample', gamma)
  return summary


def _check_files(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any],
                                                     list[Example]]:
  """(configs, checkpoint paths, examples): the vocabulary, checkpoints and inputs checked."""
  speculate, vocabulary = settings['speculate'], settings['vocabulary']
  configs = {'target': settings['target_config'],
             **({'draft': settings['draft_config']} if speculate else {})}
  infer_settings.check_vocabulary(vocabulary, configs)
  paths = {'target': settings['target_checkpoint'], 'draft': settings['draft_checkpoint']}
  for name in configs:  # Fail before reading inputs or loading the other model.
    try:
      checkpoints.checkpoint_format(paths[name])
    except FileNotFoundError as e:
      raise ConfigError(f'{name} checkpoint: {e}') from None
  infer_settings.check_recorded_vocabularies(vocabulary, paths, configs,
                                             settings['allow_vocabulary_mismatch'])
  examples = read_examples(settings['input_file'], vocabulary,
                           input_prefix=settings['input_prefix'],
                           max_input_len=settings['max_input_len'],
                           truncate=settings['truncate_inputs'],
                           output_fields=jsonl.OUTPUT_FIELDS + (
                               jsonl.BEAM_FIELDS if settings['decode'] == 'beam' else ()),
                           eos=isinstance(settings['target_config'], T5Config))
  return configs, paths, examples


def _run(out: jsonl.Output, examples: list[Example], configs: dict[str, Any],
         paths: dict[str, str | None], vocabulary: Any,
         knobs: Knobs, options: dict[str, Any], *, beam: bool, batch_size: int, seed: int,
         model_parallel: int) -> dict[str, Any]:
  """Loads the models, compiles, decodes every batch into `out`; returns the summary.

  `options` are the static keyword arguments of `_beam_decode` (beam) or
  `_decode`.
  """
  mesh = devices.make_mesh(model_parallel, batch_size) if model_parallel else None
  target, draft = (devices.load(name, configs.get(name), paths[name], mesh)
                   for name in ('target', 'draft'))

  input_len = max(len(e.tokens) for e in examples)  # the longest input, not max_input_len
  batches = list(devices.batches(examples, batch_size, input_len, jax.random.key(seed), mesh))
  decode = jax.jit(functools.partial(_beam_decode if beam else _decode, **options))
  start = time.perf_counter()
  decode = decode.lower(target, draft, *batches[0][1:], knobs).compile()
  compile_s = time.perf_counter() - start

  decode_s, generated, target_calls, histogram, drafted = 0.0, 0, 0, 0, 0
  with tqdm.tqdm(total=len(examples), unit='ex', file=sys.stderr, desc='decoding',
                 disable=not devices.is_writer()) as bar:
    for index, (rows, tokens, lengths, rng) in enumerate(batches):
      start = time.perf_counter()
      result = multihost.gather(decode(target, draft, tokens, lengths, rng, knobs))
      walltime = time.perf_counter() - start
      bad = None if result.nonfinite is None else result.nonfinite[:len(rows)]
      if bad is not None and bad.any():
        lines = [e.line for e, nonfinite in zip(rows, bad) if nonfinite]
        raise ConfigError(
            f'input line(s) {", ".join(map(str, lines))}: a model returned NaN or infinite '
            'logits (a checkpoint holding NaN/inf, or a compute dtype that overflows)')
      records = []
      for b, example in enumerate(rows):
        if beam:
          record = _beam_record(example, result, b, vocabulary, options['eos_id'])
          record.update(batch=index, batch_walltime_s=round(walltime, 6))
        else:
          record = _record(example, result, b, vocabulary)
          record.update(batch=index, batch_walltime_s=round(walltime, 6),
                        batch_accept_histogram=result.accept_histogram.tolist())
        records.append(record)
        generated += record['generated_tokens']
        target_calls += record['target_calls']
      out.write(records)
      decode_s += walltime
      if not beam:
        histogram = histogram + result.accept_histogram
        drafted = drafted + result.draft_histogram
      bar.update(len(rows))

  return dict(
      examples=len(examples), batches=len(batches), batch_size=batch_size,
      compile_s=compile_s, decode_s=decode_s, examples_per_s=len(examples) / decode_s,
      generated_tokens=generated, tokens_per_s=generated / decode_s,
      tokens_per_target_call=generated / max(target_calls, 1),
      accept_histogram=np.asarray(histogram).tolist(), draft_histogram=np.asarray(drafted).tolist())


def _decode(target: Any, draft: Any, tokens: jax.Array, lengths: jax.Array, rng: jax.Array,
            knobs: Knobs, *, loop: decoding.LoopOptions) -> decoding.DecodeOutput:
  """Baseline decoding without a draft, speculative decoding with one.

  A decoder-only pair continues the inputs as prompts of `lengths` [B]
  tokens; a T5 pair reads its padding from the 0s of `tokens`.
  """
  return front_ends.run(target, draft, protocol.Batch.of(target, tokens, lengths), rng, loop, knobs)


def _record(example: Example, result: decoding.DecodeOutput, b: int,
            vocabulary: Any) -> dict[str, Any]:
  """The output fields of row b of a batch's DecodeOutput (on the host)."""
  ids = result.tokens[b, :result.lengths[b]].tolist()
  generated, target_calls = int(result.generated[b]), int(result.target_calls[b])
  return {'line': example.line, **example.fields, 'output': vocabulary.decode(ids),
          'output_ids': ids, 'generated_tokens': generated, 'target_calls': target_calls,
          'draft_calls': int(result.draft_calls[b]),
          'tokens_per_target_call': generated / max(target_calls, 1)}


def _beam_decode(target: Any, draft: Any, tokens: jax.Array, lengths: jax.Array, rng: jax.Array,
                 knobs: Knobs, **options: Any) -> beam_search.BeamOutput:
  """Beam search (speculative with a draft); rng and the sampling knobs are unused."""
  del rng, knobs
  batch = protocol.Batch.of(target, tokens, lengths)
  return front_ends.beam_generate(target, batch.tokens, lengths=batch.lengths, draft=draft,
                                    **options)


def _beam_record(example: Example, result: beam_search.BeamOutput, b: int, vocabulary: Any,
                 eos_id: int) -> dict[str, Any]:
  """The output fields of row b of a batch's BeamOutput: the best beam, then all."""
  beams = []
  for tokens, score in zip(result.tokens[b][::-1], result.scores[b][::-1]):  # best first
    eos = np.flatnonzero(tokens == eos_id)
    ids = tokens[:eos[0] + 1 if eos.size else int(result.steps)].tolist()
    beams.append({'output': vocabulary.decode(ids), 'output_ids': ids, 'score': float(score)})
  calls = int(result.target_calls)
  return {'line': example.line, **example.fields, **beams[0], 'beams': beams,
          'generated_tokens': len(beams[0]['output_ids']), 'target_calls': calls,
          'draft_calls': int(result.draft_calls), 'beam_steps': int(result.steps),
          'tokens_per_target_call': len(beams[0]['output_ids']) / max(calls, 1)}


def _print_summary(summary: dict[str, Any], speculate: bool, gamma: int) -> None:
  lines = [
      '{examples} examples in {batches} batches of {batch_size}: compile {compile_s:.2f} s, '
      'decode {decode_s:.2f} s'.format(**summary),
      '{examples_per_s:.2f} examples/s, {tokens_per_s:.1f} tokens/s, '
      '{tokens_per_target_call:.3f} tokens per target call'.format(**summary),
  ]
  if speculate:
    lines.append(f'accepted drafts 0..{gamma} (iterations): {summary["accept_histogram"]}')
    lines.append(f'drafts proposed 0..{gamma} (iterations): {summary["draft_histogram"]}')
  print('\n'.join(lines), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
  """Parses T5X-style flags (without the program name) and runs `infer`."""
  try:
    status = gin_utils.run(infer, argv, prog='decode.py', description=__doc__.splitlines()[0],
                           example='--gin_file=runs/decode.gin --gin.GAMMA=5 --gin.TEMPERATURE=0.5',
                           on_error=processes.failed)
  except BaseException as e:  # its traceback follows; the other processes, if any, end too
    processes.failed(f'{type(e).__name__}: {e}')
    if multihost.joined():
      traceback.print_exc()
      processes.leave(1)
    raise
  return processes.leave(status)
