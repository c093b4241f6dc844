"""Every check of the public API's arguments, shared by the library and the command line.

Each raises ValueError (TypeError for a value of the wrong kind) naming the
argument, the bad value and what is allowed, before anything is compiled: a
setting the loops would turn into garbage never reaches them. Traced values
pass the value checks (their shapes are still checked); `options.LoopOptions`
and `options.Knobs` run these once, where they are built.
"""

import math
import numbers
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

INT32_MAX = 2**31 - 1
# Beam search scores log P / ((5 + length) / 6) ** alpha (T5X's brevity
# penalty). Past alpha = 10 the penalty is astronomically large for any real
# output length and the scores shrink toward 0, where float32 stops telling
# them apart (at max_decode_len 100, alpha 100 gives a penalty of 1e124, every
# score 0.0 and the ranking lost); T5X's own values are 0.6-1.
MAX_ALPHA = 10.0
# The largest brevity penalty kept: a score log P / penalty then stays a
# normal float32 (>= 1e-38 in magnitude) for any log P down to -1e-8.
_MAX_PENALTY = 1e30
VERIFICATIONS = ('token', 'block')


def check_int(name: str, value: Any, minimum: int = 1, maximum: int = INT32_MAX) -> int:
  """`value` as an int in [minimum, maximum] (int32 by default), else ValueError naming `name`.

  Args:
    name: the argument's name, for the message.
    value: a Python or NumPy integer (not a bool).
    minimum: the smallest value allowed.
    maximum: the largest value allowed; the loops index in int32.

  Returns:
    int(value).
  """
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or not minimum <= value <= maximum):
    bound = ' (int32)' if maximum == INT32_MAX else ''
    raise ValueError(f'{name} must be an integer >= {minimum} and <= {maximum}{bound}, '
                     f'got {value!r}')
  return int(value)


def check_size(name: str, value: Any, minimum: int = 1) -> int:
  """`value` as an int in [minimum, int32 max], else ValueError naming `name`."""
  return check_int(name, value, minimum)


def check_eos(eos_id: Any, vocab_size: int | None = None) -> int:
  """An end-of-sequence id: -1 (no row stops at a token) or an id of the vocabulary.

  Raises:
    ValueError: not an integer, below -1, or (with `vocab_size`) at or past V:
      an id no row can produce would never stop a row.
  """
  maximum = INT32_MAX if vocab_size is None else vocab_size - 1
  if (isinstance(eos_id, bool) or not isinstance(eos_id, numbers.Integral)
      or not -1 <= eos_id <= maximum):
    within = f' (the vocabulary is [0, {vocab_size}))' if vocab_size is not None else ''
    raise ValueError(f'eos_id must be -1 (no end token) or a token id in 0..{maximum}{within}, '
                     f'got {eos_id!r}')
  return int(eos_id)


def check_verification(verification: str) -> str:
  """Returns verification if it names a rule ('token' or 'block'); raises ValueError otherwise."""
  if verification not in VERIFICATIONS:
    raise ValueError(f'verification must be one of {VERIFICATIONS}, got {verification!r}')
  return verification


def _scalar_in(name: str, value: Any, low: float, high: float, low_open: bool, hint: str) -> None:
  """Raises ValueError unless `value` is a real scalar in the range (a traced one passes)."""
  if isinstance(value, jax.core.Tracer):
    return
  array = np.asarray(value)
  if (array.shape or array.dtype == bool or not np.issubdtype(array.dtype, np.number)
      or not (low < array <= high if low_open else low <= array <= high)):
    raise ValueError(f'{name} must be {hint}, got {value!r}')


def check_lenience(lenience: Any) -> None:
  """Raises ValueError unless lenience is a scalar in (0, 1]; a traced one passes unchecked."""
  _scalar_in('lenience', lenience, 0, 1, True, 'a number in (0, 1]')


def check_threshold(confidence_threshold: Any) -> None:
  """Raises ValueError unless the threshold is None or a number in [0, 1] (traced passes)."""
  if confidence_threshold is not None:
    _scalar_in('confidence_threshold', confidence_threshold, 0, 1, False,
               'None or a number in [0, 1]')


