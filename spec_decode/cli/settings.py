"""What each setting of `infer.infer` must be, checked before anything loads.

gin passes whatever a binding says, so every setting's type and range is
checked here, and the vocabulary against the models' embedding size; each
failure is a ConfigError naming the setting and its gin macro.
"""

import math
import numbers
from typing import Any

from etils import epath

from spec_decode import checks
from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode.cli.gin_utils import ConfigError
from spec_decode import kernels
from spec_decode.llama import LlamaConfig
from spec_decode.llama import hf as llama_hf
from spec_decode.t5.config import T5Config
from spec_decode.t5.decoder_only import DecoderOnlyConfig
from spec_decode.text import EOS_ID

# T5X pads embeddings to a multiple of this many ids (T5's 32100 -> 32128).
VOCAB_PADDING = 128

INT32_MAX = checks.INT32_MAX  # token ids, positions, counts and top_k are int32 on the device
# jax.random.key keeps a seed's low 32 bits (without jax_enable_x64): larger seeds repeat smaller.
SEED_MAX = 2**32 - 1

# The models the command line decodes: encoder-decoder, T5X decoder-only, Llama.
CONFIGS = (T5Config, DecoderOnlyConfig, LlamaConfig)
# What each setting of `infer` must be: gin passes whatever a binding says.
_INTEGER, _NUMBER = 'an integer', 'a number'
_SETTINGS = {
    'target_config': (CONFIGS, 'a T5Config, a DecoderOnlyConfig or a LlamaConfig'),
    'draft_config': (CONFIGS + (type(None),),
                     'a T5Config, a DecoderOnlyConfig, a LlamaConfig or None'),
    'target_checkpoint': (str, 'a string'), 'draft_checkpoint': ((str, type(None)),
                                                                 'a string or None'),
    'input_file': (str, 'a string'), 'output_file': (str, 'a string'),
    'input_prefix': (str, 'a string'), 'verification': (str, 'a string'),
    'decode': (str, 'a string'),
    'confidence_threshold': ((numbers.Real, type(None)), 'a number or None'),
    'memory_limit_gb': ((numbers.Real, type(None)), 'a number or None'),
    'verify_lengths': ((list, tuple, type(None)), 'a list of integers or None'),
    'truncate_inputs': (bool, 'True or False'), 'check_finite': (bool, 'True or False'),
    'allow_vocabulary_mismatch': (bool, 'True or False'),
    **{name: (numbers.Integral, _INTEGER) for name in (
        'gamma', 'top_k', 'max_input_len', 'max_decode_len', 'batch_size', 'seed',
        'model_parallel', 'beam_size', 'draft_width')},
    **{name: (numbers.Real, _NUMBER) for name in ('temperature', 'top_p', 'lenience',
                                                   'beam_alpha')},
    'draft_temperature': ((numbers.Real, type(None)), 'a number or None'),
    'draft_top_k': ((numbers.Integral, type(None)), 'an integer or None'),
    'draft_top_p': ((numbers.Real, type(None)), 'a number or None'),
    'eos_id': ((numbers.Integral, type(None)), 'an integer or None'),
    'coordinator_address': ((str, type(None)), 'a string or None'),
    'num_processes': (numbers.Integral, _INTEGER), 'process_id': (numbers.Integral, _INTEGER),
    'process_timeout_s': (numbers.Real, _NUMBER), 'heartbeat_timeout_s': (numbers.Real, _NUMBER),
}


_INT32 = 'int32 on the device'
# Integer settings: (lowest, highest, why that range).
_RANGES = {
    **{name: (1, INT32_MAX, _INT32) for name in (
        'batch_size', 'max_input_len', 'max_decode_len', 'gamma', 'beam_size', 'draft_width')},
    'top_k': (0, INT32_MAX, f'0 disables; {_INT32}'),
    'model_parallel': (0, INT32_MAX, '0: one device'),
    'seed': (0, SEED_MAX, 'jax keys keep 32 bits of a seed: a larger one repeats a smaller one'),
    'num_processes': (1, 2**16, 'one per host'),
    'process_id': (0, 2**16 - 1, 'below NUM_PROCESSES'),
}


