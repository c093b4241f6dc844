"""Table 2 on one (target, draft) pair: what the demo and scripts/walltime.py run.

`walltime_experiment` measures c and r(K); per sampling setting it measures
alpha on the inputs and chooses gamma by eq. (5) with the measured r and
c_first; then it times every setting's baseline and speculative decoders at
batch 1 in one interleaved run, and scores the outputs (BLEU or ROUGE). Its
records feed `report.write_report`. The draft is a T5Model or any provider of
`spec_decode.models.drafts` (`draft_provider` builds one by name); `task_inputs`,
`output_quality`, `tokens_per_second` and `ratio_stderr` serve the studies of
scripts/studies/ too.
"""

import dataclasses
import functools
import pathlib
import sys
from typing import Sequence

import jax
import numpy as np

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode.models import drafts
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import step_costs
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import theory
from spec_decode.training import metrics


METRICS = {'demo_ende': metrics.bleu, 'demo_multi30k': metrics.bleu,
           'demo_debsum': metrics.rouge}


DRAFT_KINDS = ('unigram', 'bigram', 'prompt_lookup', 'uniform')


def draft_provider(kind: str, vocab_size: int, task: str = 'demo_ende',
                   cache_dir: str | pathlib.Path | None = None) -> models.Model:
  """A draft provider by name (one of DRAFT_KINDS).

  Args:
    kind: 'unigram' or 'bigram' (tables estimated from the task's training
      targets), 'prompt_lookup' or 'uniform'.
    vocab_size: the target's V.
    task: a local task, for the tables.
    cache_dir: where the tokenized training targets are cached (tables).
  """
  if kind in ('unigram', 'bigram'):
    stream = loading.target_token_stream(task, 'train', cache_dir=cache_dir)
    return drafts.TableDraft.estimate(stream, vocab_size, order=1 if kind == 'unigram' else 2)
  if kind == 'prompt_lookup':
    return drafts.PromptLookupDraft(vocab_size)
  if kind == 'uniform':
    return drafts.UniformDraft(vocab_size)
  raise ValueError(f'unknown draft kind {kind!r}; expected one of {DRAFT_KINDS}')


def task_inputs(task: str, split: str, n: int, max_input_len: int
                 ) -> tuple[np.ndarray, list[str]]:
  """The first n inputs of a split, encoded to one shape, and their references."""
  examples = data.load_examples(task, split, n)
  inputs = loading.encode_texts([e['inputs'] for e in examples], max_input_len)
  return inputs, [e['targets'] for e in examples]


def output_quality(task: str, references: list[str], tokens: list[list[int]]) -> dict[str, float]:
  """The task's quality metric of decoded tokens; {} where its library is not installed."""
  metric = METRICS[task]
  library = metrics.missing(metric.__name__)
  if library:
    _note_missing(library)
    return {}
  return metric(references, [loading.detokenize(t) for t in tokens])


