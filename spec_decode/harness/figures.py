"""The plots of notebooks/paper_figures.ipynb and notebooks/quickstart.ipynb.

Each `plot_*` function returns a matplotlib Figure drawn from the package's own
functions (theory, speculative, models); `save` writes it as PNG. One piece of
computation lives here because only the figures need it: `roofline_step_time`,
the time of one decode step over K positions on given hardware,
max(weight bytes / bandwidth, flops / peak). The trace of one decode is in
`trace`.
"""

import dataclasses
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import scipy.stats

from spec_decode import speculative
from spec_decode import theory


GREEN, RED, BLUE, GREY = '#2e7d32', '#c62828', '#1565c0', '#757575'


def save(fig: matplotlib.figure.Figure, out_dir: str | pathlib.Path, name: str) -> pathlib.Path:
  """Writes `fig` to out_dir/name.png (folders created) and returns the path."""
  path = pathlib.Path(out_dir) / f'{name}.png'
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120, bbox_inches='tight')
  return path


@dataclasses.dataclass(frozen=True)
class Hardware:
  """Peak numbers of one accelerator chip.

  Attributes:
    name: for labels.
    bandwidth: memory bandwidth, bytes per second.
    peak_flops: peak arithmetic, flop per second (in the weights' dtype).
  """

  name: str
  bandwidth: float
  peak_flops: float


TPU_V4 = Hardware('TPU v4', bandwidth=1.2e12, peak_flops=275e12)


def roofline_step_time(k: np.ndarray, n_params: float, hardware: Hardware = TPU_V4, *,
                       bytes_per_param: float = 2.0, batch: int = 1) -> np.ndarray:
  """Seconds of one decode step scoring K positions per row, by the roofline.

  The step reads every weight once (n_params * bytes_per_param bytes) and does
  2 flops per weight per scored position (batch * K of them); it takes the
  longer of the two. KV-cache and activation traffic are left out.

  Args:
    k: positions scored per row, any shape.
    n_params: weights read by a step.
    hardware: bandwidth and peak.
    bytes_per_param: 2 for bfloat16.
    batch: rows.

  Returns:
    Seconds, the shape of `k`.
  """
  k = np.asarray(k, np.float64)
  memory_s = n_params * bytes_per_param / hardware.bandwidth
  compute_s = 2.0 * n_params * batch * k / hardware.peak_flops
  return np.maximum(memory_s, compute_s)


def ridge_k(n_params: float, hardware: Hardware = TPU_V4, *, bytes_per_param: float = 2.0,
            batch: int = 1) -> float:
  """The K where a step turns from memory-bound to compute-bound."""
  del n_params  # Both sides scale with it.
  return hardware.peak_flops * bytes_per_param / (2.0 * hardware.bandwidth * batch)


def plot_roofline(n_params: float, hardware: Hardware = TPU_V4, *, label: str = '',
                  k_max: int = 2048, gamma_max: int = 7,
                  measured_r: np.ndarray | None = None, measured_label: str = 'measured',
                  bytes_per_param: float = 2.0) -> matplotlib.figure.Figure:
  """Left: time(K) on `hardware`; right: r(K) = time(K) / time(1), model vs measured.

  Args:
    n_params: weights read per step.
    hardware: the chip of the model curve.
    label: the model's name for the title, e.g. 'T5-XXL, 11B, bfloat16'.
    k_max: the largest K of the left panel.
    gamma_max: the verify calls K = 2 .. gamma_max + 1 are shaded.
    measured_r: optional [k] measured r(K), K = 1 .. k (e.g. StepTimes.r).
    measured_label: its legend entry.
    bytes_per_param: 2 for bfloat16.
  """
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
  ks = np.unique(np.geomspace(1, k_max, 400).round())
  times = roofline_step_time(ks, n_params, hardware, bytes_per_param=bytes_per_param)
  memory_s = n_params * bytes_per_param / hardware.bandwidth
  ridge = ridge_k(n_params, hardware, bytes_per_param=bytes_per_param)
  left.loglog(ks, 1e3 * times, color='k', lw=2, label='max(memory, compute)')
  left.loglog(ks, 1e3 * np.full_like(ks, memory_s), ':', color=BLUE,
              label=f'weights / bandwidth = {1e3 * memory_s:.1f} ms')
  left.loglog(ks, 1e3 * 2 * n_params * ks / hardware.peak_flops, ':', color=RED,
              label='flops(K) / peak')
  left.axvspan(2, gamma_max + 1, color=GREEN, alpha=0.15,
               label=f'verify calls, K = 2..{gamma_max + 1}')
  left.axvline(ridge, color=GREY, lw=1)
  left.annotate(f'ridge K = {ridge:.0f}', (ridge, 1e3 * memory_s), xytext=(5, -30),
                textcoords='offset points', color=GREY)
  left.set(xlabel='K (positions scored per call, batch 1)', ylabel='ms per call',
           title=f'{label} on {hardware.name}: one decode step'.strip(),
           ylim=(1e3 * memory_s / 3, None))
  left.legend(fontsize=8, loc='upper left')

  kmax_right = max(gamma_max + 1, 0 if measured_r is None else len(measured_r))
  small = np.arange(1, kmax_right + 1)
  model_r = roofline_step_time(small, n_params, hardware) / roofline_step_time(1, n_params,
                                                                                hardware)
  right.plot(small, model_r, 'o-', color='k', label=f'roofline, {hardware.name}')
  if measured_r is not None:
    measured_r = np.asarray(measured_r)
    right.plot(np.arange(1, len(measured_r) + 1), measured_r, 's-', color=RED,
               label=measured_label)
  right.plot(small, small, '--', color=GREY, lw=1, label='r(K) = K (no parallelism)')
  right.set(xlabel='K', ylabel='r(K) = time(K) / time(1)', title='cost of a verify call',
            ylim=(0, None), xticks=small)
  right.legend(fontsize=8)
  fig.tight_layout()
  return fig


