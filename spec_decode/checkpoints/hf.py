"""T5 1.1 parameters from and to Hugging Face checkpoints.

`read_hf`, `write_hf`, `hf_config`: `model.safetensors` or shards listed by
`model.safetensors.index.json`, with T5ForConditionalGeneration names; local
paths only. PyTorch Linear weights are [out, in], our kernels [in, out].
`spec_decode.checkpoints.load_params` detects and checks them like every format.
"""

import json
import os
import re
from typing import Any, Iterable, Iterator

import jax.numpy as jnp
import numpy as np

from spec_decode.checkpoints.param_trees import Params, cast, check_params, flatten, unflatten
from spec_decode.t5.config import T5Config

HF_FILE = 'model.safetensors'
HF_INDEX = 'model.safetensors.index.json'

# Per block, in HF's `layer.{j}` order: (our sublayer, its norm, HF sublayer).
_ENCODER_BLOCK = (('attention', 'pre_attention_layer_norm', 'SelfAttention'),
                  ('mlp', 'pre_mlp_layer_norm', 'DenseReluDense'))
_DECODER_BLOCK = (
    ('self_attention', 'pre_self_attention_layer_norm', 'SelfAttention'),
    ('encoder_decoder_attention', 'pre_cross_attention_layer_norm', 'EncDecAttention'),
    ('mlp', 'pre_mlp_layer_norm', 'DenseReluDense'))
_ATTENTION = (('query', 'q'), ('key', 'k'), ('value', 'v'), ('out', 'o'))
_MLP = (('wi_0', 'wi_0'), ('wi_1', 'wi_1'), ('wo', 'wo'))
# Copies of shared.weight that some exports carry; tied, so ignored.
_HF_TIED = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight')


def hf_names(num_encoder_layers: int, num_decoder_layers: int) -> dict[str, str]:
  """Our array names -> Hugging Face T5ForConditionalGeneration tensor names."""
  relpos = 'block.0.layer.0.SelfAttention.relative_attention_bias.weight'
  names = {
      'token_embedder/embedding': 'shared.weight',
      'encoder/relpos_bias/rel_embedding': f'encoder.{relpos}',
      'encoder/encoder_norm/scale': 'encoder.final_layer_norm.weight',
      'decoder/relpos_bias/rel_embedding': f'decoder.{relpos}',
      'decoder/decoder_norm/scale': 'decoder.final_layer_norm.weight',
      'decoder/logits_dense/kernel': 'lm_head.weight',
  }
  for stack, count, block in (('encoder', num_encoder_layers, _ENCODER_BLOCK),
                              ('decoder', num_decoder_layers, _DECODER_BLOCK)):
    for i in range(count):
      for j, (ours, norm, theirs) in enumerate(block):
        prefix, hf_prefix = f'{stack}/layers_{i}', f'{stack}.block.{i}.layer.{j}'
        names[f'{prefix}/{norm}/scale'] = f'{hf_prefix}.layer_norm.weight'
        for a, b in _MLP if theirs == 'DenseReluDense' else _ATTENTION:
          names[f'{prefix}/{ours}/{a}/kernel'] = f'{hf_prefix}.{theirs}.{b}.weight'
  return names


def _hf_transposed(name: str) -> bool:
  """Whether HF stores our array transposed: Linear [out, in]; relative bias [32, H]."""
  return name.endswith(('/kernel', '/rel_embedding'))


def hf_config(config: T5Config, dtype=None) -> dict[str, Any]:
  """The Hugging Face `config.json` of a T5 1.1 model with this config.

  Args:
    config: our T5Config.
    dtype: the dtype the weights are stored in; default config.param_dtype.

  Returns:
    A dict that transformers.T5Config(**d) and from_pretrained take.
  """
  return {
      'architectures': ['T5ForConditionalGeneration'],
      'model_type': 't5',
      'vocab_size': config.vocab_size,
      'd_model': config.emb_dim,
      'd_kv': config.head_dim,
      'd_ff': config.mlp_dim,
      'num_layers': config.num_encoder_layers,
      'num_decoder_layers': config.num_decoder_layers,
      'num_heads': config.num_heads,
      'relative_attention_num_buckets': config.num_buckets,
      'relative_attention_max_distance': config.max_distance,
      'dropout_rate': config.dropout_rate,
      'layer_norm_epsilon': 1e-6,
      'initializer_factor': 1.0,
      'feed_forward_proj': 'gated-gelu',  # tanh GELU ('gelu_new'), as nn.gelu.
      'tie_word_embeddings': False,  # T5 1.1: own lm_head, no d_model**-0.5 rescaling.
      'is_encoder_decoder': True,
      'use_cache': True,
      'pad_token_id': 0,
      'eos_token_id': 1,
      'decoder_start_token_id': 0,
      'dtype': jnp.dtype(config.param_dtype if dtype is None else dtype).name,
  }


