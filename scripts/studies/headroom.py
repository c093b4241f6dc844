r"""Prints what a draft would need for a speedup, from walltime reports' measured costs.

  python scripts/studies/headroom.py out/demo_walltime                      # 1.45X
  python scripts/studies/headroom.py docs/results/demo-walltime/*/ --speedup 1.3 --gammas 2 3 4 5

For each decoded row of each report (results.json of `python -m spec_decode.demo`
or `scripts/walltime.py`): the measured speedup, tokens per call and loop
alpha, and per gamma the speedup a draft that is always right would give
(ceiling) and the acceptance rate that `--speedup` needs, holding everything
else as measured (both favour the draft, so the alpha is a lower bound).
Other gammas than the decoded one are scaled by whole iterations where the
report timed them, else by the summed parts ('~').

How: a walltime row (`walltime.summarize`) splits speculative decoding's time
per generated token in two: the per-input fixed cost (encoder passes, cache
set-up), spread over the tokens, and the loop's iterations, one target call
each:

  speculative ms/token = fixed_ms / tau + loop_ms / tau,

with tau the measured tokens per target call, fixed_ms the fixed cost per
iteration and loop_ms = iteration_ms - fixed_ms what an iteration's model
calls and bookkeeping cost. With the baseline's ms per token B this gives the
measured speedup exactly. Holding the costs and the outputs (so the fixed cost
per token) and changing only how many tokens a call yields, tau':

  speedup(tau') = B / (fixed_ms / tau + loop_ms' / tau').

At the decoded gamma, loop_ms' = loop_ms. At another gamma the loop is scaled
by whole iterations timed, i(gamma) / i(decoded), where the timing holds both,
else by the summed parts, c_first + (gamma - 1) c + r(gamma + 1): an
extrapolation, which on the EPYC under-counts longer drafts (i(6) / i(3) = 1.39
against 1.30 summed, measured on a 2-core EPYC).

tau' at a given alpha is the i.i.d. model's over the row's `output_lengths`
(`theory.expected_calls`: an output ends mid-call), or eq. (1) for rows
without them, which over-counts short outputs' tokens per call by more (on the
demo's outputs, 2.71 against 2.53 at the outputs' lengths and 2.46 in the
loop, at gamma 3). Either favours the draft where acceptance varies along the
outputs, as on the demo's: the alpha asked for is a lower bound and the speedup
at alpha = 1 (`ceiling`) an upper one.
"""

import argparse
import json
import math
import pathlib
from typing import Mapping, Sequence

import numpy as np

from spec_decode.harness import report
from spec_decode import theory

_ROW_KEYS = ('gamma', 'c', 'c_first', 'tokens_per_call', 'baseline_token_ms', 'iteration_ms',
             'fixed_ms')


def tokens_per_call(alpha: float, gamma: int, lengths: Sequence[int] | None = None) -> float:
  """Expected tokens per target call: eq. (1), or over outputs of `lengths` where given."""
  if lengths is None:
    return float(theory.expected_tokens(alpha, gamma))
  return float(theory.finite_tokens_per_call(alpha, gamma, lengths))


def alpha_for_tokens(tokens: float, gamma: int, lengths: Sequence[int] | None = None) -> float:
  """`tokens_per_call` inverted: the alpha at which a target call yields `tokens`.

  Args:
    tokens: expected tokens per target call.
    gamma: the draft length, an integer >= 1.
    lengths: optional output lengths (EOS included), as in `tokens_per_call`.

  Returns:
    alpha in [0, 1] (bisection, to 1e-12); 0 where a draft never accepted
    gives `tokens`; NaN where not even alpha = 1 does (more than gamma + 1,
    or more than the outputs' lengths allow).
  """
  if not tokens > 0:  # Also rejects NaN.
    raise ValueError(f'tokens must be > 0, got {tokens}.')
  if tokens <= tokens_per_call(0.0, gamma, lengths):
    return 0.0
  if tokens > tokens_per_call(1.0, gamma, lengths):
    return float('nan')
  low, high = 0.0, 1.0
  for _ in range(40):  # tokens per call rise with alpha
    mid = (low + high) / 2
    low, high = (mid, high) if tokens_per_call(mid, gamma, lengths) < tokens else (low, mid)
  return (low + high) / 2


