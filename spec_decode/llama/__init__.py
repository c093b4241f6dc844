"""Llama-architecture decoder-only models from Hugging Face checkpoints, in the same loops.

  config   LlamaConfig, read from a Hugging Face config.json
  network  the Flax network: RoPE, grouped-query attention, SwiGLU, RMS norm; prompt caches
  hf       safetensors weights and tokenizer fingerprints of a checkpoint folder
  tokenizer  the folder's tokenizer (tokenizer.json or tokenizer.model): text to ids and back
  model    LlamaModel (start -> step function and cache), generate, speculative_generate
"""

from spec_decode.llama.config import LlamaConfig
from spec_decode.llama.model import (LlamaModel, check_shared_vocabulary, generate,
                                     speculative_generate)

__all__ = ['LlamaConfig', 'LlamaModel', 'check_shared_vocabulary', 'generate',
           'speculative_generate']
