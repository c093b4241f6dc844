"""Measurement results -> a Markdown report with the paper's tables, CSVs, plots.

Results are plain records (dicts of numbers and strings), as
the harness makes them, so a report can be rebuilt from
results.json without a model:

  alpha rows (Table 3): task, target, draft, temperature (top_k, top_p
    optional: 0 and 1 when absent) and the keys of
    `alpha_lib.AlphaStats.row` (alpha, stderr, std, sequences, positions,
    q10 .. q90 of the per-sequence alpha).
  walltime rows (Table 2): task, draft, temperature, top_k, top_p (as
    above), chosen (the gamma
    picked by theory.best_gamma, as opposed to a sweep point), the keys of
    `walltime.summarize`, and optionally metrics (space-separated names, e.g.
    'bleu') with `<name>_baseline` and `<name>_speculative` for each.
  timing: `step_costs.StepTimes.row()` (target/draft step ms, c, verify ms, r).

Files: report.md, results.json, table3_alpha.csv, table2_walltime.csv,
r_vs_k.png, speedup_vs_gamma_<group>.png and tokens_per_call_<group>.png per
(task, draft, sampling knobs) group.
"""

import csv
import json
import pathlib
import re
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from spec_decode.harness import report_plots
from spec_decode import theory


Row = dict[str, Any]


Column = tuple[str, Callable[[Row], str]]


def markdown_table(rows: Sequence[Row], columns: Sequence[Column]) -> str:
  """A Markdown table, one line per row, each cell formatted by its column."""
  lines = [[header for header, _ in columns], ['---'] * len(columns)]
  lines += [[cell(row) for _, cell in columns] for row in rows]
  return '\n'.join('| ' + ' | '.join(line) + ' |' for line in lines)


def write_csv(path: pathlib.Path, rows: Sequence[Row]) -> None:
  """Rows -> CSV with the union of their keys; lists become space-separated."""
  fields = list(dict.fromkeys(key for row in rows for key in row))
  with open(path, 'w', newline='', encoding='utf-8') as f:
    writer = csv.DictWriter(f, fields)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: ' '.join(map(str, v)) if isinstance(v, (list, tuple)) else v
                       for k, v in row.items()})


def write_tables(out_dir: str | pathlib.Path, name: str, sections: Sequence[str],
                 rows: Sequence[Row]) -> list[pathlib.Path]:
  """A study's <name>.md (its Markdown sections) and <name>.csv (its rows).

  Args:
    out_dir: created if missing; files of the same names are replaced.
    name: the files' stem.
    sections: Markdown joined by blank lines; empty ones (e.g. no notes) are left out.
    rows: the CSV's records (`write_csv`).

  Returns:
    [the .md path, the .csv path].
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = [out / f'{name}.md', out / f'{name}.csv']
  paths[0].write_text('\n\n'.join(s for s in sections if s) + '\n', encoding='utf-8')
  write_csv(paths[1], rows)
  return paths


def knobs_label(row: Row) -> str:
  """'T=1', 'T=1 top_k=40', 'T=1 top_p=0.9 (q untruncated)': a row's sampling knobs."""
  label = f'T={row["temperature"]:g}'
  if row.get('top_k', 0) > 0:
    label += f' top_k={row["top_k"]}'
  if row.get('top_p', 1.0) < 1.0:
    label += f' top_p={row["top_p"]:g}'
  if row.get('q_untruncated'):
    label += ' (q untruncated)'
  return label


def _group(row: Row) -> tuple[str, str, str]:
  return row['task'], row['draft'], knobs_label(row)


def _slug(group: tuple[str, str, str]) -> str:
  task, draft, knobs = group
  return re.sub(r'[^A-Za-z0-9_.-]+', '-', f'{task}_{draft}_{knobs.replace("=", "")}').strip('-')


def quality_cell(row: Row) -> str:
  """'bleu 30.1 / 29.8': each metric of the row, baseline / speculative ('-' without any)."""
  return ', '.join(f'{m} {row[m + "_baseline"]:.1f} / {row[m + "_speculative"]:.1f}'
                   for m in row.get('metrics', '').split()) or '-'


