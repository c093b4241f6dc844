"""Walltime of speculative decoding for a decoder-only pair (the paper's Table 2, GPT-like).

  python scripts/lm_walltime.py --n 50 --gammas 2 3 5 --out_dir out/lm_walltime

The T5 pair's harness (spec_decode.harness.walltime, step_costs) over the
decoder-only models (spec_decode.models.decoder_only): per temperature, alpha over the
target's continuations of N test prompts (scripts/lm_alpha.py's), c, c_first
and r(K) timed in compiled loops, then every prompt decoded alone (batch 1)
by the baseline and by speculative decoding at each gamma, interleaved,
median of --repeats; measured speedup against eq. (5) from the measured
parts. Defaults: the bundled pair.
"""

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.models import alpha as alpha_lib
from spec_decode.models import decoder_only
from spec_decode.harness import step_costs
from spec_decode.harness import walltime
from spec_decode.text import EOS_ID
from spec_decode.training import lm as lm_training


COLUMNS = ('gamma', 'alpha', 'c', 'c_first', 'r', 'measured_speedup', 'predicted_speedup',
           'tokens_per_call', 'expected_tokens_per_call', 'identical')


def decoder(target, draft, gamma: int, max_decode_len: int, sampling):
  """decode(prompts [1, S] 0-padded, keys [1]) -> DecodeOutput, as walltime's decoders."""
  def decode(prompts, keys):
    lengths = jnp.sum(prompts != 0, axis=1).astype(jnp.int32)
    if draft is None:
      return models.generate(target, prompts, keys, lengths=lengths,
                             max_decode_len=max_decode_len, eos_id=EOS_ID, sampling=sampling)
    return models.speculative_generate(target, draft, prompts, keys, lengths=lengths, gamma=gamma,
                                       max_decode_len=max_decode_len, eos_id=EOS_ID,
                                       sampling=sampling)
  return decode


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target', help='a checkpoint of lm_target\'s size; default the bundled one')
  parser.add_argument('--draft', help='a checkpoint of lm_draft\'s size; default the bundled one')
  parser.add_argument('--n', type=int, default=50)
  parser.add_argument('--prompt_tokens', type=int, default=3)
  parser.add_argument('--max_decode_len', type=int, default=32)
  parser.add_argument('--gammas', type=int, nargs='+', default=[2, 3, 5])
  parser.add_argument('--temperatures', type=float, nargs='+', default=[0.0, 1.0])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out_dir')
  args = parser.parse_args(argv)

  target = decoder_only.load_bundled('lm_target', path=args.target)
  draft = decoder_only.load_bundled('lm_draft', path=args.draft)
  tokens, lengths = lm_training.prompts_from_test(args.n, args.prompt_tokens)
  one = tokens[:1, :lengths[0]]  # a real prompt without padding, for the step costs
  times = step_costs.measure_step_times(target, draft, one, k_max=max(args.gammas) + 1,
                                        max_decode_len=args.max_decode_len, progress=True)
  rows = []
  for temperature in args.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    outputs, output_lengths = alpha_lib.generate_sequences(
        target, tokens, lengths=lengths, sampling=sampling, max_decode_len=args.max_decode_len,
        rng=jax.random.key(args.seed), batch_size=64)
    stats = alpha_lib.measure_alpha(target, draft, tokens, outputs, output_lengths,
                                    lengths=lengths, sampling=sampling, batch_size=64)
    decoders = {'baseline': decoder(target, None, 0, args.max_decode_len, sampling),
                **{g: decoder(target, draft, g, args.max_decode_len, sampling)
                   for g in args.gammas}}
    decoded = walltime.time_decoding(decoders, tokens, jax.random.key(args.seed),
                                     repeats=args.repeats, progress=True)
    for g in args.gammas:
      record = walltime.summarize(decoded['baseline'], decoded[g], gamma=g, alpha=stats.alpha,
                                  times=times, betas=stats.betas)
      rows.append({'temperature': temperature, **record})
      print(f'T={temperature:g} ' + ' '.join(f'{k}={record[k]:.3f}' for k in COLUMNS),
            flush=True)
  lines = ['| T | ' + ' | '.join(COLUMNS) + ' | measured / predicted |',
           '| --- ' * (len(COLUMNS) + 2) + '|']
  for r in rows:
    lines.append(f'| {r["temperature"]:g} | ' + ' | '.join(
        f'{r[k]:.3f}' if k != 'gamma' else str(r[k]) for k in COLUMNS)
        + f' | {r["measured_speedup"] / r["predicted_speedup"]:.2f} |')
  print('\n'.join(lines))
  if args.out_dir:
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'walltime.json').write_text(json.dumps(
        {'args': vars(args), 'step_times': times.row(), 'rows': rows}, indent=1, default=float))
    (out / 'walltime_lm.md').write_text('\n'.join(lines) + '\n')
  return 0


if __name__ == '__main__':
  sys.exit(main())