def _hf_files(path: str) -> dict[str, str]:
  """A safetensors file, an index or a directory -> {tensor name: file}."""
  path = os.fspath(path)
  if '://' in path:
    raise ValueError(f'{path}: Hugging Face checkpoints are read from local paths only')
  if os.path.isdir(path):
    for name in (HF_INDEX, HF_FILE):
      if os.path.isfile(os.path.join(path, name)):
        return _hf_files(os.path.join(path, name))
    raise FileNotFoundError(f'no {HF_FILE} or {HF_INDEX} in {path}')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no Hugging Face checkpoint file {path}')
  if path.endswith('.json'):
    try:
      with open(path) as f:
        weight_map = json.load(f)['weight_map']
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f'{path} is not a safetensors index: {e!r}') from e
    directory = os.path.dirname(path)
    return {name: os.path.join(directory, file) for name, file in weight_map.items()}
  with _safe_open(path) as f:
    return dict.fromkeys(f.keys(), path)


def _safe_open(file: str):
  """safe_open, with the names of truncated arrays in its error."""
  if not os.path.isfile(file):
    raise FileNotFoundError(f'no safetensors file {file}')
  # Imported here: only Hugging Face checkpoints need it, and accelerator images may lack it.
  import safetensors  # pylint: disable=g-import-not-at-top
  try:
    return safetensors.safe_open(file, framework='numpy')
  except safetensors.SafetensorError as e:
    raise ValueError(f'{file} is corrupted or truncated ({e}){_past_end(file)}') from e


def _past_end(file: str) -> str:
  """The arrays of a damaged safetensors file whose bytes lie beyond its end."""
  try:
    with open(file, 'rb') as f:
      header_len = int.from_bytes(f.read(8), 'little')
      header = json.loads(f.read(header_len))
    header.pop('__metadata__', None)
    ends = {name: 8 + header_len + entry['data_offsets'][1] for name, entry in header.items()}
  except Exception:  # The header itself is damaged: nothing more to say.
    return ''
  size = os.path.getsize(file)
  cut = sorted((end, name) for name, end in ends.items() if end > size)
  more = f' and {len(cut) - 3} more' if len(cut) > 3 else ''
  return (f'; {size} of {max(ends.values())} bytes, arrays past the end: '
          + ', '.join(name for _, name in cut[:3]) + more)


def read_hf(path: str, dtype=None) -> Params:
  """Reads a Hugging Face T5 1.1 checkpoint (T5ForConditionalGeneration names).

  Args:
    path: a directory with `model.safetensors` or `model.safetensors.index.json`,
      or one of those files; local.
    dtype: dtype to cast every array to; None keeps the stored dtypes.

  Returns:
    Our parameter tree, numpy arrays; layer counts come from the block names.

  Raises:
    FileNotFoundError: no checkpoint file, or a shard the index names is absent.
    ValueError: a missing or unexpected tensor, an integer or boolean tensor
      or a damaged file; the message names the tensor.
  """
  files = _hf_files(path)
  counts = {stack: 1 + max((int(m[1]) for name in files
                            if (m := re.match(rf'{stack}\.block\.(\d+)\.', name))), default=-1)
            for stack in ('encoder', 'decoder')}
  ours = {hf: name for name, hf in hf_names(counts['encoder'], counts['decoder']).items()}
  unexpected = sorted(set(files) - set(ours) - set(_HF_TIED))
  missing = sorted(set(ours) - set(files))
  if unexpected or missing:
    raise ValueError(f'{path} is not a T5 1.1 checkpoint of {counts["encoder"]} + '
                     f'{counts["decoder"]} layers:\n  ' + '\n  '.join(
                         [f'missing array {n} (our {ours[n]})' for n in missing]
                         + [f'unexpected array {n}' for n in unexpected]))
  flat = {}
  for hf, x in read_tensors(files, ours, 'T5'):
    name = ours[hf]
    flat[name] = np.ascontiguousarray(cast(x.T if _hf_transposed(name) else x, dtype))
  return unflatten(flat)


