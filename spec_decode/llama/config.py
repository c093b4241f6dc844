"""Llama hyperparameters: a frozen dataclass, read from a Hugging Face `config.json`.

`LlamaConfig.from_hf` accepts the plain Llama architecture only (what
transformers' LlamaForCausalLM computes with its defaults): SwiGLU MLPs, RMS
norms, rotary position embeddings without scaling, no biases. A config that
asks for anything else (rope scaling, attention or MLP biases, another
activation, another model type) is refused with the key named, never decoded
as something it is not.
"""

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

_DTYPES = ('float32', 'bfloat16')
_ARCHITECTURE = 'LlamaForCausalLM'


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Sizes and numerics of a Llama decoder-only model.

  Attributes:
    vocab_size: V, rows of the token embedding and columns of the logits.
    hidden_size: E, the model width.
    intermediate_size: F, width of the SwiGLU feed-forward block.
    num_hidden_layers: decoder blocks.
    num_attention_heads: H, query heads.
    num_key_value_heads: Hkv, key/value heads; divides H (grouped-query
      attention when smaller, multi-head attention when equal).
    head_dim: Dh, width of one head (HF: `head_dim`, else E // H).
    rms_norm_eps: added to the mean square in every RMS norm.
    rope_theta: base of the rotary embedding's frequencies.
    tie_word_embeddings: the output layer is the token embedding transposed.
    bos_token_id: the tokenizer's begin-of-sequence id, or None.
    eos_token_ids: the ids that end a sequence (HF allows several).
    dtype: parameter and activation dtype, 'float32' or 'bfloat16';
      attention softmax and logits are float32 whatever it is.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  tie_word_embeddings: bool = False
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  dtype: str = 'float32'

  def __post_init__(self):
    for name in ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                 'num_attention_heads', 'num_key_value_heads', 'head_dim'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(f'num_key_value_heads={self.num_key_value_heads} must divide '
                       f'num_attention_heads={self.num_attention_heads}')
    if self.head_dim % 2:
      raise ValueError(f'head_dim must be even (rotary embedding pairs), got {self.head_dim}')
    for name in ('rms_norm_eps', 'rope_theta'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f'{name} must be a positive number, got {value!r}')
    if not isinstance(self.tie_word_embeddings, bool):
      raise ValueError(f'tie_word_embeddings must be True or False, got '
                       f'{self.tie_word_embeddings!r}')
    ids = {'bos_token_id': () if self.bos_token_id is None else (self.bos_token_id,),
           'eos_token_ids': self.eos_token_ids}
    for name, values in ids.items():
      if not isinstance(values, tuple) or not all(_is_id(v, self.vocab_size) for v in values):
        wanted = 'None or an id' if name == 'bos_token_id' else 'a tuple of ids'
        raise ValueError(f'{name} must be {wanted} in 0..vocab_size - 1 = {self.vocab_size - 1}, '
                         f'got {getattr(self, name)!r}')
    if self.dtype not in _DTYPES:
      raise ValueError(f'dtype must be one of {_DTYPES}, got {self.dtype!r}')

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def groups(self) -> int:
    """Query heads per key/value head, H // Hkv."""
    return self.num_attention_heads // self.num_key_value_heads

  @classmethod
  def from_hf(cls, path: str, dtype: str = 'float32') -> 'LlamaConfig':
    """The config of a Hugging Face Llama checkpoint.

    Args:
      path: a checkpoint directory holding `config.json`, or that file.
      dtype: the dtype to decode in, 'float32' (default) or 'bfloat16'.

    Raises:
      FileNotFoundError: no config.json.
      ValueError: not a Llama config (model_type or architectures), a
        required key missing, or a setting this implementation does not
        compute (rope scaling, biases, an activation other than SiLU); the
        message names the file and the key.
    """
    file = os.path.join(path, 'config.json') if os.path.isdir(path) else path
    if not os.path.isfile(file):
      raise FileNotFoundError(f'no Hugging Face config.json at {path}')
    try:
      with open(file, encoding='utf-8') as f:
        stored = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
      raise ValueError(f'{file} is not a JSON config: {e}') from None
    if not isinstance(stored, dict):
      raise ValueError(f'{file} must hold a JSON object, got a {type(stored).__name__}')
    try:
      return cls(**hf_fields(stored), dtype=dtype)
    except ValueError as e:
      raise ValueError(f'{file}: {e}') from None


def _is_id(value: Any, vocab_size: int) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size


# config.json's fields: the JSON types each may hold (None: the field may be null or absent).
_INTEGER, _NUMBER, _BOOLEAN = 'a positive integer', 'a positive number', 'true or false'
_FIELDS = {
    **dict.fromkeys(('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
                     'num_attention_heads', 'num_key_value_heads', 'head_dim'), _INTEGER),
    **dict.fromkeys(('rms_norm_eps', 'rope_theta'), _NUMBER),
    **dict.fromkeys(('tie_word_embeddings', 'attention_bias', 'mlp_bias'), _BOOLEAN),
}


def _check_field(key: str, value: Any, wanted: str) -> None:
  """ValueError naming the field unless a present, non-null value is of JSON type `wanted`."""
  if value is None:
    return
  if wanted == _BOOLEAN:
    ok = isinstance(value, bool)
  else:
    ok = (not isinstance(value, bool) and isinstance(value, int if wanted == _INTEGER else
                                                     (int, float)) and value > 0)
  if not ok:
    quoted = ''
    if isinstance(value, str):
      try:
        quoted = ' (a JSON string: drop the quotes)' if _check_field(key, json.loads(value),
                                                                     wanted) is None else ''
      except ValueError:
        quoted = ' (a JSON string)'
    raise ValueError(f'field {key} must be {wanted}, got {value!r}{quoted}')


def _token_ids(stored: dict[str, Any], key: str) -> tuple[int, ...]:
  """The ids of field `key` (an id, a list of ids, or null), each in 0..vocab_size - 1."""
  value = stored.get(key)
  several = key == 'eos_token_id'  # HF allows a list there
  values = () if value is None else tuple(value) if several and isinstance(value, list) else (
      value,)
  vocab_size = stored['vocab_size']
  if not all(_is_id(v, vocab_size) for v in values):
    raise ValueError(f'field {key} must be a token id in 0..vocab_size - 1 = {vocab_size - 1}'
                     f'{" or a list of them" if several else ""} (or null), got '
                     f'{value!r}')
  return values


def hf_fields(stored: dict[str, Any]) -> dict[str, Any]:
  """The LlamaConfig fields of a parsed HF config dict (see `LlamaConfig.from_hf`).

  Raises:
    ValueError: not a plain Llama config, or a field of the wrong JSON type or
      range (a quoted number, a string for a boolean, an EOS id beyond the
      vocabulary), the field named.
  """
  model_type = stored.get('model_type')
  if model_type != 'llama':
    raise ValueError(f'model_type is {model_type!r}, not a Llama model (\'llama\')')
  architectures = stored.get('architectures') or [_ARCHITECTURE]
  if not isinstance(architectures, list) or _ARCHITECTURE not in architectures:
    raise ValueError(f'architectures is {architectures!r}; only {_ARCHITECTURE} is supported')
  required = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers',
              'num_attention_heads')
  missing = [key for key in required if stored.get(key) is None]
  if missing:
    raise ValueError(f'missing required key(s) {", ".join(missing)}')
  rope = stored.get('rope_parameters') or {}
  if not isinstance(rope, dict):
    raise ValueError(f'field rope_parameters must be a JSON object (or null), got {rope!r}')
  for key, wanted in _FIELDS.items():
    _check_field(key, stored.get(key), wanted)
  _check_field('rope_parameters.rope_theta', rope.get('rope_theta'), _NUMBER)
  hidden_act = stored.get('hidden_act', 'silu')
  refused = {'attention_bias': bool(stored.get('attention_bias')),
             'mlp_bias': bool(stored.get('mlp_bias')),
             'rope_scaling': stored.get('rope_scaling') is not None,
             'hidden_act': hidden_act != 'silu'}
  if rope.get('rope_type', rope.get('type', 'default')) != 'default':
    refused['rope_parameters'] = True
  wrong = [f'{key}={stored[key]!r}' for key, bad in refused.items() if bad]
  if wrong:
    raise ValueError(f'{", ".join(wrong)}: only plain Llama is supported (no rope scaling, no '
                     'attention or MLP biases, SiLU activation)')
  heads = stored['num_attention_heads']
  return {
      **{key: stored[key] for key in required},
      'num_key_value_heads': stored.get('num_key_value_heads') or heads,
      'head_dim': stored.get('head_dim') or stored['hidden_size'] // heads,
      'rms_norm_eps': stored.get('rms_norm_eps', 1e-6),
      'rope_theta': rope.get('rope_theta', stored.get('rope_theta', 10000.0)),
      'tie_word_embeddings': stored.get('tie_word_embeddings', False) or False,
      'bos_token_id': (_token_ids(stored, 'bos_token_id') or (None,))[0],
      'eos_token_ids': _token_ids(stored, 'eos_token_id'),
  }