def identical_cell(row: Row) -> str:
  """'yes' when greedy outputs equal the baseline's; sampled rows are not comparable."""
  if row['temperature'] > 0:
    return 'n/a (sampled)'
  return 'yes' if row['identical'] == 1 else f'NO ({100 * row["identical"]:.0f}% of outputs)'


ALPHA_COLUMNS: tuple[Column, ...] = (
    ('task', lambda r: r['task']),
    ('target', lambda r: r['target']),
    ('draft', lambda r: r['draft']),
    ('sampling', knobs_label),
    ('alpha ± s.e.', lambda r: f'{r["alpha"]:.3f} ± {r["stderr"]:.3f}'),
    ('std of beta', lambda r: f'{r["std"]:.3f}'),
    ('per-sequence alpha q10 / q50 / q90',
     lambda r: f'{r["q10"]:.2f} / {r["q50"]:.2f} / {r["q90"]:.2f}'),
    ('positions', lambda r: str(r['positions'])),
    ('sequences', lambda r: str(r['sequences'])),
)


def _measured_over(key: str) -> Callable[[Row], str]:
  """A cell: the prediction `row[key]` and measured / it ('-' where older results lack it).

  'predicted_finite_speedup': at the outputs' lengths (an output ends
  mid-iteration: `theory.finite_walltime_improvement`);
  'predicted_positional_speedup': the same at each position's measured beta
  instead of alpha everywhere (`theory.positional_walltime_improvement`).
  """
  def cell(row: Row) -> str:
    if key not in row:
      return '-'
    return f'{row[key]:.2f}X ({row["measured_speedup"] / row[key]:.2f})'
  return cell


def _whole_iterations(row: Row) -> str:
  """Eq. (1) and each position's beta over whole iterations timed (measured / it), or '-'."""
  if 'predicted_iteration_speedup' not in row:
    return '-'
  cells = [row['predicted_iteration_speedup'], row.get('predicted_positional_iteration_speedup')]
  return '; '.join(f'{p:.2f}X ({row["measured_speedup"] / p:.2f})' for p in cells
                   if p is not None)


def _whole_decodes(row: Row) -> str:
  """Whole decodes from each input's start and the loop's parts; with i(gamma) (measured / it)."""
  cells = [row.get('predicted_decode_speedup'), row.get('predicted_decode_iteration_speedup')]
  return '; '.join(f'{p:.2f}X ({row["measured_speedup"] / p:.2f})' for p in cells
                   if p is not None) or '-'


WALLTIME_COLUMNS: tuple[Column, ...] = (
    ('task', lambda r: r['task']),
    ('draft', lambda r: r['draft']),
    ('sampling', knobs_label),
    ('gamma', lambda r: str(r['gamma'])),
    ('alpha (in the loop)', lambda r: f'{r["alpha"]:.3f}' + (
        f' ({r["loop_alpha"]:.3f})' if 'loop_alpha' in r else '')),
    ('c (first)', lambda r: f'{r["c"]:.3f} ({r["c_first"]:.3f})'),
    ('speedup', lambda r: f'{r["measured_speedup"]:.2f}X'),
    ('predicted (r, c_first)', lambda r: f'{r["predicted_speedup"]:.2f}X'),
    ('measured / predicted', lambda r: f'{r["measured_speedup"] / r["predicted_speedup"]:.2f}'),
    ("predicted at the outputs' lengths (measured / it)",
     _measured_over('predicted_finite_speedup')),
    ("predicted at each position's beta (measured / it)",
     _measured_over('predicted_positional_speedup')),
    ("whole iterations timed, i(gamma): predicted (measured / it), eq. (1); at each "
     "position's beta", _whole_iterations),
    ("whole decodes, each input's start timed: predicted (measured / it); with i(gamma)",
     _whole_decodes),
    ('eq. (5)', lambda r: f'{r["predicted_speedup_eq5"]:.2f}X'),
    ("tokens/call (eq. (1); at the outputs' lengths; at each position's beta)",
     lambda r: f'{r["tokens_per_call"]:.2f} ({r["expected_tokens_per_call"]:.2f}; '
               + (f'{r["finite_tokens_per_call"]:.2f}' if 'finite_tokens_per_call' in r
                  else '-') + '; '
               + (f'{r["positional_tokens_per_call"]:.2f})' if 'positional_tokens_per_call' in r
                  else '-)')),
    ('greedy identical', identical_cell),
    ('quality: baseline / speculative', quality_cell),
)