def check_settings(settings: dict[str, Any]) -> None:
  """Raises ConfigError naming the setting (and its gin macro) of a wrong value.

  The environment's SPEC_DECODE_CPU_KERNELS too: a value other than 0 or 1.
  """
  try:
    kernels.enabled()
  except ValueError as e:
    raise ConfigError(str(e)) from None
  for name, (types, wanted) in _SETTINGS.items():
    value = settings[name]
    numeric = wanted in (_INTEGER, _NUMBER)
    if isinstance(value, types) and not (numeric and isinstance(value, bool)):
      continue
    hint, gin_name = '', name.upper()
    if isinstance(value, str) and (numeric or wanted.startswith('a number')):
      hint = f': numbers take no quotes, --gin.{gin_name}={value}'
    elif wanted.startswith('a string') and not isinstance(value, str):
      hint = f': strings need quotes, --gin.{gin_name}="\'{value}\'"'
    raise ConfigError(f'{name} ({gin_name} in gin) must be {wanted}, got {value!r} '
                      f'({type(value).__name__}){hint}')
  for name, (low, high, why) in _RANGES.items():
    if not low <= settings[name] <= high:
      raise ConfigError(f'{name} ({name.upper()} in gin) must be an integer in {low}..{high} '
                        f'({why}), got {settings[name]!r}')
  draft_config = settings['draft_config']
  if draft_config is not None and type(draft_config) is not type(settings['target_config']):
    raise ConfigError(f'the target is a {type(settings["target_config"]).__name__} and the draft '
                      f'a {type(draft_config).__name__}: a pair is of one kind, encoder-decoder '
                      '(T5Config), T5X decoder-only (DecoderOnlyConfig) or Llama (LlamaConfig)')
  eos_id = settings['eos_id']
  if eos_id is not None and not -1 <= eos_id <= INT32_MAX:
    raise ConfigError(f'eos_id (EOS_ID in gin) must be None (the model\'s own), -1 (no EOS) or an '
                      f'id in 0..{INT32_MAX}, got {eos_id!r}')
  stop_id(settings)
  limit = settings['memory_limit_gb']
  if limit is not None and (isinstance(limit, bool) or not 0.0 < limit < math.inf):  # NaN too
    raise ConfigError(f'memory_limit_gb (MEMORY_LIMIT_GB in gin) must be None (the '
                      f'available memory) or a number of GB > 0, got {limit!r}')
  for name in ('process_timeout_s', 'heartbeat_timeout_s'):
    if not 1.0 <= settings[name] < math.inf:
      raise ConfigError(f'{name} ({name.upper()} in gin) must be a number of seconds >= 1, got '
                        f'{settings[name]!r}')
  if settings['process_id'] >= settings['num_processes']:
    raise ConfigError(f'process_id {settings["process_id"]} (PROCESS_ID in gin) must be below '
                      f'num_processes {settings["num_processes"]} (NUM_PROCESSES)')
  if not 0.0 < settings['lenience'] <= 1.0:
    raise ConfigError(f'lenience must be in (0, 1], got {settings["lenience"]}')
  threshold = settings['confidence_threshold']
  if threshold is not None and (isinstance(threshold, bool) or not 0.0 <= threshold <= 1.0):
    raise ConfigError(f'confidence_threshold (CONFIDENCE_THRESHOLD in gin) must be None or in '
                      f'[0, 1], got {threshold!r}')
  loop_options(settings, speculate=True)
  if settings['verify_lengths'] is not None and threshold is None:
    raise ConfigError('verify_lengths (VERIFY_LENGTHS in gin) only shortens the verify call of an '
                      'adaptive draft length: set CONFIDENCE_THRESHOLD too, or drop it')
  check_beam(decode=settings['decode'], beam_size=settings['beam_size'],
             beam_alpha=settings['beam_alpha'], draft_width=settings['draft_width'],
             batch_size=settings['batch_size'], vocab_size=settings['target_config'].vocab_size,
             speculate=settings['draft_config'] is not None)
  if settings['decode'] == 'beam':
    _check_beam_only(settings)


