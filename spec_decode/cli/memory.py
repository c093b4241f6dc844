"""What a decoding run needs in memory, checked against what there is before compiling.

A MAX_DECODE_LEN or BATCH_SIZE far too large for the machine would otherwise
fail after compiling with an out-of-memory message that names no setting, or
grow until the system kills the process. `estimate` counts the buffers the
run must hold, a lower bound (activations come on top): both models'
parameters, the packed copies of their weights where the CPU kernels use them,
their encoder outputs and KV caches, and the decoded tokens.
`check` compares it with the available memory: the device's
`memory_stats()['bytes_limit']` on an accelerator, MemAvailable of
/proc/meminfo on a CPU host.
"""

import math

import jax
import jax.numpy as jnp

from spec_decode.checkpoints import param_trees
from spec_decode.cli.gin_utils import ConfigError
from spec_decode import loop_utils
from spec_decode.llama import LlamaConfig
from spec_decode.llama import hf as llama_hf
from spec_decode import models
from spec_decode.t5.config import T5Config
from spec_decode.t5.decoder_only import DecoderOnlyConfig

GB = 10**9


def cache_rows(*, batch_size: int, decode: str, beam_size: int, draft_width: int,
         speculate: bool) -> int:
  """Cache rows: B, B * W with beam search, B * W * m with speculative beam search."""
  if decode != 'beam':
    return batch_size
  return batch_size * beam_size * (draft_width if speculate else 1)


def estimate(configs: dict[str, T5Config | DecoderOnlyConfig | LlamaConfig], *, rows: int,
             input_len: int, max_decode_len: int, gamma: int,
             panels: bool = False) -> dict[str, int]:
  """Bytes of the buffers a run holds, by kind.

  Args:
    configs: the models ('target', and 'draft' when speculative).
    rows: cache rows R (see `cache_rows`).
    input_len: S, encoder positions (the longest input), or a decoder-only
      model's prompt positions (then no encoder output).
    max_decode_len: most tokens generated per input.
    gamma: draft tokens per target call (0 without a draft).
    panels: whether the CPU kernels are in use (`kernels.in_use()`): then an
      encoder-decoder T5 model computing in float32 also holds its Dense
      kernels packed (`models.T5Model.with_panels`), counted at bfloat16's 2
      bytes per weight (float32 panels, where bfloat16 does not hold the
      weights, take twice that).

  Returns:
    {'parameters', 'encoder outputs', 'KV caches', 'tokens'}, and 'panels'
    with `panels`: bytes. A
    model's parameters are in its param_dtype (a Llama model's: its dtype;
    its KV caches have num_key_value_heads heads); its encoder output [R, S, E],
    cross-attention keys and values [R, H, S, Dh] per decoder layer and
    self-attention keys and values [R, H, C, Dh] per decoder layer
    (C = cache_length(max_decode_len, gamma)) in its compute dtype; the
    tokens int32 [R, max_decode_len + gamma + 2].
  """
  capacity = loop_utils.cache_length(max_decode_len, gamma)
  parts = {'parameters': 0, 'encoder outputs': 0, 'KV caches': 0}
  for config in configs.values():
    if isinstance(config, LlamaConfig):  # Hkv heads per layer, one dtype for everything
      shapes, param_dtype = llama_hf.expected_shapes(config), config.dtype
      layers, heads = config.num_hidden_layers, config.num_key_value_heads
    else:
      shapes, param_dtype = param_trees.expected_shapes(config), config.param_dtype
      layers, heads = config.num_decoder_layers, config.num_heads
    weights = sum(math.prod(shape) for shape in shapes.values())
    parts['parameters'] += weights * jnp.dtype(param_dtype).itemsize
    if panels and isinstance(config, T5Config) and jnp.dtype(config.dtype) == jnp.float32:
      parts['panels'] = parts.get('panels', 0) + 2 * sum(
          math.prod(shape) for path, shape in shapes.items()
          if models.t5.is_dense_kernel(tuple(path.split('/'))))
    item = jnp.dtype(config.dtype).itemsize
    if isinstance(config, T5Config):  # a decoder-only model's prompt is in its KV cache
      parts['encoder outputs'] += rows * input_len * config.emb_dim * item
    per_position = 2 * layers * rows * heads * config.head_dim * item
    parts['KV caches'] += per_position * (input_len + capacity)
  parts['tokens'] = rows * (max_decode_len + gamma + 2) * 4
  return parts


def available_bytes() -> tuple[int, str] | None:
  """(bytes, where from) of the memory a run may use on the default device; None if unknown."""
  device = jax.devices()[0]
  if device.platform != 'cpu':
    stats = device.memory_stats() or {}
    if 'bytes_limit' in stats:
      return int(stats['bytes_limit']), f'the {device.device_kind} memory limit'
    return None
  try:
    with open('/proc/meminfo', encoding='ascii') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024, 'MemAvailable in /proc/meminfo'
  except OSError:
    pass
  return None


def check(parts: dict[str, int], limit_gb: float | None) -> None:
  """Raises ConfigError naming MAX_DECODE_LEN and BATCH_SIZE when `parts` exceed the memory.

  Args:
    parts: `estimate`'s bytes.
    limit_gb: the memory in GB (10**9 bytes) to check against; None reads it
      (`available_bytes`), and skips the check where it is unknown.
  """
  if limit_gb is None:
    found = available_bytes()
    if found is None:
      return
    limit, source = found
  else:
    limit, source = int(limit_gb * GB), 'MEMORY_LIMIT_GB'
  needed = sum(parts.values())
  if needed <= limit:
    return
  largest = ', '.join(f'{name} {size / GB:.3g} GB'
                      for name, size in sorted(parts.items(), key=lambda p: -p[1]))
  raise ConfigError(
      f'MAX_DECODE_LEN and BATCH_SIZE (with BEAM_SIZE, GAMMA, the models and the longest input) '
      f'need at least {needed / GB:.3g} GB ({largest}) but {source} is {limit / GB:.3g} GB: '
      'lower MAX_DECODE_LEN or BATCH_SIZE, or bind the memory to assume, in GB: '
      '--gin.MEMORY_LIMIT_GB=N')
