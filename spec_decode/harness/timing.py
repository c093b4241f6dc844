"""Walltime helpers for compiled calls on a shared machine: medians, round-robin, monotone fits."""

import time
from typing import Callable

import jax
import numpy as np


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
  """Median walltime of fn() over `repeats` runs (already compiled), last result."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times)), out


def round_robin(runs: dict, repeats: int) -> dict:
  """name -> [repeats] seconds of each compiled run, the runs interleaved.

  Each round times every run once, so that a shared machine's drift between
  rounds moves all of them alike instead of biasing their ratios.
  """
  jax.block_until_ready([run() for run in runs.values()])  # compile and warm up
  seconds = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      seconds[name].append(median_time(run, 1)[0])
  return seconds


def nondecreasing_fit(values: np.ndarray) -> np.ndarray:
  """The least-squares non-decreasing sequence closest to `values` (pool adjacent violators).

  A target call over more positions never costs less, so a dip in measured
  r(K) is noise; left in, it would make best_gamma chase it.

  Args:
    values: [n] measurements in order of K.

  Returns:
    [n] the fit: each run of violators replaced by its mean.
  """
  blocks = []  # [mean, count] of pooled runs
  for value in np.asarray(values, np.float64):
    blocks.append([value, 1])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
      blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
  return np.concatenate([np.full(n, m) for m, n in blocks])
