"""The paper's Table 2 experiment on one (target, draft) pair, as a function.

`walltime_experiment` is what `scripts/walltime.py` and the README's main
command (`python -m spec_decode.demo`) run: measure c and r(K); per
temperature measure alpha on the inputs, choose gamma by eq. (5) with the
measured r, time the baseline and speculative decoding at batch 1, and score
both outputs (BLEU or ROUGE). Its records feed `report.write_report`.
"""

import dataclasses
import sys
from typing import Sequence

import jax
import numpy as np

from spec_decode import data
from spec_decode import measure
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import tasks
from spec_decode import theory

METRICS = {'demo_ende': tasks.bleu, 'demo_debsum': tasks.rouge}


@dataclasses.dataclass(frozen=True)
class WalltimeSettings:
  """What to decode and how long to measure.

  Attributes:
    task: a local task ('demo_ende' or 'demo_debsum').
    split: its test split.
    n: the first n inputs.
    temperatures: 0 is greedy.
    gamma_max: largest gamma `theory.best_gamma` considers.
    gammas: gammas timed besides the chosen one (the speedup-vs-gamma plot).
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    batch_size: rows per alpha pass.
    repeats: timed runs per input (median).
    num_steps: steps per timed loop for c and r(K).
    seed: PRNG seed (input i uses fold_in(key(seed), i)).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 100
  temperatures: Sequence[float] = (0.0, 1.0)
  gamma_max: int = 8
  gammas: Sequence[int] = (1, 2, 3, 5)
  max_input_len: int = 256
  max_decode_len: int = 128
  batch_size: int = 16
  repeats: int = 3
  num_steps: int = 64
  seed: int = 0


def walltime_experiment(target: models.T5Model, draft: models.T5Model, draft_name: str,
                        settings: WalltimeSettings, target_name: str = 'target'
                        ) -> tuple[list[dict], list[dict], dict]:
  """Runs Table 2 for one pair; returns (alpha rows, walltime rows, timing row)."""
  s = settings
  examples = data.load_examples(s.task, s.split, s.n)
  references = [e['targets'] for e in examples]
  inputs = measure.encode_texts([e['inputs'] for e in examples], s.max_input_len)
  rng = jax.random.key(s.seed)

  times = measure.measure_step_times(
      target, draft, inputs[:1], k_max=max((s.gamma_max, *s.gammas)) + 1,
      max_decode_len=s.max_decode_len, num_steps=s.num_steps, progress=True)
  print(f'c = {times.c:.4f}, r(K) = {np.round(times.r, 3).tolist()}', file=sys.stderr)

  alpha_rows, walltime_rows = [], []
  for temperature in s.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    tokens, lengths = measure.generate_sequences(
        target, inputs, sampling=sampling, max_decode_len=s.max_decode_len, rng=rng,
        batch_size=s.batch_size, progress=True)
    stats = measure.measure_alpha(target, draft, inputs, tokens, lengths, sampling=sampling,
                                  batch_size=s.batch_size)
    alpha_rows.append(dict(task=s.task, target=target_name, draft=draft_name,
                           temperature=temperature, **stats.row()))
    best, predicted = theory.best_gamma(stats.alpha, times.c, s.gamma_max, times.r)
    best = int(best)
    print(f'T={temperature:g}: alpha {stats.alpha:.4f}, best gamma {best} (predicted '
          f'{float(predicted):.2f}X)', file=sys.stderr)

    gammas = sorted(set(s.gammas) | {best})
    decoders = {'baseline': measure.baseline_decoder(
        target, max_decode_len=s.max_decode_len, sampling=sampling)}
    decoders.update({f'gamma={g}': measure.speculative_decoder(
        target, draft, gamma=g, max_decode_len=s.max_decode_len, sampling=sampling)
                     for g in gammas})
    decoded = measure.time_decoding(decoders, inputs, rng, repeats=s.repeats, progress=True)
    baseline = decoded['baseline']
    quality = {name: METRICS[s.task](references, [measure.detokenize(t) for t in out.tokens])
               for name, out in decoded.items()}
    for g in gammas:
      row = dict(task=s.task, draft=draft_name, temperature=temperature, chosen=g == best,
                 **measure.summarize(baseline, decoded[f'gamma={g}'], gamma=g, alpha=stats.alpha,
                                     times=times))
      row['metrics'] = ' '.join(quality['baseline'])
      for metric, value in quality['baseline'].items():
        row.update({f'{metric}_baseline': value,
                    f'{metric}_speculative': quality[f'gamma={g}'][metric]})
      walltime_rows.append(row)
      print(f'  gamma {g}: {row["measured_speedup"]:.2f}X measured, '
            f'{row["predicted_speedup"]:.2f}X predicted', file=sys.stderr)
  return alpha_rows, walltime_rows, times.row()