def speculative_samples(p: np.ndarray, q: np.ndarray, num_samples: int,
                        rng: jax.Array) -> tuple[np.ndarray, float]:
  """One token per row by speculative sampling (gamma = 1) from target p, draft q.

  Each row drafts x ~ q, then speculative.accept_reject keeps x or replaces it
  by a sample of norm(max(0, p - q)); the kept token is distributed as p.

  Args:
    p: [V] target distribution.
    q: [V] draft distribution.
    num_samples: rows.
    rng: one PRNG key.

  Returns:
    ([V] counts of the emitted tokens, the fraction of drafts accepted).
  """
  p, q = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
  draft_key, accept_key = jax.random.split(rng)
  x = jax.random.categorical(draft_key, jnp.log(q), shape=(num_samples,)).astype(jnp.int32)
  q_rows = jnp.broadcast_to(q, (num_samples, 1, q.shape[-1]))
  p_rows = jnp.broadcast_to(p, (num_samples, 2, p.shape[-1]))  # p_2 (the bonus) is unused.
  n, y = speculative.accept_reject(jax.random.split(accept_key, num_samples), x[:, None], q_rows,
                                   p_rows)
  token = jnp.where(n == 1, x, y)
  counts = np.bincount(np.asarray(token), minlength=p.shape[-1])
  return counts, float(jnp.mean(n))


def plot_speculative_sampling(p: np.ndarray, q: np.ndarray, counts: np.ndarray,
                              labels: Sequence[str] | None = None,
                              accepted: float | None = None) -> matplotlib.figure.Figure:
  """p and q, min(p, q), the residual, and the samples' histogram against p."""
  p, q, counts = np.asarray(p, np.float64), np.asarray(q, np.float64), np.asarray(counts)
  v = np.arange(len(p))
  labels = list(labels) if labels is not None else [str(i) for i in v]
  beta = np.minimum(p, q).sum()
  residual = np.maximum(p - q, 0.0)
  residual = residual / residual.sum() if residual.sum() > 0 else p
  fig, axes = plt.subplots(1, 4, figsize=(15, 3.4), sharey=True)
  w = 0.4
  axes[0].bar(v - w / 2, p, w, color=BLUE, label='p (target)')
  axes[0].bar(v + w / 2, q, w, color=GREEN, label='q (draft)')
  axes[0].set_title('target p and draft q')
  axes[1].bar(v, np.minimum(p, q), color=GREEN, label='min(p, q)')
  axes[1].step(v, p, where='mid', color=BLUE, lw=1, label='p')
  axes[1].set_title(f'accepted: min(p, q), mass beta = {beta:.2f}')
  axes[2].bar(v, residual, color=RED, label='norm(max(0, p - q))')
  axes[2].set_title(f'after a rejection (prob. {1 - beta:.2f})')
  freq = counts / counts.sum()
  chi2 = scipy.stats.chisquare(counts, counts.sum() * p / p.sum())
  axes[3].bar(v, freq, color=GREY, label=f'{counts.sum():,} samples')
  axes[3].plot(v, p, 'o', color=BLUE, label='p')
  note = f', {100 * accepted:.1f}% drafts kept' if accepted is not None else ''
  axes[3].set_title(f'samples: chi2 p-value {chi2.pvalue:.2f}{note}', fontsize=10)
  for ax in axes:
    ax.set_xticks(v, labels)
    ax.legend(fontsize=8)
  axes[0].set_ylabel('probability')
  fig.tight_layout()
  return fig


