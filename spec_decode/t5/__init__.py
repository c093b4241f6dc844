"""T5 1.1 in Flax with T5X parameter names and multi-token cached decoding."""

from spec_decode.t5.config import SIZES, T5Config, t5_1_1
from spec_decode.t5.network import DecoderCache, KeyValue, Transformer

__all__ = ['SIZES', 'DecoderCache', 'KeyValue', 'T5Config', 'Transformer', 't5_1_1']
