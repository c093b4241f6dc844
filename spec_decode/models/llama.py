"""Hugging Face Llama checkpoints as models of the front ends.

A `LlamaModel` is a config (static) and a parameter tree (traced), like
`T5Model`: it passes through `jax.jit` whole, and it is a decoder-only model
(`start(batch, capacity)` prefills the prompts; spec_decode.llama.network
explains how loop positions map onto them). Its EOS id comes from the config,
and a draft must carry the target's tokenizer (`check_tokenizers`).

  target = LlamaModel.load('/ckpt/llama-7b')
  draft = LlamaModel.load('/ckpt/llama-160m')
  out = spec_decode.speculative_generate(target, draft, prompts, jax.random.key(0),
                                         lengths=lengths, gamma=4, max_decode_len=128)
  out.tokens  # [B, 128], the generated tokens of each row
"""

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode import kernels
from spec_decode.llama import hf
from spec_decode.llama.config import LlamaConfig
from spec_decode.llama.network import HEAD, LlamaNetwork
from spec_decode.models import protocol
from spec_decode.models.t5 import packed_once, replacing


@flax.struct.dataclass
class LlamaModel:
  """A Llama network's config and parameters.

  Attributes:
    config: the LlamaConfig; static.
    params: the parameter tree (see spec_decode.llama.network).
    tokenizer: static ((file, sha256), ...) of the checkpoint's tokenizer
      files (hf.tokenizer_fingerprint); empty when unknown.
    panels: None, or packed copies of the layers' kernels and of a tied
      output layer's (`with_panels`);
      keyword-only.
  """

  config: LlamaConfig = flax.struct.field(pytree_node=False)
  params: Any
  tokenizer: tuple[tuple[str, str], ...] = flax.struct.field(pytree_node=False, default=())
  panels: Any = flax.struct.field(default=None, kw_only=True)
  reads = protocol.PROMPT  # loop position 0 stands for the prompt's last token

  def with_panels(self, output_layer: bool = True) -> 'LlamaModel':
    """This model with its products' kernels packed where the CPU kernels use them; cached.

    A decode step then reads each kernel as one stream (`kernels.pack`), in
    bfloat16 where bfloat16 holds its weights exactly (a bfloat16 checkpoint's,
    e.g. the trained SmolLM2 draft's): half the bytes, the same products. A
    second copy of the kernels in memory; float32 compute only. A tied output
    layer is packed too (the table's transpose; XLA's product of a few rows by
    a 49,152-word table took 2-3 times as long as the kernel's on the SmolLM2
    target), unless `output_layer` is False (a draft with a head of its own).
    """
    def pack():
      panels = kernels.pack_tree(self.params, _layer_kernel)
      if output_layer and self.config.tie_word_embeddings:
        table = np.asarray(self.params['embed_tokens']['embedding'])
        panels[HEAD] = kernels.pack_weights(table.T)
      return panels

    return packed_once(self, output_layer, pack)

  def variables(self) -> dict:
    """The variables `network.apply` takes: params, and panels where there are some."""
    return kernels.variables(self.params, self.panels)

  @property
  def eos_id(self) -> int:
    """The config's one EOS id, -1 (none) if it has none.

    Raises:
      ValueError: the config lists several (the loops stop at one: pass eos_id).
    """
    ids = self.config.eos_token_ids
    if len(ids) > 1:
      raise ValueError(f'the config lists several EOS ids {ids}: the loops stop at one, pass '
                       'eos_id')
    return ids[0] if ids else -1

  @property
  def network(self) -> LlamaNetwork:
    return LlamaNetwork(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @classmethod
  def random(cls, config: LlamaConfig, rng: jax.Array) -> 'LlamaModel':
    """Freshly initialised parameters (normal, stddev 0.02, as HF's Llama)."""
    return cls(config, _init_params(config, rng))

  @classmethod
  def load(cls, path: str, dtype: str = 'float32',
           config: LlamaConfig | None = None) -> 'LlamaModel':
    """A Hugging Face Llama checkpoint folder on the default device.

    Args:
      path: a local folder with config.json and model.safetensors (or
        model.safetensors.index.json and its shards); its tokenizer.json or
        tokenizer.model, if any, is fingerprinted.
      dtype: the parameters' and activations' dtype, 'float32' (default) or
        'bfloat16'.
      config: the config the arrays must fit (its dtype then wins over
        `dtype`); None reads the folder's config.json.

    Raises:
      FileNotFoundError: no config or weights.
      ValueError: a config that is not plain Llama, or arrays missing,
        unexpected, of the wrong shape or of an integer dtype (named).
    """
    config = LlamaConfig.from_hf(path, dtype) if config is None else config
    return cls(config, jax.device_put(hf.read_hf(path, config)), hf.tokenizer_fingerprint(path))

  def start(self, batch: protocol.Batch,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """Prefills the prompts and returns a step function and its cache.

    Args:
      batch: `tokens` [B, P] int32, row b's prompt left-aligned in its first
        `lengths[b]` entries ([B] int32 in 1..P, None: every row P long;
        whatever follows is ignored).
      capacity: static loop positions, e.g. `decoding.cache_length(max_decode_len,
        gamma)`; the buffers hold P - 1 more.

    Returns:
      `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`
      and the cache at loop index 0, whose logits there are those after the
      whole prompt (the loop's token at position 0 is not read).
    """
    network, variables = self.network, self.variables()
    cache = network.apply(variables, batch.tokens, batch.prompt_lengths(), capacity,
                          method=LlamaNetwork.prefill)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return network.apply(variables, tokens, cache, method=LlamaNetwork.decode)

    return step_fn, cache


# flax.struct.dataclass sets a plain `replace` on the class it decorates.
LlamaModel.replace = replacing('params', 'panels')


def _layer_kernel(path: tuple[str, ...]) -> bool:
  """Whether a parameter path names a decoder layer's kernel (the products `with_panels` packs)."""
  return path[0].startswith('layers_') and path[-1] == 'kernel'


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: LlamaConfig, rng: jax.Array) -> Any:
  return LlamaNetwork(config).init(rng, jnp.ones((1, 1), jnp.int32))['params']


def check_tokenizers(target: Any, draft: Any) -> None:
  """Raises ValueError where both checkpoints carry a tokenizer file and its sha256 differs.

  The same ids must mean the same text; the front ends skip this check with
  `allow_tokenizer_mismatch=True` (e.g. for a tokenizer file re-serialised
  without changing the vocabulary).
  """
  differ = hf.differing_tokenizers(getattr(target, 'tokenizer', ()),
                                   getattr(draft, 'tokenizer', ()))
  if differ:
    raise ValueError(f'the target and the draft have different {" and ".join(sorted(differ))} '
                     '(sha256): their token ids may mean different text; pass '
                     'allow_tokenizer_mismatch=True if they share the vocabulary all the same')