@functools.cache
def _note_missing(library: str) -> None:
  print(f'quality metrics left out: {library} is not installed '
        "(pip install 'spec_decode[harness]')", file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class WalltimeSettings:
  """What to decode and how long to measure.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs.
    temperatures: 0 is greedy.
    gamma_max: largest gamma `theory.best_gamma_along` considers.
    gammas: gammas timed besides the chosen one (the speedup-vs-gamma plot).
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    batch_size: rows per alpha pass.
    repeats: timed runs per input (median).
    num_steps: steps per timed loop for c and r(K).
    parts_rounds: rounds of c, c_first and r(K) (`step_costs.StepCostRounds`)
      spread between the inputs of the timed loops; the predictions use
      them. gamma is chosen with a timing of its own before the loops.
    seed: PRNG seed (input i uses fold_in(key(seed), i)).
    t5x_baseline: also time T5X's `decoding.temperature_sample` (needs t5x).
    truncations: (top_k, top_p) pairs also run at temperature 1, e.g.
      ((40, 1.0), (0, 0.9)): top-k 40, and nucleus 0.9.
    untruncated_draft: with top-k or top-p, q samples at the temperature alone
      (`SamplingParams.untruncated()`; the output stays exactly p's): it skips
      the truncation at every draft step. alpha is then measured between
      the truncated p and the untruncated q, and the rows say so
      (`q_untruncated`).
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
  parts_rounds: int = 6
  seed: int = 0
  t5x_baseline: bool = False
  truncations: Sequence[tuple[int, float]] = ()
  untruncated_draft: bool = True

  def sampling_settings(self) -> list[tuple[float, int, float]]:
    """(temperature, top_k, top_p) of every walltime table row group."""
    return ([(float(t), 0, 1.0) for t in self.temperatures]
            + [(1.0, int(k), float(p)) for k, p in self.truncations])


def walltime_experiment(target: models.T5Model, draft: loading.Draft, draft_name: str,
                        settings: WalltimeSettings, target_name: str = 'target'
                        ) -> tuple[list[dict], list[dict], dict]:
  """Runs Table 2 for one pair; returns (alpha rows, walltime rows, timing row).

  The draft is a T5Model or a draft provider (a table or prompt lookup: c ~ 0).
  Every sampling setting's decoders (baseline, each gamma) are timed in one
  interleaved run (`walltime.time_decoding`), so that the settings' speedups,
  and their ratios (`add_knob_ratios`), are not measured minutes apart on a
  machine whose speed drifts.
  """
  s = settings
  inputs, references = task_inputs(s.task, s.split, s.n, s.max_input_len)
  rng = jax.random.key(s.seed)

  rounds = step_costs.StepCostRounds(
      target, draft, loading.trim_padding(inputs[0])[None],  # as time_decoding cuts it
      k_max=max((s.gamma_max, *s.gammas)) + 1, max_decode_len=s.max_decode_len,
      num_steps=s.num_steps)
  times = rounds.timed(5, progress=True)  # picks gamma
  print(f'c = {times.c:.4f} (first draft step after a target call: {times.c_first:.4f}), '
        f'r(K) = {np.round(times.r, 3).tolist()}', file=sys.stderr)

  # plans: (label, knobs, AlphaStats, best gamma, gammas)
  alpha_rows, plans = [], []
  decoders = {}
  for temperature, top_k, top_p in s.sampling_settings():
    sampling = sampling_lib.SamplingParams.create(temperature, top_k, top_p)
    untruncated = s.untruncated_draft and (top_k > 0 or top_p < 1.0)
    draft_sampling = sampling.untruncated() if untruncated else None
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                 **({'q_untruncated': True} if untruncated else {}))
    tokens, lengths = alpha_lib.generate_sequences(
        target, inputs, sampling=sampling, max_decode_len=s.max_decode_len, rng=rng,
        batch_size=s.batch_size, progress=True)
    stats = alpha_lib.measure_alpha(target, draft, inputs, tokens, lengths, sampling=sampling,
                                     batch_size=s.batch_size, draft_sampling=draft_sampling)
    alpha_rows.append(dict(task=s.task, target=target_name, draft=draft_name, **knobs,
                           **stats.row()))
    # Along the target's outputs, not at alpha everywhere: acceptance varies by position.
    best, curve = theory.best_gamma_along(stats.betas, times.c, s.gamma_max, times.r,
                                          times.c_first)
    predicted = curve[best - 1]
    label = report.knobs_label(knobs)
    print(f'{label}: alpha {stats.alpha:.4f}, best gamma {best} '
          f'(predicted {float(predicted):.2f}X)', file=sys.stderr)
    gammas = sorted(set(s.gammas) | {best})
    plans.append((label, knobs, stats, best, gammas))
    decoders[label, 'baseline'] = walltime.baseline_decoder(
        target, max_decode_len=s.max_decode_len, sampling=sampling)
    if s.t5x_baseline:
      decoders[label, 't5x'] = walltime.t5x_baseline_decoder(
          target, max_decode_len=s.max_decode_len, sampling=sampling)
    decoders.update({(label, f'gamma={g}'): walltime.speculative_decoder(
        target, draft, gamma=g, max_decode_len=s.max_decode_len, sampling=sampling,
        draft_sampling=draft_sampling) for g in gammas})
  # The predictions' parts are timed between the inputs the loops decode, not minutes
  # before them: a shared machine's speed drifts. So are whole iterations of the
  # gammas decoded (what an iteration's model calls cost together) and the models'
  # starts at the inputs' lengths (what each input pays once).
  rounds.add_iterations(sorted({g for plan in plans for g in plan[4]}))
  rounds.add_starts([loading.trim_padding(row)[None] for row in inputs])
  rounds.clear()
  every = max(1, len(inputs) // s.parts_rounds)
  decoded = walltime.time_decoding(
      decoders, inputs, rng, repeats=s.repeats, progress=True,
      between=lambda i: rounds.round() if i % every == every - 1 or i == len(inputs) - 1 else None)
  chosen_with, times = times, rounds.times()
  print(f'between the loops: c = {times.c:.4f} (first: {times.c_first:.4f}), '
        f'r(K) = {np.round(times.r, 3).tolist()}, i(gamma) = '
        f'{ {g: round(times.iteration_cost(g), 3) for g in times.iteration_s} }', file=sys.stderr)

  walltime_rows = []
  for label, knobs, stats, best, gammas in plans:
    # The speedup-vs-gamma plot's prediction, from the parts timed between the loops.
    _, curve = theory.best_gamma_along(stats.betas, times.c, s.gamma_max, times.r, times.c_first)
    baseline = decoded[label, 'baseline']
    if s.t5x_baseline:
      t5x = decoded[label, 't5x']
      same = np.mean([a == b for a, b in zip(t5x.tokens, baseline.tokens)])
      ratio = tokens_per_second(baseline) / tokens_per_second(t5x)
      print(f'{label}: T5X temperature_sample: {ratio:.2f}x our baseline\'s time per token; '
            f'outputs equal ours: {same:.2f}', file=sys.stderr)
    quality = {g: output_quality(s.task, references, decoded[label, f'gamma={g}'].tokens)
               for g in gammas}
    quality_baseline = output_quality(s.task, references, baseline.tokens)
    for g in gammas:
      row = dict(task=s.task, draft=draft_name, **knobs, chosen=g == best,
                 **walltime.summarize(baseline, decoded[label, f'gamma={g}'], gamma=g,
                                      alpha=stats.alpha, times=times, betas=stats.betas))
      row['positional_curve'] = curve.tolist()
      row['metrics'] = ' '.join(quality_baseline)
      for metric, value in quality_baseline.items():
        row.update({f'{metric}_baseline': value, f'{metric}_speculative': quality[g][metric]})
      walltime_rows.append(row)
      whole, decode = row.get('predicted_iteration_speedup'), row.get('predicted_decode_speedup')
      print(f'{label}, gamma {g}: {row["measured_speedup"]:.2f}X measured, '
            f'{row["predicted_speedup"]:.2f}X predicted'
            + (f' ({whole:.2f}X with whole iterations timed)' if whole else '')
            + (f', {decode:.2f}X for whole decodes with each input\'s start' if decode else ''),
            file=sys.stderr)
  add_knob_ratios(walltime_rows)
  return alpha_rows, walltime_rows, dict(times.row(), gamma_chosen_with=chosen_with.row())


def add_knob_ratios(rows: list[dict]) -> None:
  """Adds each chosen top-k/top-p row's speedup and baseline cost over plain sampling's.

  For a chosen row with top_k or top_p, and a chosen row of plain sampling at
  the same temperature and task/draft: `speedup_over_plain` (its measured
  speedup over the plain row's) and `baseline_over_plain` (its baseline
  ms/token over the plain row's). Rows from one `walltime_experiment` come from
  one interleaved run.
  """
  plain = {(r['task'], r['draft'], r['temperature']): r for r in rows
           if r['chosen'] and r.get('top_k', 0) == 0 and r.get('top_p', 1.0) == 1.0}
  for row in rows:
    reference = plain.get((row['task'], row['draft'], row['temperature']))
    if row['chosen'] and reference is not None and reference is not row:
      row['speedup_over_plain'] = row['measured_speedup'] / reference['measured_speedup']
      row['baseline_over_plain'] = row['baseline_token_ms'] / reference['baseline_token_ms']


def tokens_per_second(decoded: walltime.Decoded) -> float:
  """Generated tokens over the seconds the decodes took, summed over the inputs."""
  return decoded.generated / decoded.total_s


def ratio_stderr(tokens: np.ndarray, calls: np.ndarray) -> tuple[float, float]:
  """sum(tokens) / sum(calls) over rows and its standard error (delta method).

  Args:
    tokens: [M] generated tokens per row.
    calls: [M] target calls per row.
  """
  tokens, calls = np.asarray(tokens, np.float64), np.asarray(calls, np.float64)
  ratio = tokens.sum() / calls.sum()
  m = len(tokens)
  if m < 2:
    return float(ratio), float('nan')
  residual = tokens - ratio * calls
  return float(ratio), float(np.sqrt(np.sum(residual ** 2) / (m * (m - 1))) / calls.mean())
