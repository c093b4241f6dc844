"""Llama parameters and tokenizer fingerprints from Hugging Face checkpoint folders.

`read_hf` reads `model.safetensors`, or the shards `model.safetensors.index.json`
lists, with LlamaForCausalLM tensor names, into the tree of
spec_decode.llama.network, checking every array's name, shape and dtype
against a LlamaConfig. PyTorch Linear weights are [out, in], our kernels
[in, out]. Local paths only; numpy, no PyTorch.
"""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import text
from spec_decode.checkpoints.hf import _hf_files, read_tensors
from spec_decode.checkpoints.param_trees import Params, cast, flatten, unflatten
from spec_decode.llama.config import LlamaConfig
from spec_decode.llama.network import LlamaNetwork

# The files that define a tokenizer: two checkpoints whose files agree share it.
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer.model')
# Per layer: our sublayer path -> HF's, under model.layers.{i}.
_LAYER = {
    'input_layernorm/scale': 'input_layernorm.weight',
    'post_attention_layernorm/scale': 'post_attention_layernorm.weight',
    **{f'self_attn/{p}/kernel': f'self_attn.{p}.weight'
       for p in ('q_proj', 'k_proj', 'v_proj', 'o_proj')},
    **{f'mlp/{p}/kernel': f'mlp.{p}.weight' for p in ('gate_proj', 'up_proj', 'down_proj')},
}
# Stored by some exports and never read: rotary tables (computed from
# rope_theta) and a tied model's copy of the embedding.
_IGNORED = re.compile(r'model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq')
_TIED_COPY = 'lm_head.weight'


def hf_names(config: LlamaConfig) -> dict[str, str]:
  """Our array names -> Hugging Face LlamaForCausalLM tensor names."""
  names = {'embed_tokens/embedding': 'model.embed_tokens.weight', 'norm/scale': 'model.norm.weight'}
  if not config.tie_word_embeddings:
    names['lm_head/kernel'] = 'lm_head.weight'
  for i in range(config.num_hidden_layers):
    names.update({f'layers_{i}/{ours}': f'model.layers.{i}.{theirs}'
                  for ours, theirs in _LAYER.items()})
  return names


@functools.cache
def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
  """The network's parameter names and shapes, e.g. 'norm/scale': (E,)."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  shapes = jax.eval_shape(LlamaNetwork(config).init, jax.random.key(0), tokens)
  return {name: x.shape for name, x in flatten(shapes['params']).items()}


def read_hf(path: str, config: LlamaConfig) -> Params:
  """Reads a Hugging Face Llama checkpoint into our parameter tree.

  Args:
    path: a directory with `model.safetensors` or `model.safetensors.index.json`,
      or one of those files; local.
    config: the LlamaConfig the arrays must fit; they are cast to config.dtype.

  Returns:
    Our parameter tree (spec_decode.llama.network), numpy arrays.

  Raises:
    FileNotFoundError: no checkpoint file, or a shard the index names is absent.
    ValueError: missing or unexpected tensors, shapes that do not fit the
      config, integer or boolean tensors, or a damaged file; the message
      names every such tensor.
  """
  files = _hf_files(path)
  ours = {hf: name for name, hf in hf_names(config).items()}
  ignored = {n for n in files if _IGNORED.fullmatch(n)
             or (config.tie_word_embeddings and n == _TIED_COPY)}
  unexpected = sorted(set(files) - set(ours) - ignored)
  missing = sorted(set(ours) - set(files))
  if unexpected or missing:
    raise ValueError(f'{path} is not a Llama checkpoint of {config.num_hidden_layers} layers'
                     f'{" with tied" if config.tie_word_embeddings else " with untied"} '
                     'embeddings:\n  ' + '\n  '.join(
                         [f'missing array {n}' for n in missing]
                         + [f'unexpected array {n}' for n in unexpected]))
  expected = expected_shapes(config)
  flat, problems = {}, []
  for hf, x in read_tensors(files, ours, 'Llama'):
    name, kernel = ours[hf], ours[hf].endswith('/kernel')
    if (x.T if kernel else x).shape != expected[name]:
      needed = expected[name][::-1] if kernel else expected[name]
      problems.append(f'shape mismatch for {hf}: found {x.shape}, the config needs {needed}')
      continue
    flat[name] = np.ascontiguousarray(cast(x.T if kernel else x, config.dtype))
  if problems:
    raise ValueError(f'{path} does not fit the config:\n  ' + '\n  '.join(problems))
  return unflatten(flat)


def tokenizer_fingerprint(path: str) -> tuple[tuple[str, str], ...]:
  """((file, sha256 hex), ...) of the TOKENIZER_FILES in a checkpoint folder (or a file's)."""
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  files = [(name, os.path.join(directory, name)) for name in TOKENIZER_FILES]
  return tuple((name, text.fingerprint(file)) for name, file in files if os.path.isfile(file))


def differing_tokenizers(target: tuple[tuple[str, str], ...],
                         draft: tuple[tuple[str, str], ...]) -> list[str]:
  """The tokenizer files both fingerprints (`tokenizer_fingerprint`) hold, whose sha256 differ."""
  target, draft = dict(target), dict(draft)
  return sorted(name for name in target.keys() & draft.keys() if target[name] != draft[name])
