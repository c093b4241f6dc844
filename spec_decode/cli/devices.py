"""Where a run's models and batches lie: one device, a mesh, or a mesh over several hosts.

With MODEL_PARALLEL >= 1 the models lie over a (devices / n, n) mesh of every
device (spec_decode.models.sharding). With NUM_PROCESSES > 1 that mesh spans one
process per host (spec_decode.multihost; joined by spec_decode.cli.processes):
every host runs the same command with its own PROCESS_ID, reads and checks
the whole input file, feeds its devices only the rows they hold, and receives
every row's output; process 0 writes the output file.
"""

import functools
from typing import Any, Iterator

import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode import multihost
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.cli.jsonl import Example
from spec_decode.llama import LlamaConfig
from spec_decode.models import DecoderOnlyModel, LlamaModel, T5Model
from spec_decode.models import sharding
from spec_decode.t5.config import T5Config
from spec_decode.t5.decoder_only import DecoderOnlyConfig

def is_writer() -> bool:
  """Whether this process writes the output: process 0 (the only one on one host)."""
  return jax.process_index() == 0


def make_mesh(model_parallel: int, batch_size: int) -> jax.sharding.Mesh:
  """The (data, model) mesh over all devices; ConfigError if it or the batch does not split."""
  try:
    mesh = sharding.make_mesh(model_parallel)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  replicas = mesh.shape[sharding.DATA]
  if batch_size % replicas:
    raise ConfigError(f'batch_size {batch_size} does not split over the {replicas} model '
                      f'replicas of model_parallel={model_parallel}')
  return mesh


def load(name: str, config: T5Config | DecoderOnlyConfig | LlamaConfig | None, path: str | None,
         mesh: jax.sharding.Mesh | None) -> Any:
  """The model from its checkpoint, in config.param_dtype, on the device (or mesh).

  A DecoderOnlyConfig gives a decoder-only model, a LlamaConfig a Llama
  model from a Hugging Face folder, each over a mesh by
  spec_decode.models.sharding.
  """
  if config is None:
    return None
  try:
    if mesh is not None:
      rules = sharding.STANDARD_RULES if name == 'target' else sharding.DATA_PARALLEL_RULES
      return sharding.load_model(path, config, mesh, rules)
    if isinstance(config, LlamaConfig):
      return LlamaModel.load(path, config=config)
    if isinstance(config, DecoderOnlyConfig):
      return DecoderOnlyModel.load(path, config)
    params = checkpoints.load_params(path, config)
  except ValueError as e:  # Arrays that do not fit the config.
    raise ConfigError(f'{name}: {e}') from None
  return T5Model(config, jax.device_put(params))


def batches(examples: list[Example], batch_size: int, input_len: int, rng: jax.Array,
            mesh: jax.sharding.Mesh | None) -> Iterator[tuple[list[Example], Any, Any, Any]]:
  """Yields (examples, tokens [B, input_len] 0-padded, lengths [B], keys [B]) per batch.

  lengths are the inputs' token counts (a decoder-only model's prompt
  lengths: its tokenizer's 0 may be a real token, as Llama's is).

  The last batch is padded by repeating its last example. Example i is
  sampled with key fold_in(rng, i), whatever the batch size or process count.
  Over a mesh, tokens, lengths and raw key data ([B, 2] uint32) are global
  arrays split by row (STANDARD_RULES), each host holding its rows.
  """
  for start in range(0, len(examples), batch_size):
    rows = examples[start:start + batch_size]
    padded = rows + rows[-1:] * (batch_size - len(rows))
    tokens = np.zeros((batch_size, input_len), np.int32)
    for b, example in enumerate(padded):
      tokens[b, :len(example.tokens)] = example.tokens
    lengths = np.array([len(example.tokens) for example in padded], np.int32)
    indices = np.minimum(np.arange(start, start + batch_size), len(examples) - 1)
    keys = jax.vmap(functools.partial(jax.random.fold_in, rng))(indices)
    if mesh is None:
      yield rows, tokens, lengths, keys
      continue
    keys = np.asarray(jax.random.key_data(keys))
    yield rows, *(multihost.global_array(
        lambda r, x=x: x[r], x.shape,
        sharding.batch_sharding(mesh, sharding.STANDARD_RULES, x.shape))
        for x in (tokens, lengths, keys))
