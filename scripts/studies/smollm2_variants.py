"""Ways of drafting and verifying on the SmolLM2 pair, each against our baseline in one run.

  python scripts/studies/smollm2_variants.py --target DIR --temperature 0 \
      --variants gamma=4 gamma=6,threshold=0.3 gamma=6,threshold=0.5 gamma=8,threshold=0.4
  python scripts/studies/smollm2_variants.py --target DIR --temperature 1 \
      --variants gamma=2 gamma=2,verification=block gamma=3 gamma=3,verification=block

A variant is gamma=G with, optionally, threshold=X (adaptive draft length: a
row stops drafting after a token its draft gave probability below X, and the
verify call covers the smallest K that holds the drafts; spec_decode.draft_phase)
and verification=block. The draft is the demo's (the bundled one, copying
where a 2- or 3-gram repeats; `--copies 0`: alone). The demo's held-out
prompts are decoded at batch 1 by the baseline and every variant, prompt by
prompt, each decoder once per prompt in turn after one compile each (the
machine's drift falls on all alike). Prints a Markdown table (ms per token,
speedup over the baseline, tokens per target call and, at T = 0, outputs
identical to the baseline's) and one JSON line.
"""

import argparse
import functools
import json
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode.harness import progress
from spec_decode.harness import report
from spec_decode.harness import smollm2_demo
from spec_decode.harness import timing
from spec_decode.models import front_ends


def parse_variant(text: str) -> dict[str, Any]:
  """'gamma=6,threshold=0.3' -> {'gamma': 6, 'threshold': 0.3, 'verification': 'token'}.

  Raises:
    argparse.ArgumentTypeError: no gamma, an unknown key, or a value of the wrong kind.
  """
  variant: dict[str, Any] = {'threshold': None, 'verification': 'token'}
  kinds = {'gamma': int, 'threshold': float, 'verification': str}
  for part in text.split(','):
    key, _, value = part.partition('=')
    if key not in kinds or not value:
      raise argparse.ArgumentTypeError(
          f'{text!r}: expected gamma=G[,threshold=X][,verification=block], got {part!r}')
    try:
      variant[key] = kinds[key](value)
    except ValueError:
      what = 'an integer' if kinds[key] is int else 'a number'
      raise argparse.ArgumentTypeError(f'{text!r}: {key} must be {what}, got {value!r}') from None
  if variant['verification'] not in speculative.VERIFICATIONS:
    raise argparse.ArgumentTypeError(f'{text!r}: verification must be one of '
                                     f'{", ".join(speculative.VERIFICATIONS)}')
  if 'gamma' not in variant:
    raise argparse.ArgumentTypeError(f'{text!r}: gamma=G is required')
  variant['name'] = text
  return variant


def decoders(target: Any, draft: Any, variants: Sequence[dict[str, Any]], max_new_tokens: int,
             temperature: float) -> dict[str, Any]:
  """'baseline' and each variant's name -> fn(prompt [1, P], seed, lengths) -> DecodeOutput."""
  sampling = None if temperature == 0 else sampling_lib.SamplingParams.create(temperature)
  out = {'baseline': functools.partial(front_ends.generate, target,
                                       max_decode_len=max_new_tokens, sampling=sampling)}
  for v in variants:
    adaptive = v['threshold'] is not None
    out[v['name']] = functools.partial(
        front_ends.speculative_generate, target, draft, gamma=v['gamma'],
        max_decode_len=max_new_tokens, sampling=sampling, verification=v['verification'],
        confidence_threshold=v['threshold'],
        verify_lengths=tuple(range(2, v['gamma'] + 2)) if adaptive else None)
  return out


def compare(fns: dict[str, Any], prompts: np.ndarray, lengths: np.ndarray,
            seed: int = 0) -> list[dict[str, Any]]:
  """Each decoder on each prompt in turn; one row per decoder."""
  seconds = {name: 0.0 for name in fns}
  tokens, calls, same = dict.fromkeys(fns, 0), dict.fromkeys(fns, 0), dict.fromkeys(fns, 0)
  for i in progress.bar(range(len(prompts)), desc='prompts'):
    x, length = jnp.asarray(prompts[i:i + 1]), jnp.asarray(lengths[i:i + 1])
    if i == 0:  # compile
      jax.block_until_ready([fn(x, 0, lengths=length) for fn in fns.values()])
    reference = None
    for name, fn in fns.items():
      s, out = timing.median_time(lambda: fn(x, seed + i, lengths=length), 1)
      seconds[name] += s
      tokens[name] += int(out.generated[0])
      calls[name] += int(out.target_calls[0])
      ids = np.asarray(out.tokens[0, :int(out.lengths[0])])
      reference = ids if reference is None else reference
      same[name] += bool(np.array_equal(ids, reference))
  base_ms = 1e3 * seconds['baseline'] / tokens['baseline']
  return [{'decoder': name, 'ms_per_token': 1e3 * seconds[name] / tokens[name],
           'speedup': base_ms / (1e3 * seconds[name] / tokens[name]),
           'tokens_per_call': tokens[name] / calls[name], 'identical': same[name],
           'prompts': len(prompts)} for name in fns]


COLUMNS: tuple[report.Column, ...] = (
    ('decoder', lambda r: r['decoder']),
    ('ms/token', lambda r: f'{r["ms_per_token"]:.1f}'),
    ('speedup', lambda r: f'{r["speedup"]:.3f}X'),
    ('tokens/call', lambda r: f'{r["tokens_per_call"]:.2f}'),
    ('identical to the baseline', lambda r: '-' if r['identical'] is None
     else f'{r["identical"]}/{r["prompts"]}'),
)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', required=True, help='a SmolLM2-135M(-Instruct) HF folder')
  parser.add_argument('--draft', default=str(smollm2_demo.DRAFT_DIR))
  parser.add_argument('--copies', type=int, default=2, metavar='MIN_NGRAM')
  parser.add_argument('--variants', type=parse_variant, nargs='+', required=True)
  parser.add_argument('--temperature', type=float, default=0.0)
  parser.add_argument('--n', type=int, default=20)
  parser.add_argument('--max_new_tokens', type=int, default=128)
  args = parser.parse_args(argv)
  target, _, draft, prompts, lengths = smollm2_demo.load_pair(args.target, args.draft,
                                                               args.copies, args.n)
  rows = compare(decoders(target, draft, args.variants, args.max_new_tokens, args.temperature),
                 prompts, lengths)
  for row in rows if args.temperature > 0 else ():
    row['identical'] = None  # sampled outputs differ from the baseline's draws
  print(report.markdown_table(rows, COLUMNS))
  print(json.dumps({'temperature': args.temperature, 'rows': rows}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
