"""spec_decode: speculative decoding (Leviathan et al. 2023) for T5X-style models in JAX/Flax.

The public surface; the layout and the reading path are in docs/architecture.md.

  engine       decoding, speculative, draft_phase, sampling, cache, loop_utils, beam_search,
               speculative_beam, theory, options, checks: loops over step functions, no model
  models       the protocol and the one front end (generate, speculative_generate,
               beam_generate) over every family: T5, T5X decoder-only, Llama; drafts; sharding
  t5, llama    the networks, configs and Hugging Face readers; text: the T5 vocabulary
  checkpoints  T5X, orbax and Hugging Face checkpoints
  training     train, distill, whitebox, tasks, metrics
  cli          the spec-decode command line
  harness      measurement: step and loop costs, walltime, reports
"""

from spec_decode.checkpoints import load_params
from spec_decode.decoding import DecodeOutput
from spec_decode.models import (Batch, DecoderOnlyModel, LlamaModel, T5Model, beam_generate,
                                generate, speculative_generate)
from spec_decode.options import Knobs, LoopOptions
from spec_decode.sampling import SamplingParams
from spec_decode.t5.config import T5Config, t5_1_1
from spec_decode.text import Vocabulary

__all__ = ['Batch', 'DecodeOutput', 'DecoderOnlyModel', 'Knobs', 'LlamaModel', 'LoopOptions',
           'SamplingParams', 'T5Config', 'T5Model', 'Vocabulary', 'beam_generate', 'generate',
           'load_params', 'speculative_generate', 't5_1_1']
