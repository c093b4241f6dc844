"""T5 1.1 hyperparameters: a plain frozen dataclass and the official sizes.

The constructor takes plain values (strings for dtypes) so that gin can bind
them at the edges. The sizes are those of the public T5 1.1 checkpoints
(gs://t5-data/pretrained_models/t5x/t5_1_1_*), plus two smoke sizes for tests.
"""

import dataclasses

import jax.numpy as jnp

_DTYPES = ('float32', 'bfloat16')


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Sizes and numerics of a T5 1.1 encoder-decoder.

  Attributes:
    vocab_size: V, rows of the shared token embedding and logits columns.
    emb_dim: E, the model width.
    num_heads: H, attention heads.
    num_encoder_layers: encoder blocks.
    num_decoder_layers: decoder blocks.
    head_dim: Dh, width of one head; H * Dh need not equal E.
    mlp_dim: width of the gated-GELU feed-forward block.
    dropout_rate: used only when dropout is enabled (training).
    dtype: activation (compute) dtype, 'float32' or 'bfloat16'. Attention
      softmax and logits are float32 whatever it is.
    param_dtype: dtype of the parameters, 'float32' (as T5X) or 'bfloat16'.
    num_buckets: relative position buckets.
    max_distance: relative distance from which all positions share a bucket.
  """

  vocab_size: int
  emb_dim: int
  num_heads: int
  num_encoder_layers: int
  num_decoder_layers: int
  head_dim: int
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: str = 'float32'
  param_dtype: str = 'float32'
  num_buckets: int = 32
  max_distance: int = 128

  def __post_init__(self):
    for name in ('vocab_size', 'emb_dim', 'num_heads', 'num_encoder_layers',
                 'num_decoder_layers', 'head_dim', 'mlp_dim', 'num_buckets',
                 'max_distance'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f'{name} must be one of {_DTYPES}, got {getattr(self, name)!r}')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'dropout_rate must be in [0, 1), got {self.dropout_rate}')

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)


VOCAB_SIZE = 32128  # The T5 SentencePiece vocabulary padded to a multiple of 128.

# name -> (emb_dim, num_heads, num_encoder_layers, num_decoder_layers, head_dim, mlp_dim)
SIZES = {
    'small': (512, 6, 8, 8, 64, 1024),
    'base': (768, 12, 12, 12, 64, 2048),
    'large': (1024, 16, 24, 24, 64, 2816),
    'xl': (2048, 32, 24, 24, 64, 5120),
    'xxl': (4096, 64, 24, 24, 64, 10240),
    # Smoke sizes for the tests and the scripts' quick runs (random weights):
    # a tiny target and a smaller draft. The bundled models' shapes live with
    # them (spec_decode.data.MODEL_SIZES).
    'tiny': (64, 4, 2, 2, 16, 128),
    'nano': (32, 2, 1, 1, 16, 64),
}


def t5_1_1(name: str, **overrides) -> T5Config:
  """The T5 1.1 config of a named size.

  Args:
    name: one of SIZES ('small', 'base', 'large', 'xl', 'xxl', 'tiny', 'nano').
    **overrides: T5Config fields to change, e.g. dtype='bfloat16' or
      vocab_size=128.

  Returns:
    The config, with vocab_size 32128 unless overridden.
  """
  if name not in SIZES:
    raise ValueError(f'unknown T5 1.1 size {name!r}; expected one of {sorted(SIZES)}')
  return of_size(SIZES[name], **{'vocab_size': VOCAB_SIZE, **overrides})


_SIZE_FIELDS = ('emb_dim', 'num_heads', 'num_encoder_layers', 'num_decoder_layers', 'head_dim',
                'mlp_dim')


def of_size(size: tuple[int, int, int, int, int, int], **fields) -> T5Config:
  """A T5Config of (emb_dim, num_heads, encoder layers, decoder layers, head_dim, mlp_dim).

  Args:
    size: the six dimensions, in the order of SIZES' entries.
    **fields: the other T5Config fields (vocab_size is required); a field of
      the six given here overrides its dimension.
  """
  return T5Config(**{**dict(zip(_SIZE_FIELDS, size)), **fields})
