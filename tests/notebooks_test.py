"""The Colab notebooks: stripped in git, executed top to bottom, and the harness's trace.

The execution tests run each notebook with nbclient in a fresh kernel, from the
repository root, with SPEC_DECODE_SMALL=1 (fewer samples, shorter K range) and
the figures written to a temporary folder; any cell error fails the test.
"""

import os
import pathlib

import jax
import numpy as np
import pytest

from spec_decode.harness import figures
from spec_decode.harness import trace
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.t5 import t5_1_1

nbformat = pytest.importorskip('nbformat')

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ('quickstart', 'paper_figures')
FIGURES = ('roofline', 'draft_verify_loop', 'speculative_sampling', 'tokens_per_call',
           'speedup_operations')


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_notebook_is_stripped(name):
  nb = nbformat.read(ROOT / 'notebooks' / f'{name}.ipynb', as_version=4)
  nbformat.validate(nb)
  for i, cell in enumerate(nb.cells):
    if cell.cell_type == 'code':
      assert cell.outputs == [], f'{name} cell {i} has outputs: strip them before committing'
      assert cell.execution_count is None, f'{name} cell {i} has an execution count'


def _execute(name: str, figures_dir: pathlib.Path) -> None:
  nbclient = pytest.importorskip('nbclient')
  nb = nbformat.read(ROOT / 'notebooks' / f'{name}.ipynb', as_version=4)
  env = dict(SPEC_DECODE_SMALL='1', SPEC_DECODE_FIGURES_DIR=str(figures_dir),
             MPLBACKEND='Agg')
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)  # The kernel inherits this process's environment.
  try:
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                     resources={'metadata': {'path': str(ROOT)}})
    client.execute()  # Raises CellExecutionError on the first failing cell.
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.mark.slow
def test_quickstart_executes(tmp_path):
  _execute('quickstart', tmp_path)


@pytest.mark.slow
def test_paper_figures_executes(tmp_path):
  _execute('paper_figures', tmp_path)
  assert sorted(p.stem for p in tmp_path.glob('*.png')) == sorted(FIGURES)


@pytest.fixture(scope='module')
def pair():
  config = t5_1_1('tiny', vocab_size=32)
  target = models.T5Model.random(config, jax.random.key(0))
  leaves, treedef = jax.tree.flatten(target.params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  noisy = [x + 0.5 * jax.numpy.std(x) * jax.random.normal(k, x.shape)
           for x, k in zip(leaves, keys)]
  return target, target.replace(params=jax.tree.unflatten(treedef, noisy))


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_trace_equals_speculative_generate(pair, temperature):
  target, draft = pair
  inputs = np.array([[5, 9, 3, 7, 1, 0]], np.int32)
  sampling = sampling_lib.SamplingParams.create(temperature)
  for seed in range(3):
    key = jax.random.key(seed)
    iterations, tokens = trace.trace_speculative(target, draft, inputs, key, gamma=3,
                                                 max_decode_len=12, sampling=sampling)
    out = models.speculative_generate(target, draft, inputs, key, gamma=3, max_decode_len=12,
                                      sampling=sampling)
    assert tokens == np.asarray(out.tokens[0, :out.lengths[0]]).tolist()
    assert len(iterations) == int(out.loop_target_calls)
    assert sum(len(it.emitted) for it in iterations) == len(tokens)
    hist = np.bincount([it.accepted for it in iterations], minlength=4)
    np.testing.assert_array_equal(hist, np.asarray(out.accept_histogram))


def test_speculative_samples_match_p():
  p = np.array([0.05, 0.30, 0.25, 0.20, 0.15, 0.05])
  q = np.array([0.25, 0.30, 0.05, 0.10, 0.10, 0.20])
  counts, accepted = figures.speculative_samples(p, q, 20_000, jax.random.key(0))
  assert counts.sum() == 20_000
  np.testing.assert_allclose(counts / counts.sum(), p, atol=0.015)
  assert abs(accepted - np.minimum(p, q).sum()) < 0.02


def test_roofline():
  ks = np.array([1, 8, 229, 1000])
  t = figures.roofline_step_time(ks, 11e9)
  np.testing.assert_allclose(t[:2], 22e9 / 1.2e12)  # memory-bound: flat
  np.testing.assert_allclose(t[3], 2 * 11e9 * 1000 / 275e12)
  assert figures.ridge_k(11e9) == pytest.approx(275e12 * 2 / (2 * 1.2e12))
