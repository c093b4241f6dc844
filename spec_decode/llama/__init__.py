"""Llama-architecture decoder-only models from Hugging Face checkpoints, in the same loops.

  config   LlamaConfig, read from a Hugging Face config.json
  network  the Flax network: RoPE, grouped-query attention, SwiGLU, RMS norm; prompt caches
  hf       safetensors weights and tokenizer fingerprints of a checkpoint folder
  tokenizer  the folder's tokenizer (tokenizer.json or tokenizer.model): text to ids and back
  convert  a real pretrained Llama (SmolLM2-135M-Instruct, from GGUF) as a float32 folder

The model itself is spec_decode.models.LlamaModel; it decodes through
spec_decode.generate / speculative_generate / beam_generate as every family does.
"""

from spec_decode.llama.config import LlamaConfig

__all__ = ['LlamaConfig']