def check_verify_lengths(verify_lengths: Sequence[int] | None,
                         gamma: int) -> tuple[int, ...] | None:
  """Validates the static verify lengths K.

  Args:
    verify_lengths: None, or K values each an int in 2..gamma + 1.
    gamma: the most drafts per iteration.

  Returns:
    None, or the sorted K values with gamma + 1 added.

  Raises:
    ValueError: verify_lengths that is not a sequence (e.g. a bare int), or
      a K that is not an int in 2..gamma + 1.
  """
  if verify_lengths is None:
    return None
  if isinstance(verify_lengths, (str, bytes)) or not isinstance(verify_lengths, Iterable):
    raise ValueError(f'verify_lengths must be None or a sequence of integers in 2..gamma + 1 = '
                     f'{gamma + 1} (e.g. ({gamma + 1},)), got {verify_lengths!r}')
  lengths = tuple(verify_lengths)
  if not all(isinstance(k, int) and not isinstance(k, bool) and 2 <= k <= gamma + 1
             for k in lengths):
    raise ValueError(f'verify_lengths must be integers in 2..gamma + 1 = {gamma + 1}, '
                     f'got {verify_lengths!r}')
  return tuple(sorted(set(lengths) | {gamma + 1}))


def check_alpha(alpha: Any, max_decode_len: int | None = None) -> Any:
  """Returns the brevity penalty exponent if beam search can rank with it.

  alpha must be a finite number in [0, MAX_ALPHA]: a negative one favours
  short outputs so strongly that beams stop at once (empty outputs, scores
  -1e7), a NaN or an infinity makes every score garbage, and one above
  MAX_ALPHA makes the penalty ((5 + length) / 6) ** alpha so large that the
  scores round to 0 and lose their order. With `max_decode_len` the penalty
  at that length must also stay below 1e30 in float32. A traced alpha passes
  unchecked.

  Args:
    alpha: a Python or NumPy real scalar, or a traced value.
    max_decode_len: optional static output length bound.

  Returns:
    alpha, unchanged.

  Raises:
    TypeError: alpha is not a real number (a string, a bool, an array).
    ValueError: alpha outside [0, MAX_ALPHA], or a penalty that overflows.
  """
  if isinstance(alpha, jax.core.Tracer):
    return alpha
  value = np.asarray(alpha)
  if (isinstance(alpha, bool) or value.shape or value.dtype == bool
      or not np.issubdtype(value.dtype, np.number) or np.iscomplexobj(value)):
    raise TypeError(f'alpha must be a real number in [0, {MAX_ALPHA:g}], got {alpha!r}')
  if not 0 <= float(value) <= MAX_ALPHA:  # NaN fails too
    raise ValueError(f'alpha must be a finite number in [0, {MAX_ALPHA:g}] (the brevity penalty '
                     f'exponent; T5X uses 0.6), got {alpha!r}')
  if max_decode_len is not None:
    log_penalty = float(value) * math.log((5.0 + max_decode_len + 1) / 6.0)
    if log_penalty > math.log(_MAX_PENALTY):
      raise ValueError(
          f'alpha={alpha!r} with max_decode_len={max_decode_len} makes the brevity penalty '
          f'((5 + length) / 6) ** alpha exceed {_MAX_PENALTY:g}: the scores would round to 0 '
          'and lose their order; use a smaller alpha')
  return alpha


def check_beam_settings(beam_size: Any, *, batch: int | None = None,
                        vocab_size: int | None = None,
                        draft_width: Any = None) -> tuple[int, int | None]:
  """Returns (beam_size, draft_width) as ints if beam search can index them in int32.

  Args:
    beam_size: W, an integer >= 1.
    batch: optional batch size B: B * W (times draft_width) rows must fit int32.
    vocab_size: optional V: W * V candidates per row must fit int32, and
      draft_width must lie in 1..V.
    draft_width: optional m, the paths a draft proposes from each live beam,
      an integer >= 1 (at most V).

  Returns:
    (W, m), m None when not given.

  Raises:
    ValueError: a setting that is not an integer in its range, or whose
      products overflow int32; the message names it.
  """
  beam_size = check_int('beam_size', beam_size)
  if draft_width is not None:
    draft_width = check_int('draft_width', draft_width,
                            maximum=INT32_MAX if vocab_size is None else vocab_size)
  paths = beam_size * (draft_width or 1)
  if batch is not None and batch * paths > INT32_MAX:
    raise ValueError(f'beam_size={beam_size}' + (f' * draft_width={draft_width}' if draft_width
                                                 else '') +
                     f' * batch={batch} = {batch * paths} rows exceed int32 ({INT32_MAX})')
  if vocab_size is not None and beam_size * vocab_size > INT32_MAX:
    raise ValueError(f'beam_size={beam_size} * vocab_size={vocab_size} = '
                     f'{beam_size * vocab_size} candidates per row exceed int32 ({INT32_MAX})')
  return beam_size, draft_width


