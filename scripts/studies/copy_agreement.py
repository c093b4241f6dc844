"""Where copying beats the draft: agreement with the target's greedy tokens, where n-grams repeat.

  python scripts/studies/copy_agreement.py --target DIR [--draft FOLDER] [--n 20] [--min_ngram 2]
      [--max_ngram 3]

Decodes the SmolLM2 demo's held-out prompts greedily with our baseline, then
asks at every generated position whether the last min_ngram..max_ngram
tokens occurred before (drafts.PromptLookupDraft finds it) and whose top
token is the target's: the copy's (the token that followed the n-gram's
latest occurrence), the draft's alone, and the copying draft's
(models.CopyingDraft). Prints one JSON line: the share of positions with a
match, each one's agreement there and elsewhere, and alpha at T = 0 of the
draft alone and copying (alpha_lib.measure_alpha, the demo's measure).
"""

import argparse
import json
import sys

import jax.numpy as jnp
import numpy as np

from spec_decode import sampling as sampling_lib
from spec_decode.harness import smollm2_demo
from spec_decode.llama import draft as draft_lib
from spec_decode.llama import prompts as prompts_lib
from spec_decode.llama.tokenizer import Tokenizer
from spec_decode.models import alpha as alpha_lib
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.models.copying import CopyingDraft
from spec_decode.models.llama import LlamaModel


def proposals(lookup, prompt: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The lookup's proposals and found flags after the prompt and each output token but the last."""
  batch = protocol.Batch(jnp.asarray(prompt[None]), jnp.array([len(prompt)]),
                         reads=protocol.PROMPT)
  propose_fn, cache = lookup.start_proposals(batch, len(output) + 1)
  tokens = jnp.asarray(np.concatenate([[prompt[-1]], output[:-1]])[None], jnp.int32)
  proposal, found, _ = propose_fn(tokens, cache)  # a K-token call equals K single calls
  return np.asarray(proposal[0]), np.asarray(found[0])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', required=True)
  parser.add_argument('--draft', default=str(smollm2_demo.DRAFT_DIR))
  parser.add_argument('--n', type=int, default=20)
  parser.add_argument('--max_new_tokens', type=int, default=128)
  parser.add_argument('--min_ngram', type=int, default=2)
  parser.add_argument('--max_ngram', type=int, default=3)
  args = parser.parse_args(argv)
  target, tokenizer = LlamaModel.load(args.target).with_panels(), Tokenizer(args.target)
  draft = draft_lib.load(args.draft, target)
  copying = CopyingDraft.create(draft, min_ngram=args.min_ngram, max_ngram=args.max_ngram)
  prompts, lengths = smollm2_demo.encode_prompts(tokenizer, prompts_lib.prompts('test', args.n))
  greedy = sampling_lib.SamplingParams.create(0.0)
  outputs = []
  for i in range(args.n):
    out = front_ends.generate(target, jnp.asarray(prompts[i:i + 1]), 0,
                              lengths=jnp.asarray(lengths[i:i + 1]),
                              max_decode_len=args.max_new_tokens)
    outputs.append(np.asarray(out.tokens[0, :int(out.lengths[0])]))
  width = max(len(o) for o in outputs)
  tokens = np.stack([np.pad(o, (0, width - len(o))) for o in outputs]).astype(np.int32)
  counts = np.array([len(o) for o in outputs])
  measure = lambda d: alpha_lib.measure_alpha(target, d, prompts, tokens, counts,
                                              sampling=greedy, lengths=lengths, batch_size=4)
  alone, copied = measure(draft), measure(copying)
  found, copy_right, draft_right = [], [], []
  for i, output in enumerate(outputs):
    proposal, hit = proposals(copying.lookup, prompts[i, :lengths[i]], output)
    found.append(hit)
    copy_right.append(proposal == output)
    draft_right.append(alone.betas[i] > 0.5)  # at T = 0 beta is 1 where the top tokens agree
  found, copy_right, draft_right = map(np.concatenate, (found, copy_right, draft_right))
  share = lambda x, where: float(x[where].mean()) if where.any() else float('nan')
  print(json.dumps({
      'positions': int(found.size), 'match_share': float(found.mean()),
      'copy_right_where_match': share(copy_right, found),
      'draft_right_where_match': share(draft_right, found),
      'draft_right_elsewhere': share(draft_right, ~found),
      'alpha_t0_draft': alone.alpha, 'alpha_t0_copying': copied.alpha,
      'alpha_t0_copying_stderr': copied.stderr}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
