"""spec_decode: speculative decoding (Leviathan et al. 2023) for T5 1.1 models in JAX/Flax.

The public surface; the layout and the reading path are in docs/architecture.md.

  engine       decoding, speculative, drafting, sampling, cache, loop_utils, beam_search,
               speculative_beam, theory: loops over step functions, no model code
  models       models, drafts, sharding, multihost, text, t5/: parameters -> step functions,
               tokenizer; lm (decoder-only models over prompts), llama/ (Hugging Face Llama)
  checkpoints  T5X, orbax and Hugging Face checkpoints
  training     train, distill, whitebox, tasks, metrics
  cli          the spec-decode command line
  harness      measurement: alpha, step and loop costs, walltime, reports
"""

from spec_decode import _moved
from spec_decode.checkpoints import load_params
from spec_decode.decoding import DecodeOutput
from spec_decode.models import T5Model, beam_generate, generate, speculative_generate
from spec_decode.sampling import SamplingParams
from spec_decode.t5.config import T5Config, t5_1_1
from spec_decode.text import Vocabulary

_moved.install()

__all__ = ['DecodeOutput', 'SamplingParams', 'T5Config', 'T5Model', 'Vocabulary', 'beam_generate',
           'generate', 'load_params', 'speculative_generate', 't5_1_1']