def as_array(name: str, value: Any) -> Any:
  """An array as is; a list or tuple (e.g. of token ids) as a NumPy array.

  Args:
    name: the argument's name, for the message.
    value: a JAX or NumPy array (or a traced value), or nested sequences.

  Returns:
    value, or np.asarray(value) for a sequence; its dtype is the caller's to check.

  Raises:
    TypeError: neither an array nor a sequence.
    ValueError: ragged sequences (rows of different lengths).
  """
  if hasattr(value, 'shape') and hasattr(value, 'dtype'):
    return value
  if not isinstance(value, (list, tuple)):
    raise TypeError(f'{name} must be an array (or a list of rows) of integer token ids, got '
                    f'{type(value).__name__}')
  try:
    return np.asarray(value)
  except ValueError as e:
    raise ValueError(f'{name} must be rectangular, every row of one length: pad the rows with '
                     f'0, got ragged rows ({e})') from None


def check_rng(rng: Any) -> jax.Array:
  """A PRNG key, [B] keys or raw uint32 key data, or an int seed, as a JAX array.

  Args:
    rng: `jax.random.key(...)` (one or [B]), raw key data, or a Python/NumPy
      integer seed in the int64 range (jax.random.key's).

  Returns:
    rng, or `jax.random.key(seed)` for a seed.

  Raises:
    TypeError: rng is neither a key array nor an integer.
    ValueError: a seed outside [-2**63, 2**63).
  """
  if isinstance(rng, bool):
    raise TypeError(f'rng must be a PRNG key (jax.random.key(seed)) or an int seed, got {rng!r}')
  if isinstance(rng, numbers.Integral):
    if not -2**63 <= rng < 2**63:
      raise ValueError(f'rng seed {rng} is outside the 64-bit range [-2**63, 2**63) that '
                       'jax.random.key takes')
    return jax.random.key(int(rng))
  if not hasattr(rng, 'dtype') or not (jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
                                       or rng.dtype == np.uint32):
    raise TypeError('rng must be a PRNG key (jax.random.key(seed)), [B] keys, raw uint32 key '
                    f'data or an int seed, got {type(rng).__name__} '
                    f'{getattr(rng, "dtype", "")}'.rstrip())
  return rng


def check_inputs(encoder_input_tokens: jax.Array, prompt: jax.Array | None,
                 vocab_size: int) -> tuple[jax.Array, jax.Array | None]:
  """Raises ValueError for encoder inputs or a prompt the models cannot take.

  Shapes and dtypes are always checked; token ids only when the arrays are
  concrete (not traced): in [0, vocab_size), at least one non-padding id
  in every encoder input row, and in a prompt 0 only as padding after a
  row's tokens.

  Args:
    encoder_input_tokens: [B, S] integer ids, 0 = padding.
    prompt: None or [B, P] integer ids, left-aligned, 0-padded.
    vocab_size: the models' vocabulary size.

  Returns:
    (encoder_input_tokens, prompt) as arrays: a list (or tuple) of rows
    becomes a NumPy array, an array is returned as is.
  """
  encoder_input_tokens = as_array('encoder_input_tokens', encoder_input_tokens)
  arrays = {('encoder_input_tokens', 'S'): encoder_input_tokens}
  if prompt is not None:
    prompt = as_array('prompt', prompt)
    arrays['prompt', 'P'] = prompt
  for (name, length), array in arrays.items():
    shape, dtype = jnp.shape(array), jnp.result_type(array)
    empty = len(shape) == 2 and not shape[1] and name != 'prompt'
    if len(shape) != 2 or empty or not jnp.issubdtype(dtype, jnp.integer):
      minimum = '' if name == 'prompt' else f' with {length} >= 1'
      raise ValueError(f'{name} must be integer token ids [B, {length}]{minimum}, got {dtype} '
                       f'{shape}')
    if isinstance(array, jax.core.Tracer) or not array.size:
      continue
    for first_row, ids in _host_rows(array):
      if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f'{name} holds ids {ids.min()}..{ids.max()}, outside the vocabulary '
                         f'[0, {vocab_size})')
      empty_rows = np.nonzero(~np.any(ids != 0, axis=1))[0] if name != 'prompt' else []
      if len(empty_rows):
        raise ValueError(f'encoder_input_tokens row {first_row + empty_rows[0]} is all padding '
                         '(every id 0): the encoder sees nothing and the row decodes junk; each '
                         'row needs at least one token (drop or fill the row)')
      if name == 'prompt':
        present = ids != 0
        rows = np.nonzero(np.any(present[:, 1:] & ~present[:, :-1], axis=1))[0]
        if rows.size:
          raise ValueError(f'prompt row {first_row + rows[0]} holds 0 before a token: 0 is '
                           'padding, allowed only after a row\'s last token')
  return encoder_input_tokens, prompt