SWEEP_COLUMNS: tuple[Column, ...] = (
    WALLTIME_COLUMNS[0], WALLTIME_COLUMNS[1], WALLTIME_COLUMNS[2], WALLTIME_COLUMNS[3],
    ('chosen', lambda r: 'yes' if r['chosen'] else ''),
) + WALLTIME_COLUMNS[6:15]


BREAKDOWN_COLUMNS: tuple[Column, ...] = WALLTIME_COLUMNS[:4] + (
    ('baseline ms/token', lambda r: f'{r["baseline_token_ms"]:.3f}'),
    ('target step ms', lambda r: f'{r["target_step_ms"]:.3f}'),
    ('ms/iteration', lambda r: f'{r["iteration_ms"]:.3f}'),
    ('draft steps', lambda r: f'{r["draft_ms"]:.3f}'),
    ('verify (K = gamma + 1)', lambda r: f'{r["verify_ms"]:.3f}'),
    ('per-input fixed', lambda r: f'{r["fixed_ms"]:.3f}'),
    ('loop other', lambda r: f'{r["other_ms"]:.3f}'),
    ('slowdown: baseline iteration / target step',
     lambda r: f'{r["slowdown"]:.2f}' if 'slowdown' in r else '-'),
    ('loop other, parts x slowdown',
     lambda r: f'{r["scaled_other_ms"]:.3f}' if 'scaled_other_ms' in r else '-'),
    ('fixed ms per input: baseline / speculative',
     lambda r: f'{r["baseline_fixed_ms"]:.1f} / {r["speculative_fixed_ms"]:.1f}'),
    ("loop speedup (predicted at each position's beta; with i(gamma))",
     lambda r: f'{r["loop_speedup"]:.2f}X' + (
         f' ({r["predicted_positional_speedup"]:.2f}X' + (
             f'; {r["predicted_positional_iteration_speedup"]:.2f}X'
             if 'predicted_positional_iteration_speedup' in r else '') + ')'
         if 'predicted_positional_speedup' in r else '')),
)


KNOB_COLUMNS: tuple[Column, ...] = WALLTIME_COLUMNS[:4] + (
    WALLTIME_COLUMNS[6],  # speedup
    ("over plain sampling's", lambda r: f'{r["speedup_over_plain"]:.3f}'),
    ("baseline ms/token over plain sampling's", lambda r: f'{r["baseline_over_plain"]:.3f}'),
)


def knob_rows(rows: Iterable[Row]) -> list[Row]:
  """The rows that carry a top-k/top-p comparison with plain sampling (`add_knob_ratios`)."""
  return [row for row in rows if 'speedup_over_plain' in row]


def _measured_verify_ms(timing: Row) -> list[float]:
  """Verify times as timed, before the fit (results written before the fit lack them)."""
  return timing.get('verify_measured_ms', timing['verify_ms'])


