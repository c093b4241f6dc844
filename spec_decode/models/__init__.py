"""Models of the decoding front ends: every family and draft kind behind one protocol.

  protocol     Batch (what a decode starts from) and the Model protocol the front ends need
  front_ends   generate, speculative_generate, beam_generate (and `run`, the compiled program)
  t5           T5Model: T5 1.1 encoder-decoders
  decoder_only DecoderOnlyModel: T5X's decoder-only T5 1.1 (and the bundled language models)
  llama        LlamaModel: Hugging Face Llama checkpoints
  drafts       TableDraft (n-gram), PromptLookupDraft, UniformDraft: drafts with c ~ 0
  copying      CopyingDraft: copies repeated n-grams, asks its model draft elsewhere
  pruned_head  PrunedHeadDraft: a draft T5 or Llama model scoring only some tokens
  feature_draft FeatureDraft: a draft over its Llama target's features (EAGLE)
  sharding     the same models over a device mesh
  alpha        alpha measured from the target's sequences (Table 3)
"""

from spec_decode.models.copying import CopyingDraft
from spec_decode.models.decoder_only import DecoderOnlyModel
from spec_decode.models.drafts import PromptLookupDraft, TableDraft, UniformDraft
from spec_decode.models.feature_draft import FeatureDraft
from spec_decode.models.front_ends import beam_generate, generate, speculative_generate
from spec_decode.models.llama import LlamaModel
from spec_decode.models.protocol import Batch, Model
from spec_decode.models.pruned_head import PRUNED_LOGIT, PrunedHeadDraft
from spec_decode.models.t5 import T5Model

__all__ = ['Batch', 'CopyingDraft', 'DecoderOnlyModel', 'FeatureDraft', 'LlamaModel', 'Model', 'PRUNED_LOGIT', 'PromptLookupDraft',
           'PrunedHeadDraft', 'T5Model', 'TableDraft', 'UniformDraft', 'beam_generate', 'generate',
           'speculative_generate']