def check_prompts(prompt_tokens: Any, lengths: Any, vocab_size: int,
                  min_length: int = 1) -> tuple[jax.Array, jax.Array | None]:
  """Raises ValueError for prompts a decoder-only model cannot take; returns them as arrays.

  Shapes and dtypes are always checked; token ids (in [0, V)) and lengths
  (in min_length..P) only when concrete.

  Args:
    prompt_tokens: [B, P] integer ids (or a list of equal rows); P >= min_length.
    lengths: None (every row P long), or [B] integers.
    vocab_size: V.
    min_length: the shortest prompt the models take (0 or 1).
  """
  prompt_tokens = as_array('prompt_tokens', prompt_tokens)
  shape, dtype = jnp.shape(prompt_tokens), jnp.result_type(prompt_tokens)
  if len(shape) != 2 or shape[1] < min_length or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f'prompt_tokens must be integer token ids [B, P] with P >= {min_length}, '
                     f'got {dtype} {shape}')
  if lengths is not None:
    lengths = as_array('lengths', lengths)
    if jnp.shape(lengths) != shape[:1] or not jnp.issubdtype(jnp.result_type(lengths),
                                                              jnp.integer):
      raise ValueError(f'lengths must be [B={shape[0]}] integers, got '
                       f'{jnp.result_type(lengths)} {jnp.shape(lengths)}')
  concrete = lambda x: x is not None and not isinstance(x, jax.core.Tracer)
  if concrete(prompt_tokens) and prompt_tokens.size:
    for first_row, ids in _host_rows(prompt_tokens):
      width = np.arange(shape[1])[None] < (
          shape[1] if lengths is None or not concrete(lengths)
          else np.asarray(lengths)[first_row:first_row + len(ids), None])
      bad = width & ((ids < 0) | (ids >= vocab_size))
      if bad.any():
        row, column = np.argwhere(bad)[0]
        raise ValueError(f'prompt_tokens[{first_row + row}, {column}] = {ids[row, column]} is '
                         f'outside the vocabulary [0, {vocab_size})')
  if concrete(lengths):
    for _, values in _host_rows(lengths):
      if values.size and (values.min() < min_length or values.max() > shape[1]):
        raise ValueError(f'lengths must lie in {min_length}..P={shape[1]}, got '
                         f'{values.min()}..{values.max()}')
  return prompt_tokens, lengths


def check_pair(target: Any, draft: Any) -> None:
  """Raises ValueError unless the draft proposes the target's tokens from the same inputs.

  Both must have one vocabulary size (the loops compare p and q token by
  token); a draft that is a model (it has `reads`) must read the inputs as
  the target does (an encoder input, or a prompt with or without a start
  token of its own), and live on the target's mesh where either has one.
  """
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f'draft vocab_size {draft.vocab_size} != target vocab_size '
                     f'{target.vocab_size}: speculative sampling needs a shared vocabulary')
  if hasattr(draft, 'reads') and draft.reads != target.reads:
    raise ValueError(f'the target reads its inputs as {target.reads}, the draft as {draft.reads}: '
                     'pair models of one family')
  meshes = getattr(target, 'mesh', None), getattr(draft, 'mesh', None)
  if any(m is not None for m in meshes) and hasattr(draft, 'mesh') and meshes[0] != meshes[1]:
    raise ValueError(f'the draft is on {meshes[1]}, the target on {meshes[0]}: one mesh')


def _host_rows(array: Any) -> list[tuple[int, np.ndarray]]:
  """(first row, values) of the rows of a [B, L] array this host can read.

  The whole array, or for an array spread over several hosts
  (spec_decode.multihost) each of its local shards: every host checks its own.
  """
  if getattr(array, 'is_fully_addressable', True):
    return [(0, np.asarray(array))]
  return [(shard.index[0].start or 0, np.asarray(shard.data)) for shard in array.addressable_shards]