def _timing_section(timing: Row, plot: str) -> str:
  """c, c_first and the r(K) table; `plot`: the r(K) plot's Markdown (or why there is none)."""
  rows = [dict(k=k, raw=raw, ms=ms, r=r) for k, (raw, ms, r) in enumerate(
      zip(_measured_verify_ms(timing), timing['verify_ms'], timing['r']), start=1)]
  table = markdown_table(rows, (('K', lambda x: str(x['k'])),
                                ('target call ms, measured', lambda x: f'{x["raw"]:.4f}'),
                                ('non-decreasing fit', lambda x: f'{x["ms"]:.4f}'),
                                ('r(K)', lambda x: f'{x["r"]:.3f}')))
  return (f'Target step {timing["target_step_ms"]:.4f} ms, draft step '
          f'{timing["draft_step_ms"]:.4f} ms in a run of draft steps: **c = {timing["c"]:.3f}**. '
          f'The first draft step after a target call (what a draft step adds to a loop of '
          f'target steps, timed in alternating runs) takes {timing["draft_first_ms"]:.4f} ms: '
          f'**c_first = {timing["c_first"]:.3f}**; the difference is what the target call costs '
          f'the draft step after it (on a CPU: re-reading the draft weights that the target '
          f'call evicted from the cache), paid once per iteration. One target call over K positions costs r(K) target steps (the paper '
          f'assumes r = 1 and c_first = c); a call over more positions never costs less, so '
          f'r(K) is the non-decreasing least-squares fit of the measured times, which keeps '
          f'a noisy dip from steering best_gamma:\n\n{table}\n\n{plot}'
          + _iterations_note(timing) + _starts_note(timing) + _chosen_with_note(timing))


def _starts_note(timing: Row) -> str:
  """The models' starts per input length, as timed ('' if not timed)."""
  if not timing.get('target_start_ms'):
    return ''
  starts = ', '.join(f'{n} tokens: {ms:.3f} / {timing["both_start_ms"][n]:.3f} ms'
                     for n, ms in timing['target_start_ms'].items())
  return ("\n\nWhat each input pays once, whatever its output: `start` (encoder pass, "
          'cross-attention keys and values, a fresh cache) by the target alone / by both models '
          f'in one program, per encoder input length: {starts}.')


def _iterations_note(timing: Row) -> str:
  """i(gamma) of each gamma timed whole, against the parts it replaces ('' if none)."""
  notes = []
  for gamma, cost in timing.get('iteration_cost', {}).items():
    g = int(gamma)
    summed = theory.summed_iteration_cost(g, timing['c'], np.asarray(timing['r']),
                                          timing['c_first'])
    notes.append(f'\n\nA whole iteration of gamma = {g} (its draft steps, then the verify call, '
                 f'in one loop: each model evicts the other\'s weights) costs **i({g}) = '
                 f'{cost:.3f}** target steps, against c_first + {g - 1} c + r({g + 1}) = '
                 f'{summed:.3f} summed.')
  return ''.join(notes)


def _chosen_with_note(timing: Row) -> str:
  """Where the times above were timed, when gamma was chosen with others (between the loops)."""
  before = timing.get('gamma_chosen_with')
  if before is None:
    return ''
  return ('\n\nThese parts were timed in rounds between the inputs of the walltime run below, '
          'so that they meet the machine the loops meet; the predictions use them. gamma was '
          f'chosen with a timing just before the loops: c = {before["c"]:.3f}, c_first = '
          f'{before["c_first"]:.3f}, r(K) = '
          + ', '.join(f'{r:.3f}' for r in before['r']) + '.')


