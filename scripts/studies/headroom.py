r"""Prints what a draft would need for a speedup, from walltime reports' measured costs.

  python scripts/studies/headroom.py out/demo_walltime                      # 1.45X
  python scripts/studies/headroom.py docs/results/demo-walltime/*/ --speedup 1.3 --gammas 2 3 4 5

For each decoded row of each report (results.json of `python -m spec_decode.demo`
or `scripts/walltime.py`): the measured speedup, tokens per call and loop
alpha, and per gamma the speedup a draft that is always right would give
(ceiling) and the acceptance rate that `--speedup` needs, holding everything
else as measured (`spec_decode.harness.headroom`: both favour the draft, so
the alpha is a lower bound). Other gammas than the decoded one are scaled by
whole iterations where the report timed them, else by the summed parts ('~').
"""

import argparse
import json
import math
import pathlib

from spec_decode.harness import headroom
from spec_decode.harness import report


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
    rows += [dict(row, report=path, entries=headroom.headroom(
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
