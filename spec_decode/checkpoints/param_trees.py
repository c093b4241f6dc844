"""Parameter trees: flat names, casting, and the check against a T5Config.

Our parameter tree is T5X's minimal T5 (spec_decode.t5.network) as nested dicts
of arrays; flat names join the keys with '/', e.g. 'encoder/encoder_norm/scale'.
Every checkpoint reader and writer (`spec_decode.checkpoints`,
`spec_decode.checkpoints.hf`) goes through these.
"""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from spec_decode.t5.config import T5Config
from spec_decode.t5.decoder_only import DecoderOnlyConfig, DecoderOnlyTransformer
from spec_decode.t5.network import Transformer

Params = dict[str, Any]  # Nested dicts of arrays, our T5X layout.


def cast(x, dtype) -> np.ndarray:
  """Any array -> numpy, cast to `dtype` (a name or dtype) unless None."""
  x = np.asarray(x)
  return x if dtype is None else x.astype(jnp.dtype(dtype), copy=False)


def flatten(tree: dict) -> dict[str, Any]:
  """Nested dicts -> {'a/b/c': leaf}; tensorstore spec dicts are leaves."""
  return traverse_util.flatten_dict(tree, sep='/', is_leaf=lambda _, node: 'driver' in node)


def unflatten(flat: dict[str, Any]) -> Params:
  return traverse_util.unflatten_dict(flat, sep='/')


@functools.cache
def expected_shapes(config: T5Config | DecoderOnlyConfig) -> dict[str, tuple[int, ...]]:
  """The network's own parameter names and shapes, e.g. 'encoder/encoder_norm/scale': (E,).

  A DecoderOnlyConfig gives those of T5X's decoder-only layout.
  """
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  if isinstance(config, DecoderOnlyConfig):
    shapes = jax.eval_shape(DecoderOnlyTransformer(config).init, jax.random.key(0), tokens)
  else:
    shapes = jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens, tokens)
  return {name: x.shape for name, x in flatten(shapes['params']).items()}


def _vocab_arrays(config: T5Config | DecoderOnlyConfig) -> tuple[tuple[str, int], ...]:
  """(name, vocabulary axis) of the embedding and the output layer."""
  embedding = ('decoder/token_embedder/embedding' if isinstance(config, DecoderOnlyConfig)
               else 'token_embedder/embedding')
  return (embedding, 0), ('decoder/logits_dense/kernel', 1)


def check_params(params: Params, config: T5Config, source: str = 'checkpoint',
                 describe: Callable[[str], str] = lambda name: name) -> None:
  """Raises ValueError naming every array of `params` that does not fit `config`.

  Args:
    params: a parameter tree; its leaves need only a `shape`.
    config: the T5Config it should fit.
    source: the checkpoint path, for the message.
    describe: our array name -> its name in the message (e.g. with the HF name).
  """
  expected = expected_shapes(config)
  found = {name: np.shape(x) for name, x in flatten(params).items()}
  problems, vocab_mismatch = [], set()
  for name, axis in _vocab_arrays(config):
    shape = found.get(name)
    if shape is not None and len(shape) == 2 and shape[axis] != config.vocab_size:
      vocab_mismatch.add(name)
      problems.append(f'vocab size mismatch: {describe(name)} {shape} has vocab '
                      f'{shape[axis]}, config.vocab_size is {config.vocab_size}')
  problems += [f'missing array {describe(n)}, expected shape {expected[n]}'
               for n in expected if n not in found]
  problems += [f'unexpected array {describe(n)} {found[n]}' for n in found if n not in expected]
  problems += [f'shape mismatch for {describe(n)}: expected {expected[n]} (from the config), '
               f'found {found[n]}' for n in expected
               if n in found and found[n] != expected[n] and n not in vocab_mismatch]
  if problems:
    raise ValueError(f'{source} does not fit the config:\n  ' + '\n  '.join(problems))