def read_tensors(files: dict[str, str], names: Iterable[str],
                 family: str) -> Iterator[tuple[str, np.ndarray]]:
  """(name, array) of each named tensor, one safetensors file open at a time.

  Args:
    files: tensor name -> the file that holds it (`_hf_files`).
    names: the tensors to read, a subset of `files`.
    family: the models' name, for the messages ('T5', 'Llama').

  Raises:
    ValueError: a tensor missing from the file the index puts it in, or one
      that is not floating point (a cast would decode garbage).
  """
  names = set(names)
  for file in sorted({files[n] for n in names}):
    with _safe_open(file) as f:
      in_file = set(f.keys())
      for hf in sorted(n for n in names if files[n] == file):
        if hf not in in_file:
          raise ValueError(f'missing array {hf}: the index puts it in {file}, which lacks it')
        x = f.get_tensor(hf)
        if not jnp.issubdtype(x.dtype, jnp.floating):
          raise ValueError(f'{file}: tensor {hf} has dtype {x.dtype}: {family} weights are '
                           'floating point (float32, bfloat16 or float16), a cast would decode '
                           'garbage')
        yield hf, x


def check_hf_json(path: str, config: T5Config) -> None:
  """Checks a config.json next to the weights, if any, for what no shape shows.

  Raises:
    ValueError: naming the file: not valid JSON, not an object, or settings
      of another model.
  """
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  file = os.path.join(directory, 'config.json')
  if not os.path.isfile(file):
    return
  stored = _read_json_object(file)
  # T5 1.0 scales the decoder output by d_model**-0.5: transformers 4 says so with
  # tie_word_embeddings (default true), transformers 5 with scale_decoder_outputs.
  scaled = stored.get('scale_decoder_outputs', stored.get('tie_word_embeddings', True) is not False)
  found_needed = {
      'feed_forward_proj': (stored.get('feed_forward_proj', 'relu'), 'gated-gelu'),
      'scale_decoder_outputs': (scaled, False),
      'relative_attention_max_distance': (stored.get('relative_attention_max_distance', 128),
                                          config.max_distance),
      'layer_norm_epsilon': (stored.get('layer_norm_epsilon', 1e-6), 1e-6),
  }
  wrong = [f'{key} is {found!r}, the config needs {needed!r}'
           for key, (found, needed) in found_needed.items() if found != needed]
  if wrong:
    raise ValueError(f'{file} describes another model: ' + '; '.join(wrong))


def _read_json_object(file: str) -> dict[str, Any]:
  """The JSON object in `file`; ValueError naming the file and what is wrong with it."""
  try:
    with open(file, encoding='utf-8') as f:
      stored = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f'{file} is not valid JSON: {e.msg} at line {e.lineno} column '
                     f'{e.colno}') from None
  except UnicodeDecodeError as e:
    raise ValueError(f'{file} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset '
                     f'{e.start})') from None
  if not isinstance(stored, dict):
    raise ValueError(f'{file} must hold a JSON object (a Hugging Face config), got a '
                     f'{type(stored).__name__}')
  return stored


def write_hf(path: str, params: Params, config: T5Config, dtype=None) -> None:
  """Exports `params` for transformers.T5ForConditionalGeneration.from_pretrained.

  Writes `model.safetensors` (one file) and `config.json` (see `hf_config`).

  Args:
    path: the directory to write to (created if needed).
    params: our parameter tree; checked against `config`.
    config: its T5Config.
    dtype: dtype to store the weights in; default config.param_dtype.
  """
  check_params(params, config, source='params')
  dtype = config.param_dtype if dtype is None else dtype
  names = hf_names(config.num_encoder_layers, config.num_decoder_layers)
  tensors = {}
  for name, x in flatten(params).items():
    x = cast(x, dtype)
    tensors[names[name]] = np.ascontiguousarray(x.T if _hf_transposed(name) else x)
  os.makedirs(path, exist_ok=True)
  import safetensors.numpy  # pylint: disable=g-import-not-at-top (see _safe_open)
  safetensors.numpy.save_file(tensors, os.path.join(path, HF_FILE), metadata={'format': 'pt'})
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf_config(config, dtype), f, indent=2)