def plot_expected_tokens(gammas: Sequence[int] = (1, 2, 3, 5, 7, 10),
                         dist_alphas: Sequence[float] = (0.5, 0.7, 0.9),
                         dist_gamma: int = 5,
                         measured: dict[str, np.ndarray] | None = None
                         ) -> matplotlib.figure.Figure:
  """Left: eq. (1) against alpha per gamma; right: P(k tokens per call).

  Args:
    gammas: one curve each.
    dist_alphas: one bar group each on the right.
    dist_gamma: the gamma of the right panel.
    measured: optional label -> accept histogram [dist_gamma + 1] (counts of
      0..gamma accepted drafts, as DecodeOutput.accept_histogram), drawn as
      the measured distribution of n + 1 tokens per call.
  """
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
  alpha = np.linspace(0, 0.99, 200)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(gammas)))
  for gamma, color in zip(gammas, colors):
    left.plot(alpha, theory.expected_tokens(alpha, gamma), color=color, label=f'gamma = {gamma}')
  left.plot(alpha, 1 / (1 - alpha), '--', color=GREY, label='gamma -> inf: 1 / (1 - alpha)')
  left.set(xlabel='alpha', ylabel='E[tokens per target call]', ylim=(1, max(gammas) + 1.5),
           title='eq. (1): (1 - alpha^(gamma+1)) / (1 - alpha)')
  left.legend(fontsize=8)

  k = np.arange(1, dist_gamma + 2)
  groups = len(dist_alphas) + len(measured or {})
  w = 0.8 / groups
  dist_colors = plt.cm.plasma(np.linspace(0.1, 0.8, len(dist_alphas)))
  for i, (a, color) in enumerate(zip(dist_alphas, dist_colors)):
    probs = theory.tokens_per_call_distribution(a, dist_gamma)
    mean = float(theory.expected_tokens(a, dist_gamma))
    right.bar(k + (i - (groups - 1) / 2) * w, probs, w, color=color,
              label=f'alpha = {a}: mean {mean:.2f}')
  for j, (name, hist) in enumerate((measured or {}).items()):
    hist = np.asarray(hist, np.float64)
    right.bar(k + (len(dist_alphas) + j - (groups - 1) / 2) * w, hist / hist.sum(), w,
              color=GREY, hatch='//', label=f'{name}: mean {np.dot(k, hist) / hist.sum():.2f}')
  right.set(xlabel='tokens per target call (n accepted + 1)', ylabel='probability',
            title=f'distribution at gamma = {dist_gamma}', xticks=k)
  right.legend(fontsize=8)
  fig.tight_layout()
  return fig


def plot_speedup_operations(settings: Sequence[tuple], gamma_max: int = 10
                            ) -> matplotlib.figure.Figure:
  """Speedup (eq. 5) and operations (eq. 6, c_hat = c) against gamma.

  The best gamma of each (alpha, c) by eq. (5) (theory.best_gamma) is circled
  on both panels.

  Args:
    settings: (alpha, c) or (alpha, c, name) tuples, one curve each.
    gamma_max: the largest gamma drawn.
  """
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
  gammas = np.arange(1, gamma_max + 1)
  colors = plt.cm.tab10(np.arange(len(settings)))
  for setting, color in zip(settings, colors):
    alpha, c = setting[:2]
    speed = theory.walltime_improvement(alpha, gammas, c)
    ops = theory.operations_factor(alpha, gammas, c)
    best, best_speed = theory.best_gamma(alpha, c, gamma_max=gamma_max)
    label = f'alpha = {alpha}, c = {c}: best gamma {int(best)}'
    if len(setting) > 2:
      label = f'{setting[2]}: {label}'
    left.plot(gammas, speed, 'o-', ms=3, color=color, label=label)
    right.plot(gammas, ops, 'o-', ms=3, color=color, label=label)
    for ax, value in ((left, best_speed), (right, ops[int(best) - 1])):
      ax.plot(best, value, 'o', ms=14, mfc='none', mec=color, mew=2)
  left.axhline(1, color=GREY, lw=1)
  right.axhline(1, color=GREY, lw=1)
  left.set(xlabel='gamma', ylabel='walltime speedup', xticks=gammas,
           title='eq. (5): (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))')
  right.set(xlabel='gamma', ylabel='arithmetic operations (x baseline)', xticks=gammas,
            title='eq. (6) with c_hat = c')
  left.legend(fontsize=8)
  right.legend(fontsize=8)
  fig.tight_layout()
  return fig


def plot_accept_histograms(histograms: dict[str, np.ndarray]) -> matplotlib.figure.Figure:
  """Small bar charts of DecodeOutput.accept_histogram, one panel per run."""
  fig, axes = plt.subplots(1, len(histograms), figsize=(3.2 * len(histograms), 2.6),
                           squeeze=False)
  for ax, (name, hist) in zip(axes[0], histograms.items()):
    hist = np.asarray(hist)
    n = np.arange(len(hist))
    ax.bar(n, hist, color=[GREEN] * (len(hist) - 1) + [BLUE])  # Blue: a clean sweep.
    ax.set(xticks=n, xlabel='drafts accepted per target call')
    ax.set_title(name, fontsize=9)
  axes[0, 0].set_ylabel('target calls')
  fig.tight_layout()
  return fig
