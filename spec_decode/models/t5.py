"""T5 1.1 encoder-decoders as models of the front ends (spec_decode.models.protocol).

A `T5Model` is a config (static) and a parameter tree (traced), on one CPU
device with packed copies of its kernels for the CPU kernels
(`with_panels`): it passes through `jax.jit` whole, so parameters are
arguments of the compiled function, never constants baked into it.
`T5Model.start` runs the encoder once and returns the step function and fresh
cache the loops of `spec_decode.decoding` take.

  target = T5Model(t5_1_1('xxl'), params)
  out = spec_decode.speculative_generate(target, draft, inputs, jax.random.key(0),
                                         gamma=4, max_decode_len=128)
  out.tokens  # [B, 128]
"""

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode import kernels
from spec_decode import text
from spec_decode.models import protocol
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
  reads = protocol.ENCODER_INPUT
  eos_id = text.EOS_ID

  def with_panels(self, output_layer: bool = True) -> 'T5Model':
    """This model with `panels` where the CPU kernels would use them, else itself.

    The Dense kernels are packed (`kernels.pack`; those a layer multiplies one
    input by side by side, one product): a decoder step then reads each
    weight matrix as one stream, and the encoder's products of up to 256
    tokens take the kernel too, bitwise the CPU kernel's products (for 17 to
    256 rows an unpacked model takes XLA's, equal to rounding), for a second copy
    of the kernels in memory (half its size in bfloat16, where bfloat16 holds
    the weights: a bfloat16 checkpoint's, or bfloat16 parameters). Only for a
    float32 compute dtype, the kernels' own. `output_layer` False leaves the
    output layer (`logits_dense`) unpacked: a draft with a head of its own
    (models.PrunedHeadDraft) never reads it. Packed once per model and cached.
    """
    select = is_dense_kernel if output_layer else (
        lambda path: is_dense_kernel(path) and 'logits_dense' not in path)
    return packed_once(self, output_layer,
                       lambda: kernels.pack_tree(self.params, select, _fused))

  def variables(self) -> dict:
    """The variables `network.apply` takes: params, and panels where there are some."""
    return kernels.variables(self.params, self.panels)

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

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """Encodes the inputs once and returns a step function and its cache.

    Args:
      batch: `batch.tokens` [B, S] int32 input tokens, 0 = padding.
      capacity: static decoder positions the cache holds, e.g.
        `decoding.cache_length(max_decode_len, gamma)`.

    Returns:
      `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`
      closed over these parameters, and the fresh cache (index 0).
    """
    network, variables = self.network, self.variables()
    encoded = network.apply(variables, batch.tokens, method=Transformer.encode)
    cache = network.apply(variables, encoded, batch.tokens, capacity,
                          method=Transformer.init_cache)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return network.apply(variables, tokens, cache, method=Transformer.decode)

    return step_fn, cache


def replacing(weights: str, packed: str, *more: str):
  """A `replace` (dataclasses.replace) for which new `weights` without new `packed` drop them.

  `more`: further (weights, packed) names, in pairs.
  """
  pairs = list(zip((weights, packed, *more)[::2], (weights, packed, *more)[1::2]))

  def replace(self, **updates):
    for w, p in pairs:
      if w in updates and p not in updates:
        updates[p] = None  # never stale panels
    return dataclasses.replace(self, **updates)

  return replace


def packed_once(model, output_layer: bool, pack: Callable[[], Any]):
  """`model.replace(panels=pack())` where the CPU kernels would read panels, else `model`.

  For a model without panels, computing in float32 (the kernels' dtype), whose
  parameters `kernels.packing_pays`; cached on the model per `output_layer`
  (a model's `with_panels(output_layer)`).
  """
  name = '_with_panels' if output_layer else '_with_layer_panels'
  if name not in model.__dict__:
    packed = model
    if (model.panels is None and jnp.dtype(model.config.compute_dtype) == jnp.float32
        and kernels.packing_pays(model.params)):
      packed = model.replace(panels=pack())
    object.__setattr__(model, name, packed)
  return model.__dict__[name]


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


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: T5Config, rng: jax.Array) -> Any:
  tokens = jnp.ones((1, 1), jnp.int32)
  return Transformer(config).init(rng, tokens, tokens)['params']