def write_report(out_dir: str | pathlib.Path, *, title: str, alpha_rows: Iterable[Row] = (),
                 walltime_rows: Iterable[Row] = (), timing: Row | None = None,
                 notes: str = '') -> list[pathlib.Path]:
  """Writes report.md, results.json, the CSVs and the plots of the given results.

  Args:
    out_dir: created if missing; existing files of the same names are replaced.
    title: the report's heading.
    alpha_rows: Table 3 records (see the module docstring).
    walltime_rows: Table 2 records; plotting them needs `timing`.
    timing: the step times (c, r(K)).
    notes: Markdown put under the title (e.g. the models and the command).

  Returns:
    The paths written.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  alpha_rows, walltime_rows = list(alpha_rows), list(walltime_rows)
  written = [out / 'report.md', out / 'results.json']
  sections = [f'# {title}', notes] if notes else [f'# {title}']
  no_plots = report_plots.available()  # why there are none, on an image without matplotlib

  if alpha_rows:
    written.append(out / 'table3_alpha.csv')
    write_csv(written[-1], alpha_rows)
    sections.append('## alpha (Table 3)\n\nalpha = E[beta], beta = sum_x min(p(x), q(x)) of the '
                    'adjusted distributions at each position of the target\'s own outputs '
                    '(one teacher-forced pass per model); s.e. from per-sequence sums.\n\n'
                    + markdown_table(alpha_rows, ALPHA_COLUMNS))
  if timing is not None and not no_plots:
    written.append(out / 'r_vs_k.png')
    report_plots.plot_verify_cost(written[-1], timing['r'],
                                  np.asarray(_measured_verify_ms(timing)) / timing['target_step_ms'])
  if timing is not None:
    sections.append('## c and r(K)\n\n' + _timing_section(
        timing, f'(no plots: {no_plots})' if no_plots else '![r(K)](r_vs_k.png)'))
  if walltime_rows:
    written.append(out / 'table2_walltime.csv')
    write_csv(written[-1], walltime_rows)
    chosen = [row for row in walltime_rows if row['chosen']]
    sections.append('## Walltime (Table 2)\n\nBatch 1, compile excluded, median over repeats; '
                    'gamma from theory.best_gamma_along: eq. (5) with the measured c, c_first '
                    "and r(K) along the target's outputs, at each position's beta (timed "
                    'before the loops). '
                    'speedup: seconds per generated token of the baseline over speculative '
                    "decoding's (sampled, the two draw outputs of different lengths). Eq. (5) "
                    'models the loops alone; the whole decodes also pay each input\'s start '
                    '(`walltime.decode_speedup`).\n\n'
                    + markdown_table(chosen, WALLTIME_COLUMNS))
    sections.append(
        '### Where the time goes (ms)\n\n'
        'Per speculative iteration: the draft steps and the verify call (as timed above), the '
        'per-input fixed cost (encoder passes, cache set-up, dispatch: the intercept of seconds '
        'against iterations over the inputs) spread over the iterations, and the rest of the '
        "loop's work. The machine's speed drifts, so the parts are timed between the "
        "loops' inputs (older results: minutes before the loops): the slowdown is the "
        "baseline's time per iteration (its fixed cost "
        'removed; a target step and little else) over the target step as timed, and the '
        "last 'loop other' is the rest with the parts scaled by it (first order: the drift "
        'need not slow the memory-bound target and the cache-held draft alike; a slowdown '
        'far from 1 marks a run whose parts and loops met different machines). Eq. (5) '
        "models the loops alone: compare the loop speedup with the predictions at each "
        "position's beta (the parts summed; whole iterations timed).\n\n"
        + markdown_table(chosen, BREAKDOWN_COLUMNS))
    knobs = knob_rows(chosen)
    if knobs:
      sections.append(
          '### top-k and top-p against plain sampling\n\n'
          "Each row's speculative speedup and its baseline's ms per token over those of plain "
          'sampling at the same temperature (chosen gammas), from the same interleaved run.\n\n'
          + markdown_table(knobs, KNOB_COLUMNS))
    sections.append('### gamma sweep\n\n' + markdown_table(walltime_rows, SWEEP_COLUMNS))
    plots = [f'(no plots: {no_plots})'] if no_plots else []
    for group in dict.fromkeys(map(_group, walltime_rows) if not no_plots else ()):
      rows = [row for row in walltime_rows if _group(row) == group]
      names = []
      if timing is not None:
        names.append(f'speedup_vs_gamma_{_slug(group)}.png')
        report_plots.plot_speedup_vs_gamma(out / names[-1], rows, timing['r'], group[2])
      for row in (row for row in rows if row['chosen']):
        names.append(f'tokens_per_call_{_slug(group)}.png')
        report_plots.plot_tokens_per_call(out / names[-1], row, group[2])
      written += [out / name for name in names]
      plots += [f'![{name}]({name})' for name in names]
    sections.append('### Plots\n\n' + '\n'.join(plots))

  (out / 'report.md').write_text('\n\n'.join(sections) + '\n', encoding='utf-8')
  (out / 'results.json').write_text(json.dumps(
      dict(title=title, alpha=alpha_rows, walltime=walltime_rows, timing=timing), indent=1,
      default=lambda x: np.asarray(x).tolist()), encoding='utf-8')
  return written
