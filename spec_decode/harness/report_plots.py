"""The walltime report's plots: r(K), speedup against gamma, tokens per call.

matplotlib is imported inside `figure`, so that a report's tables need only
numpy (accelerator images may lack matplotlib; see scripts/studies/shape_walltime.py).
"""

import pathlib
from typing import Any, Sequence

import numpy as np

from spec_decode import theory

Row = dict[str, Any]


def available() -> str | None:
  """None where matplotlib imports, else why not (a report then holds its tables alone)."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as error:
    return str(error)
  return None


def figure(size: tuple[float, float]):
  """A matplotlib Figure on the Agg canvas (no pyplot state).

  matplotlib is imported here, so that the tables of a report need only numpy
  (accelerator images may lack matplotlib; see scripts/studies/shape_walltime.py).
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=size)
  FigureCanvasAgg(fig)
  return fig


def save(fig, ax, path: pathlib.Path) -> None:
  """A one-axes plot's small title and legend, tight layout, written as a 120-dpi PNG."""
  ax.title.set_fontsize(9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def plot_verify_cost(path: pathlib.Path, r: Sequence[float], raw_r: Sequence[float]) -> None:
  """r(K) against K, with the paper's r = 1 and no parallelism (r = K).

  Args:
    path: the PNG to write.
    r: [k_max] r(K) as used (the non-decreasing fit).
    raw_r: [k_max] r(K) as measured.
  """
  k = np.arange(1, len(r) + 1)
  fig = figure((5, 3.5))
  ax = fig.add_subplot()
  ax.plot(k, raw_r, 'o', label='measured')
  ax.plot(k, r, '-', label='r(K): non-decreasing fit')
  ax.plot(k, np.ones_like(k), '--', label='r = 1 (paper)')
  ax.plot(k, k, ':', label='r = K (serial)')
  ax.set(xlabel='K (positions per target call)', ylabel='r(K) [target steps]', xticks=k,
         title='Cost of one target call over K positions')
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def plot_speedup_vs_gamma(path: pathlib.Path, rows: Sequence[Row], r: Sequence[float],
                          label: str) -> None:
  """Measured speedups of one group (its sampling `label`) against eq. (5) and along outputs."""
  alpha, c, c_first = rows[0]['alpha'], rows[0]['c'], rows[0]['c_first']
  gammas = np.arange(1, len(r))
  fig = figure((5, 3.5))
  ax = fig.add_subplot()
  ax.plot(gammas, theory.walltime_improvement(alpha, gammas, c), '--', label='eq. (5), r = 1')
  ax.plot(gammas, theory.walltime_improvement(alpha, gammas, c, np.asarray(r), c_first), '-',
          label='eq. (5) with measured r(K), c_first')
  if 'positional_curve' in rows[0]:
    curve = rows[0]['positional_curve']  # gamma 1 .. the chosen gamma's gamma_max
    ax.plot(np.arange(1, len(curve) + 1), curve, '-.',
            label="the same along the outputs (each position's beta)")
  ax.plot([x['gamma'] for x in rows], [x['measured_speedup'] for x in rows], 'o',
          label='measured')
  chosen = [x for x in rows if x['chosen']]
  ax.plot([x['gamma'] for x in chosen], [x['measured_speedup'] for x in chosen], 'r*',
          markersize=12, label='chosen gamma')
  ax.axhline(1.0, color='gray', linewidth=0.8)
  ax.set(xlabel='gamma', ylabel='walltime speedup', xticks=gammas,
         title=f'{rows[0]["task"]}, {rows[0]["draft"]}, {label}\n'
               f'alpha = {alpha:.2f}, c = {c:.2f}, c_first = {c_first:.2f}')
  save(fig, ax, path)


def plot_tokens_per_call(path: pathlib.Path, row: Row, label: str) -> None:
  """Measured tokens per target call (n + 1) against eq. (1)'s truncated geometric law."""
  histogram = np.asarray(row['accept_histogram'], np.float64)
  gamma = len(histogram) - 1
  k = np.arange(1, gamma + 2)
  fig = figure((5, 3.5))
  ax = fig.add_subplot()
  ax.bar(k, histogram / histogram.sum(), alpha=0.6,
         label=f'measured ({int(histogram.sum())} calls)')
  ax.plot(k, theory.tokens_per_call_distribution(row['alpha'], gamma), 'ko-',
          label=f'theory, alpha = {row["alpha"]:.2f}')
  ax.set(xlabel='tokens per target call', ylabel='fraction of target calls', xticks=k,
         title=f'{row["task"]}, {row["draft"]}, {label}, gamma = {gamma}')
  save(fig, ax, path)
