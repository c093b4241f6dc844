"""The paper's experiments on one (target, draft) pair, as functions.

`walltime_experiment` (Table 2) is what `scripts/walltime.py` and the README's
main command (`python -m spec_decode.demo`) run: measure c and r(K); per
temperature measure alpha on the inputs, choose gamma by eq. (5) with the
measured r, time the baseline and speculative decoding at batch 1, and score
both outputs (BLEU or ROUGE). Its records feed `report.write_report`.

`lenience_experiment` (Table 5, Appendix A.5): alpha, tokens per call and the
walltime speedup at batch 1 for each lenience l, with the output quality that
l < 1 trades for them (`scripts/lenience.py`).

`batch_walltime_experiment`: throughput of the baseline and of speculative
decoding at batch sizes 1..16, and where speculation stops paying on this
hardware (`scripts/batch_walltime.py`).

The draft is a T5Model or any provider of `spec_decode.drafts`
(`draft_provider` builds one by name).
"""

import dataclasses
import functools
import os
import pathlib
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np

from spec_decode import data
from spec_decode import drafts
from spec_decode import measure
from spec_decode import models
from spec_decode import report
from spec_decode import sampling as sampling_lib
from spec_decode import tasks
from spec_decode import theory

METRICS = {'demo_ende': tasks.bleu, 'demo_multi30k': tasks.bleu, 'demo_debsum': tasks.rouge}
DRAFT_KINDS = ('unigram', 'bigram', 'prompt_lookup', 'uniform')


def draft_provider(kind: str, vocab_size: int, task: str = 'demo_ende',
                   cache_dir: str | pathlib.Path | None = None) -> drafts.DraftProvider:
  """A draft provider by name (one of DRAFT_KINDS).

  Args:
    kind: 'unigram' or 'bigram' (tables estimated from the task's training
      targets), 'prompt_lookup' or 'uniform'.
    vocab_size: the target's V.
    task: a local task, for the tables.
    cache_dir: where the tokenized training targets are cached (tables).
  """
  if kind in ('unigram', 'bigram'):
    stream = measure.target_token_stream(task, 'train', cache_dir=cache_dir)
    return drafts.TableDraft.estimate(stream, vocab_size, order=1 if kind == 'unigram' else 2)
  if kind == 'prompt_lookup':
    return drafts.PromptLookupDraft(vocab_size)
  if kind == 'uniform':
    return drafts.UniformDraft(vocab_size)
  raise ValueError(f'unknown draft kind {kind!r}; expected one of {DRAFT_KINDS}')


def alpha_from_histogram(accept_histogram: Sequence[int]) -> float:
  """alpha estimated from the loop's accept histogram.

  An iteration that accepted n of gamma drafts tested min(n + 1, gamma) of
  them (those after the first rejection never reach the test) and accepted n.
  Under eq. (1)'s i.i.d. model each tested draft is accepted with probability
  alpha, so accepted / tested is its maximum-likelihood estimate (accepted /
  proposed would count the untested drafts as rejections and is biased low).

  Args:
    accept_histogram: [gamma + 1] counts of iterations that accepted 0..gamma.
  """
  histogram = np.asarray(accept_histogram, np.float64)
  n = np.arange(len(histogram))
  tested = np.sum(histogram * np.minimum(n + 1, len(histogram) - 1))
  return float(np.sum(histogram * n) / tested) if tested else float('nan')


def _task_inputs(task: str, split: str, n: int, max_input_len: int
                 ) -> tuple[np.ndarray, list[str]]:
  """The first n inputs of a split, encoded to one shape, and their references."""
  examples = data.load_examples(task, split, n)
  inputs = measure.encode_texts([e['inputs'] for e in examples], max_input_len)
  return inputs, [e['targets'] for e in examples]


def _quality(task: str, references: list[str], tokens: list[list[int]]) -> dict[str, float]:
  return METRICS[task](references, [measure.detokenize(t) for t in tokens])


# ---------------------------------------------------------------------------
# Table 2: walltime at batch 1.


