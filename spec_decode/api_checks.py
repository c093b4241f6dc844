"""Checks of the public API's settings, shared by the library and the command line.

Each raises ValueError (TypeError for a value of the wrong kind) naming the
setting, the bad value and what is allowed, before anything is compiled: a
setting the loops would turn into garbage never reaches them.
"""

import math
import numbers
from typing import Any

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


def _host_rows(array: Any) -> list[tuple[int, np.ndarray]]:
  """(first row, values) of the rows of a [B, L] array this host can read.

  The whole array, or for an array spread over several hosts
  (spec_decode.multihost) each of its local shards: every host checks its own.
  """
  if getattr(array, 'is_fully_addressable', True):
    return [(0, np.asarray(array))]
  return [(shard.index[0].start or 0, np.asarray(shard.data)) for shard in array.addressable_shards]