def check_vocabulary(vocabulary: Any, configs: dict[str, Any]) -> None:
  """Raises ConfigError unless the models embed exactly the vocabulary's ids (padded).

  The models' vocab_size must be the vocabulary's size, or that size padded up
  to a multiple of VOCAB_PADDING as T5X pads embeddings: a smaller vocabulary
  decodes ids it has no pieces for, a larger one feeds ids the models lack.
  A Llama pair's vocab_size need only hold the tokenizer's ids.
  """
  model_file = getattr(vocabulary, 'sentencepiece_model_file', None)
  if model_file is not None and not epath.Path(model_file).exists():
    raise ConfigError(f'vocabulary file not found: {model_file}')
  try:
    size = vocabulary.vocab_size
  except Exception as e:  # pylint: disable=broad-except; any loader error means a bad file
    raise ConfigError(f'vocabulary file {model_file}: not a SentencePiece model '
                      f'({type(e).__name__}: {str(e).splitlines()[0]})') from None
  sizes = {name: config.vocab_size for name, config in configs.items()}
  if len(set(sizes.values())) > 1:
    raise ConfigError(f'draft vocab_size {sizes["draft"]} != target vocab_size {sizes["target"]}: '
                      'speculative sampling needs a shared vocabulary')
  if isinstance(configs['target'], LlamaConfig):  # Hugging Face pads embeddings as it likes.
    if size > sizes['target']:
      raise ConfigError(f'the tokenizer ({getattr(vocabulary, "file", "VOCABULARY")}) has {size} '
                        f'ids but the models\' vocab_size is {sizes["target"]}: the wrong '
                        'tokenizer for these models?')
    return
  padded = -(-size // VOCAB_PADDING) * VOCAB_PADDING
  if not size <= sizes['target'] <= padded:
    expected = str(size) if padded == size else f'{size}..{padded}'
    raise ConfigError(
        f'the vocabulary ({model_file or type(vocabulary).__name__}) has {size} ids but the '
        f'models\' vocab_size is {sizes["target"]} (expected {expected}, the vocabulary padded '
        f'to a multiple of {VOCAB_PADDING}): the wrong vocabulary for these models?')


def check_recorded_vocabularies(vocabulary: Any, paths: dict[str, str | None],
                                configs: dict[str, Any], allow_mismatch: bool) -> None:
  """ConfigError when a checkpoint records another vocabulary than the run's (or the pair's)."""
  override = '--gin.ALLOW_VOCABULARY_MISMATCH=True'
  try:
    if getattr(vocabulary, 'sentencepiece_model_file', None) is not None:
      for name in configs:
        checkpoints.check_vocabulary(paths[name], vocabulary, allow_mismatch=allow_mismatch,
                                     override=override)
    if 'draft' in configs and isinstance(configs['target'], LlamaConfig):
      _check_tokenizer_pair(paths['target'], paths['draft'], allow_mismatch, override)
    elif 'draft' in configs:
      checkpoints.check_vocabulary_pair(paths['target'], paths['draft'],
                                        allow_mismatch=allow_mismatch, override=override)
  except (ValueError, FileNotFoundError) as e:
    raise ConfigError(str(e)) from None


def _check_tokenizer_pair(target: str, draft: str, allow_mismatch: bool, override: str) -> None:
  """ConfigError when two Hugging Face folders' tokenizer files (the same names) differ."""
  differ = llama_hf.differing_tokenizers(llama_hf.tokenizer_fingerprint(target),
                                         llama_hf.tokenizer_fingerprint(draft))
  if differ and not allow_mismatch:
    raise ConfigError(f'the target ({target}) and the draft ({draft}) have different '
                      f'{" and ".join(differ)} files: their ids may mean different text; if they '
                      f'share the vocabulary all the same, {override}')


# Settings decode='beam' does not use, with their neutral values.
_SAMPLING_ONLY = {'temperature': 0.0, 'top_k': 0, 'top_p': 1.0, 'lenience': 1.0,
                  'verification': 'token', 'confidence_threshold': None,
                  'verify_lengths': None, 'model_parallel': 0, 'draft_temperature': None,
                  'draft_top_k': None, 'draft_top_p': None}


def check_beam(*, decode: str, beam_size: int, beam_alpha: float, draft_width: int,
               batch_size: int, vocab_size: int, speculate: bool) -> None:
  """Raises ConfigError for a bad decode mode, BEAM_SIZE, BEAM_ALPHA or DRAFT_WIDTH.

  Args:
    decode: 'sample' or 'beam'.
    beam_size: beams W, >= 1.
    beam_alpha: brevity penalty exponent (checks.check_alpha).
    draft_width: paths m the draft proposes per beam, in 1..vocab_size.
    batch_size: inputs B decoded together; beam search steps B * W rows, a
      target call with a draft B * W * m: they must fit int32.
    vocab_size: the models' vocabulary size V.
    speculate: whether a draft proposes paths (draft_width counts).
  """
  if decode not in ('sample', 'beam'):
    raise ConfigError(f"decode (DECODE in gin) must be 'sample' or 'beam', got {decode!r}")
  try:
    checks.check_alpha(beam_alpha)
  except (TypeError, ValueError) as e:
    raise ConfigError(f'beam_alpha (BEAM_ALPHA in gin): {e}') from None
  if decode != 'beam':
    return
  try:
    checks.check_beam_settings(beam_size, batch=batch_size, vocab_size=vocab_size,
                                   draft_width=draft_width if speculate else None)
  except ValueError as e:
    raise ConfigError(f'{e} (BEAM_SIZE, DRAFT_WIDTH, BATCH_SIZE in gin)') from None


def stop_id(settings: dict[str, Any]) -> int:
  """The id that ends a row: EOS_ID, else the target's own (T5's 1; a Llama config's EOS).

  Raises:
    ConfigError: a Llama config that lists several EOS ids (the loops stop
      at one) and no EOS_ID.
  """
  config = settings['target_config']
  if settings['eos_id'] is not None:
    return settings['eos_id']
  if not isinstance(config, LlamaConfig):
    return EOS_ID
  if len(config.eos_token_ids) > 1:
    raise ConfigError(f'the target\'s config lists several EOS ids {list(config.eos_token_ids)} '
                      'and decoding stops at one: choose it with --gin.EOS_ID=N')
  return config.eos_token_ids[0] if config.eos_token_ids else -1


def loop_options(settings: dict[str, Any], *, speculate: bool) -> decoding.LoopOptions:
  """The decoding loop's static options from the settings (gamma 0 without a draft).

  Raises:
    ConfigError: MAX_DECODE_LEN, GAMMA, VERIFICATION or VERIFY_LENGTHS out of
      range (decoding.LoopOptions's checks, named by their gin settings).
  """
  try:
    return decoding.LoopOptions(
        settings['max_decode_len'], settings['gamma'] if speculate else 0,
        settings['verification'] if speculate else 'token',
        settings['verify_lengths'] if speculate else None, stop_id(settings),
        settings['check_finite'])
  except ValueError as e:
    raise ConfigError(f'{e} (MAX_DECODE_LEN, GAMMA, VERIFICATION, VERIFY_LENGTHS in gin)') from None


# Why the command line refuses DECODE='beam' over several processes.
BEAM_ONE_PROCESS = ("DECODE='beam' decodes in one process, on one device: the command line does "
                    'not run beam search over several processes (NUM_PROCESSES > 1); in Python, '
                    'beam_generate takes sharded models over a multi-process mesh')


def _check_beam_only(settings: dict[str, Any]) -> None:
  """Raises ConfigError for a setting DECODE='beam' would ignore, or several processes."""
  if settings['num_processes'] > 1 or settings['coordinator_address'] == 'auto':
    raise ConfigError(BEAM_ONE_PROCESS)
  for name, neutral in _SAMPLING_ONLY.items():
    if settings[name] != neutral:
      raise ConfigError(f"{name} ({name.upper()} in gin) does not apply to DECODE='beam' "
                        f'(beam search is deterministic and runs on one device): leave it at '
                        f'{neutral!r}, got {settings[name]!r}')
