"""T5X's decoder-only T5 1.1 language models as models of the front ends.

A decoder-only model's `start(batch, capacity)` prefills each row's prompt
(`batch.tokens`, `batch.lengths`) and returns a cache behind it
(spec_decode.cache.PromptState): the loops then run unchanged, and the logits
at loop position 0 are those after the whole prompt. `DecoderOnlyModel`'s
sequences start with BOS 0 (spec_decode.t5.decoder_only), so a prompt may be
empty; spec_decode.models.llama.LlamaModel is the other decoder-only family.

  target = DecoderOnlyModel.load(path, config)
  out = spec_decode.speculative_generate(target, draft, prompts, jax.random.key(0),
                                         lengths=lengths, gamma=4, max_decode_len=128)
  out.tokens  # [B, 128], each row's continuation
"""

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import data
from spec_decode import decoding
from spec_decode import text
from spec_decode.models import protocol
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
  reads = protocol.PROMPT_AFTER_BOS  # a prompt may be empty
  eos_id = text.EOS_ID

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

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """Prefills the prompts; returns the step function and the cache behind them.

    Args:
      batch: `tokens` [B, P] int32, row b's prompt in its first `lengths[b]`
        entries ([B] int32 in 0..P; None: every row P long).
      capacity: static loop positions, e.g. `decoding.cache_length(...)`.
    """
    network, variables = self.network, {'params': self.params}
    cache = network.apply(variables, batch.tokens, batch.prompt_lengths(), capacity,
                          method=DecoderOnlyTransformer.prefill)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return network.apply(variables, tokens, cache, method=DecoderOnlyTransformer.decode)

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