@dataclasses.dataclass(frozen=True)
class WalltimeSettings:
  """What to decode and how long to measure.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
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
    t5x_baseline: also time T5X's `decoding.temperature_sample` (needs t5x).
    truncations: (top_k, top_p) pairs also run at temperature 1, e.g.
      ((40, 1.0), (0, 0.9)): top-k 40, and nucleus 0.9.
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
  t5x_baseline: bool = False
  truncations: Sequence[tuple[int, float]] = ()

  def sampling_settings(self) -> list[tuple[float, int, float]]:
    """(temperature, top_k, top_p) of every walltime table row group."""
    return ([(float(t), 0, 1.0) for t in self.temperatures]
            + [(1.0, int(k), float(p)) for k, p in self.truncations])


def walltime_experiment(target: models.T5Model, draft: measure.Draft, draft_name: str,
                        settings: WalltimeSettings, target_name: str = 'target'
                        ) -> tuple[list[dict], list[dict], dict]:
  """Runs Table 2 for one pair; returns (alpha rows, walltime rows, timing row).

  The draft is a T5Model or a draft provider (a table or prompt lookup: c ~ 0).
  """
  s = settings
  inputs, references = _task_inputs(s.task, s.split, s.n, s.max_input_len)
  rng = jax.random.key(s.seed)

  times = measure.measure_step_times(
      target, draft, inputs[:1], k_max=max((s.gamma_max, *s.gammas)) + 1,
      max_decode_len=s.max_decode_len, num_steps=s.num_steps, progress=True)
  print(f'c = {times.c:.4f} (first draft step after a target call: {times.c_first:.4f}), '
        f'r(K) = {np.round(times.r, 3).tolist()}', file=sys.stderr)

  alpha_rows, walltime_rows = [], []
  for temperature, top_k, top_p in s.sampling_settings():
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    sampling = sampling_lib.SamplingParams.create(**knobs)
    tokens, lengths = measure.generate_sequences(
        target, inputs, sampling=sampling, max_decode_len=s.max_decode_len, rng=rng,
        batch_size=s.batch_size, progress=True)
    stats = measure.measure_alpha(target, draft, inputs, tokens, lengths, sampling=sampling,
                                  batch_size=s.batch_size)
    alpha_rows.append(dict(task=s.task, target=target_name, draft=draft_name, **knobs,
                           **stats.row()))
    best, predicted = theory.best_gamma(stats.alpha, times.c, s.gamma_max, times.r,
                                        times.c_first)
    best = int(best)
    print(f'{report.knobs_label(knobs)}: alpha {stats.alpha:.4f}, best gamma {best} '
          f'(predicted {float(predicted):.2f}X)', file=sys.stderr)

    gammas = sorted(set(s.gammas) | {best})
    decoders = {'baseline': measure.baseline_decoder(
        target, max_decode_len=s.max_decode_len, sampling=sampling)}
    if s.t5x_baseline:
      decoders['t5x'] = measure.t5x_baseline_decoder(
          target, max_decode_len=s.max_decode_len, sampling=sampling)
    decoders.update({f'gamma={g}': measure.speculative_decoder(
        target, draft, gamma=g, max_decode_len=s.max_decode_len, sampling=sampling)
                     for g in gammas})
    decoded = measure.time_decoding(decoders, inputs, rng, repeats=s.repeats, progress=True)
    baseline = decoded['baseline']
    if s.t5x_baseline:
      t5x = decoded.pop('t5x')
      print(f'  T5X temperature_sample: {t5x.total_s / baseline.total_s:.2f}x our baseline\'s '
            f'time; outputs equal ours: {np.mean([a == b for a, b in zip(t5x.tokens, baseline.tokens)]):.2f}',
            file=sys.stderr)
    quality = {name: _quality(s.task, references, out.tokens) for name, out in decoded.items()}
    for g in gammas:
      row = dict(task=s.task, draft=draft_name, **knobs, chosen=g == best,
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


def _tokens_per_second(decoded: measure.Decoded) -> float:
  return sum(map(len, decoded.tokens)) / decoded.total_s


def _metric_cells(row: dict) -> str:
  return ', '.join(f'{m} {row[m + "_baseline"]:.1f} / {row[m + "_speculative"]:.1f}'
                   for m in row['metrics'].split())


# ---------------------------------------------------------------------------
# Table 5: lenience (Appendix A.5).

LENIENCE_CAVEAT = (
    'l = 1 is exact: the outputs are distributed as the target\'s own samples. l < 1 '
    '(Appendix A.5) multiplies q by l in the accept test and in the residual, so more drafts '
    'are accepted and the outputs are **no longer distributed as the target\'s**: they drift '
    'towards the draft. The quality column shows what that costs.')
LENIENCE_COLUMNS: tuple[report.Column, ...] = (
    ('l', lambda r: f'{r["lenience"]:g}'),
    ('exact', lambda r: 'yes' if r['exact'] else 'no (not p)'),
    ('alpha', lambda r: f'{r["alpha"]:.3f}'),
    ('tokens/call (eq. (1))',
     lambda r: f'{r["tokens_per_call"]:.2f} ({r["expected_tokens_per_call"]:.2f})'),
    ('speedup', lambda r: f'{r["speedup"]:.2f}X'),
    ('quality: baseline / speculative', _metric_cells),
)


@dataclasses.dataclass(frozen=True)
class LenienceSettings:
  """What Table 5 decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs.
    lenience: the values of l; 1 is exact.
    temperature: sampling temperature (the paper's Table 5: 1).
    gamma: draft length.
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    repeats: timed runs per input (median).
    seed: PRNG seed (input i uses fold_in(key(seed), i)).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 50
  lenience: Sequence[float] = (1.0, 0.5, 0.3, 0.1)
  temperature: float = 1.0
  gamma: int = 3
  max_input_len: int = 256
  max_decode_len: int = 64
  repeats: int = 2
  seed: int = 0


def lenience_experiment(target: models.T5Model, draft: measure.Draft, draft_name: str,
                        settings: LenienceSettings) -> list[dict]:
  """Table 5: alpha, tokens per call and speedup for each lenience l.

  Every input is decoded alone (batch 1) by the baseline and by speculative
  decoding at each l (one compiled function: l is traced), timed as Table 2.
  alpha is `alpha_from_histogram` of the loop's accepted drafts; the speedup
  is the ratio of seconds per generated token (sampled outputs differ in
  length from one decoder to another).

  Returns:
    One row per l: task, draft, temperature, gamma, lenience, exact, alpha,
    tokens_per_call, expected_tokens_per_call (eq. (1) at that alpha),
    speedup, baseline_s, speculative_s, accept_histogram, metrics and
    `<metric>_baseline` / `<metric>_speculative` for each metric.
  """
  s = settings
  if any(not 0 < l <= 1 for l in s.lenience):
    raise ValueError(f'lenience values must lie in (0, 1], got {s.lenience}')
  inputs, references = _task_inputs(s.task, s.split, s.n, s.max_input_len)
  sampling = sampling_lib.SamplingParams.create(s.temperature)
  decoders = {'baseline': measure.baseline_decoder(target, max_decode_len=s.max_decode_len,
                                                   sampling=sampling)}
  decoders.update({f'l={l:g}': measure.speculative_decoder(
      target, draft, gamma=s.gamma, max_decode_len=s.max_decode_len, sampling=sampling,
      lenience=l) for l in s.lenience})
  decoded = measure.time_decoding(decoders, inputs, jax.random.key(s.seed), repeats=s.repeats,
                                  progress=True)
  baseline = decoded['baseline']
  baseline_quality = _quality(s.task, references, baseline.tokens)
  rows = []
  for l in s.lenience:
    out = decoded[f'l={l:g}']
    alpha = alpha_from_histogram(out.accept_histogram)
    row = dict(task=s.task, draft=draft_name, temperature=s.temperature, gamma=s.gamma,
               lenience=l, exact=l == 1.0, alpha=alpha, tokens_per_call=out.tokens_per_call,
               expected_tokens_per_call=float(theory.expected_tokens(alpha, s.gamma)),
               speedup=_tokens_per_second(out) / _tokens_per_second(baseline),
               baseline_s=baseline.total_s, speculative_s=out.total_s,
               accept_histogram=out.accept_histogram.tolist(), metrics=' '.join(baseline_quality))
    for metric, value in _quality(s.task, references, out.tokens).items():
      row.update({f'{metric}_baseline': baseline_quality[metric], f'{metric}_speculative': value})
    rows.append(row)
    print(f'l={l:g}: alpha {alpha:.3f}, {row["speedup"]:.2f}X', file=sys.stderr)
  return rows


def write_lenience_report(out_dir: str | pathlib.Path, rows: Sequence[dict],
                          notes: str = '') -> list[pathlib.Path]:
  """lenience.md (the table, the exactness caveat, `notes`) and lenience.csv."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  r = rows[0]
  sections = ['# Lenience (Table 5, Appendix A.5)', notes,
              f'{r["task"]}, draft {r["draft"]}, T = {r["temperature"]:g}, gamma = {r["gamma"]}, '
              'batch 1. alpha = accepted / tested drafts (`experiments.alpha_from_histogram`); '
              'speedup = seconds per token of the baseline / of speculative decoding.',
              report.markdown_table(rows, LENIENCE_COLUMNS), f'**Exactness.** {LENIENCE_CAVEAT}']
  paths = [out / 'lenience.md', out / 'lenience.csv']
  paths[0].write_text('\n\n'.join(x for x in sections if x) + '\n', encoding='utf-8')
  report.write_csv(paths[1], rows)
  return paths


# ---------------------------------------------------------------------------
# Speculation in batches.

BATCH_COLUMNS: tuple[report.Column, ...] = (
    ('T', lambda r: f'{r["temperature"]:g}'),
    ('batch', lambda r: str(r['batch_size'])),
    ('baseline tokens/s', lambda r: f'{r["baseline_tokens_per_s"]:.1f}'),
    ('speculative tokens/s', lambda r: f'{r["speculative_tokens_per_s"]:.1f}'),
    ('speedup', lambda r: f'{r["speedup"]:.2f}X'),
    ('alpha', lambda r: f'{r["alpha"]:.3f}'),
    ('tokens/call per row', lambda r: f'{r["tokens_per_call"]:.2f}'),
    ('row utilisation: baseline / speculative',
     lambda r: f'{r["baseline_utilisation"]:.2f} / {r["speculative_utilisation"]:.2f}'),
    ('greedy identical', report.identical_cell),
)


@dataclasses.dataclass(frozen=True)
class BatchSettings:
  """What the batch walltime table decodes.

  Attributes:
    task: a local task (one of data.LOCAL_TASKS).
    split: its test split.
    n: the first n inputs; every batch size must divide n.
    batch_sizes: rows per decoder call.
    temperatures: 0 is greedy.
    gamma: draft length.
    max_input_len: longer inputs are cut.
    max_decode_len: most generated tokens per input.
    repeats: timed runs per batch (median).
    seed: PRNG seed (input i uses fold_in(key(seed), i) at every batch size).
  """

  task: str = 'demo_ende'
  split: str = 'test_multi30k'
  n: int = 32
  batch_sizes: Sequence[int] = (1, 2, 4, 8, 16)
  temperatures: Sequence[float] = (0.0, 1.0)
  gamma: int = 3
  max_input_len: int = 256
  max_decode_len: int = 64
  repeats: int = 2
  seed: int = 0


def _time_batches(decoders: dict[str, measure.DecodeFn], inputs: np.ndarray, keys: jax.Array,
                  batch_size: int, repeats: int) -> dict[str, dict]:
  """Decodes the inputs in consecutive batches with every decoder, interleaved, timed.

  Returns:
    name -> dict(seconds: total of the per-batch medians, tokens: [N, L]
    outputs, generated: tokens produced, row_calls: target calls summed over
    unfinished rows, loop_calls: batched target calls, accept_histogram).
  """
  batches = [slice(i, i + batch_size) for i in range(0, len(inputs), batch_size)]
  for decode in decoders.values():  # compile and warm up
    jax.block_until_ready(decode(jnp.asarray(inputs[batches[0]]), keys[batches[0]]))
  records = {name: [] for name in decoders}
  for rows in batches:
    x = jnp.asarray(inputs[rows])
    for name, decode in decoders.items():
      seconds, out = measure._timed(  # pylint: disable=protected-access
          lambda: decode(x, keys[rows]), repeats)
      records[name].append((seconds, jax.device_get(out)))
  return {name: dict(
      seconds=sum(t for t, _ in outs),
      tokens=np.concatenate([o.tokens for _, o in outs]),
      generated=int(sum(o.generated.sum() for _, o in outs)),
      row_calls=int(sum(o.target_calls.sum() for _, o in outs)),
      loop_calls=int(sum(o.loop_target_calls for _, o in outs)),
      accept_histogram=np.sum([o.accept_histogram for _, o in outs], axis=0))
          for name, outs in records.items()}


def batch_walltime_experiment(target: models.T5Model, draft: measure.Draft, draft_name: str,
                              settings: BatchSettings) -> list[dict]:
  """Throughput of the baseline and of speculative decoding per batch size.

  The same inputs are decoded in consecutive batches of each size; rows
  advance independently, so input i gives the same output at every batch size
  (key fold_in(key(seed), i)), but a batch runs until its slowest row is done.
  Row utilisation = target calls of unfinished rows / (batch size x batched
  target calls): the share of the batch's work that is not idle rows.

  Returns:
    One row per (temperature, batch size): task, draft, temperature, gamma,
    batch_size, baseline_tokens_per_s, speculative_tokens_per_s, speedup (their
    ratio), alpha (`alpha_from_histogram`), tokens_per_call (per row),
    baseline_utilisation, speculative_utilisation, identical (outputs equal
    the baseline's), baseline_s, speculative_s.
  """
  s = settings
  if any(b < 1 or s.n % b for b in s.batch_sizes):
    raise ValueError(f'every batch size must divide n={s.n}, got {s.batch_sizes}')
  inputs, _ = _task_inputs(s.task, s.split, s.n, s.max_input_len)
  keys = jax.vmap(functools.partial(jax.random.fold_in, jax.random.key(s.seed)))(
      jnp.arange(s.n))
  rows = []
  for temperature in s.temperatures:
    sampling = sampling_lib.SamplingParams.create(temperature)
    decoders = {
        'baseline': measure.baseline_decoder(target, max_decode_len=s.max_decode_len,
                                             sampling=sampling),
        'speculative': measure.speculative_decoder(target, draft, gamma=s.gamma,
                                                   max_decode_len=s.max_decode_len,
                                                   sampling=sampling)}
    for batch_size in s.batch_sizes:
      timed = _time_batches(decoders, inputs, keys, batch_size, s.repeats)
      base, spec = timed['baseline'], timed['speculative']
      row = dict(
          task=s.task, draft=draft_name, temperature=temperature, gamma=s.gamma,
          batch_size=batch_size,
          baseline_tokens_per_s=base['generated'] / base['seconds'],
          speculative_tokens_per_s=spec['generated'] / spec['seconds'],
          alpha=alpha_from_histogram(spec['accept_histogram']),
          tokens_per_call=spec['generated'] / spec['row_calls'],
          baseline_utilisation=base['row_calls'] / (batch_size * base['loop_calls']),
          speculative_utilisation=spec['row_calls'] / (batch_size * spec['loop_calls']),
          identical=bool(np.array_equal(base['tokens'], spec['tokens'])),
          baseline_s=base['seconds'], speculative_s=spec['seconds'])
      row['speedup'] = row['speculative_tokens_per_s'] / row['baseline_tokens_per_s']
      rows.append(row)
      print(f'T={temperature:g} batch {batch_size}: {row["baseline_tokens_per_s"]:.1f} -> '
            f'{row["speculative_tokens_per_s"]:.1f} tokens/s ({row["speedup"]:.2f}X)',
            file=sys.stderr)
  return rows


def break_even(rows: Sequence[dict]) -> str:
  """Per temperature, the batch sizes at which speculation pays and those it does not."""
  lines = []
  for temperature in dict.fromkeys(r['temperature'] for r in rows):
    group = sorted((r for r in rows if r['temperature'] == temperature),
                   key=lambda r: r['batch_size'])
    sizes = lambda keep: ', '.join(str(r['batch_size']) for r in group if keep(r['speedup']))
    faster, slower = sizes(lambda x: x >= 1), sizes(lambda x: x < 1)
    if not slower:
      verdict = f'speculation pays at every batch size tried ({faster})'
    elif not faster:
      verdict = f'speculation is slower than the baseline at every batch size tried ({slower})'
    else:
      verdict = f'speculation pays at batch {faster} and is slower at batch {slower}'
    lines.append(f'- T = {temperature:g}: {verdict}')
  return '\n'.join(lines)


def plot_batch_walltime(path: pathlib.Path, rows: Sequence[dict]) -> None:
  """Tokens/s of both decoders and the speedup against the batch size."""
  fig = Figure(figsize=(9, 3.5))
  FigureCanvasAgg(fig)
  throughput, speedup = fig.subplots(1, 2)
  for temperature in dict.fromkeys(r['temperature'] for r in rows):
    group = sorted((r for r in rows if r['temperature'] == temperature),
                   key=lambda r: r['batch_size'])
    b = [r['batch_size'] for r in group]
    line, = throughput.plot(b, [r['speculative_tokens_per_s'] for r in group], 'o-',
                            label=f'speculative, T = {temperature:g}')
    throughput.plot(b, [r['baseline_tokens_per_s'] for r in group], 's--', color=line.get_color(),
                    label=f'baseline, T = {temperature:g}')
    speedup.plot(b, [r['speedup'] for r in group], 'o-', label=f'T = {temperature:g}')
  sizes = sorted({r['batch_size'] for r in rows})
  speedup.axhline(1.0, color='gray', linewidth=0.8)
  for ax in (throughput, speedup):
    ax.set_xscale('log', base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.legend(fontsize=8)
  throughput.set(xlabel='batch size', ylabel='generated tokens / s', title='Throughput')
  speedup.set(xlabel='batch size', ylabel='speculative / baseline tokens/s',
              title=f'Speedup ({rows[0]["draft"]}, gamma = {rows[0]["gamma"]})')
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def write_batch_report(out_dir: str | pathlib.Path, rows: Sequence[dict],
                       notes: str = '') -> list[pathlib.Path]:
  """batch_walltime.md, batch_walltime.csv and speedup_vs_batch.png."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = [out / 'batch_walltime.md', out / 'batch_walltime.csv', out / 'speedup_vs_batch.png']
  r = rows[0]
  device = jax.devices()[0]
  sections = ['# Speculative decoding in batches', notes,
              f'{r["task"]}, draft {r["draft"]}, gamma = {r["gamma"]}, on {device.platform} '
              f'({device.device_kind}, {os.cpu_count()} CPUs visible). Every batch size decodes '
              'the same inputs in consecutive batches; compile excluded, median over repeats '
              'per batch. Rows advance independently, but a batch runs until its slowest row '
              'ends (row utilisation).',
              report.markdown_table(rows, BATCH_COLUMNS), break_even(rows),
              f'![speedup vs batch size]({paths[2].name})']
  paths[0].write_text('\n\n'.join(x for x in sections if x) + '\n', encoding='utf-8')
  report.write_csv(paths[1], rows)
  plot_batch_walltime(paths[2], rows)
  return paths