def headroom(row: Mapping, r: Sequence[float], speedup: float,
             gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7),
             iteration_cost: Mapping[int, float] | None = None) -> list[dict]:
  """Per gamma: the speedup at alpha = 1 and the alpha that `speedup` needs.

  Args:
    row: a walltime row (`walltime.summarize`, as in a report's results.json).
    r: r(K) for K = 1 .. max(gammas) + 1 (the timing's non-decreasing fit).
    speedup: the speedup asked for, > 0.
    gammas: the draft lengths to look at.
    iteration_cost: optional i(gamma) by gamma (`StepTimes.iteration_s` in
      target steps; a results.json's timing["iteration_cost"], keys str or int).

  Returns:
    One dict per gamma: gamma, measured (whether the loop ran it), loop_ms
    (ms per iteration, fixed cost excluded), ceiling (the speedup at alpha =
    1), tokens (per call, that `speedup` needs; inf where the fixed cost alone
    is over budget) and alpha (that gives them, `alpha_for_tokens` over the
    row's output_lengths, or by eq. (1) without them; NaN where no draft
    suffices).

  Raises:
    ValueError: a row without the keys above, output_lengths that sum to 0,
      an r too short, a bad speedup.
  """
  missing = [key for key in _ROW_KEYS if key not in row]
  if missing:
    raise ValueError(f'not a walltime row: no {", ".join(missing)}')
  if not speedup > 0:
    raise ValueError(f'speedup must be > 0, got {speedup}')
  if len(r) < max(gammas) + 1:
    raise ValueError(f'r needs K = 1 .. {max(gammas) + 1}, got {len(r)} entries')
  decoded = int(row['gamma'])
  lengths = row.get('output_lengths')
  if lengths is not None and not np.sum(lengths) > 0:
    raise ValueError(f'output_lengths must sum to > 0, got {lengths}')
  whole = {int(g): cost for g, cost in (iteration_cost or {}).items()}
  summed = lambda g: float(theory.summed_iteration_cost(g, row['c'], np.asarray(r), row['c_first']))
  fixed_per_token = row['fixed_ms'] / row['tokens_per_call']
  loop_ms = row['iteration_ms'] - row['fixed_ms']
  budget = row['baseline_token_ms'] / speedup - fixed_per_token  # loop ms per token
  out = []
  for g in gammas:
    scaled = 'whole' if decoded in whole and g in whole else 'parts'
    loop = loop_ms * (whole[g] / whole[decoded] if scaled == 'whole'
                      else summed(g) / summed(decoded))
    tokens = loop / budget if budget > 0 else float('inf')
    out.append(dict(
        gamma=g, measured=g == decoded, loop_ms=loop, scaled=scaled,
        ceiling=row['baseline_token_ms'] / (fixed_per_token
                                            + loop / tokens_per_call(1.0, g, lengths)),
        tokens=tokens, alpha=alpha_for_tokens(tokens, g, lengths)))
  return out


def _load(path: str) -> dict:
  file = pathlib.Path(path)
  file = file / 'results.json' if file.is_dir() else file
  if not file.is_file():
    raise SystemExit(f'error: no results.json at {path}')
  results = json.loads(file.read_text())
  if not results.get('walltime') or 'r' not in results.get('timing', {}):
    raise SystemExit(f'error: {file} holds no walltime rows with their timing')
  return results


def _cell(entry: dict) -> str:
  mark = '' if entry['measured'] or entry['scaled'] == 'whole' else '~'
  alpha = 'none' if math.isnan(entry['alpha']) else f"{entry['alpha']:.3f}"
  return f"{mark}{entry['ceiling']:.2f}X; {alpha}"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('reports', nargs='+', help='report folders or results.json files')
  parser.add_argument('--speedup', type=float, default=1.45, help='the speedup asked for')
  parser.add_argument('--gammas', type=int, nargs='+', default=[1, 2, 3, 4, 5, 6, 7])
  args = parser.parse_args()
  if min(args.gammas) < 1:
    parser.error('--gammas must be >= 1')

  rows = []
  for path in args.reports:
    results = _load(path)
    timing = results['timing']
    if len(timing['r']) < max(args.gammas) + 1:
      raise SystemExit(f'error: {path} timed r(K) up to K = {len(timing["r"])}; '
                       f'--gammas needs K = {max(args.gammas) + 1}')
    rows += [dict(row, report=path, entries=headroom(
        row, timing['r'], args.speedup, args.gammas, timing.get('iteration_cost')))
             for row in results['walltime']]
  columns = [('report', lambda r: r['report']), ('sampling', report.knobs_label),
             ('gamma', lambda r: str(r['gamma'])),
             ('speedup', lambda r: f"{r['measured_speedup']:.2f}X"),
             ('tokens/call', lambda r: f"{r['tokens_per_call']:.2f}"),
             ('alpha (in the loop)', lambda r: f"{r['loop_alpha']:.3f}")]
  columns += [(f'gamma {g}: at alpha = 1; alpha for {args.speedup:g}X',
               lambda r, i=i: _cell(r['entries'][i])) for i, g in enumerate(args.gammas)]
  print(f'What {args.speedup:g}X needs, holding the measured costs ("none": no draft '
        'reaches it at that gamma; "~": the loop scaled by the summed parts)\n')
  print(report.markdown_table(rows, columns))


if __name__ == '__main__':
  main()
