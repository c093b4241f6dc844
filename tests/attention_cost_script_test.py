"""Tests for scripts/studies/attention_cost.py and the compiled runs it times."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.harness import step_costs
from spec_decode import models
from spec_decode.t5 import layers
from spec_decode.t5 import t5_1_1
from tests import script_runner


def test_prints_both_programs_per_k():
  done = script_runner.run('studies/attention_cost.py', '--config', 'nano', '--k_max', '2',
                           '--max_decode_len', '8', '--num_steps', '2', '--rounds', '2')
  assert done.returncode == 0, done.stderr[-2000:]
  rows = script_runner.table_rows(done.stdout)[1:]  # the header row first
  assert [row[0] for row in rows] == ['1', '2']
  assert float(rows[0][2]) == 1.0 and float(rows[0][4]) == 1.0  # r(1), both programs
  assert all(float(row[1]) > 0 and float(row[3]) > 0 for row in rows)
  assert 'nano (random weights)' in done.stdout


def test_bad_counts_are_an_error():
  done = script_runner.run('studies/attention_cost.py', '--k_max', '0')
  assert done.returncode == 2 and 'must be >= 1' in done.stderr


def test_compiled_step_loop_runs_the_code_of_its_call(monkeypatch):
  # jit reuses a function's first trace for the same arguments; a variant patched in
  # afterwards must still be what runs (the A/B harnesses' pitfall).
  model = models.T5Model.random(t5_1_1('nano', vocab_size=64), jax.random.key(0))
  x = jnp.arange(1, 9, dtype=jnp.int32)[None]
  common = dict(k=2, capacity=12, position=3, num_steps=3)
  as_is = step_costs.compiled_step_loop(model, x, **common)
  call = layers.MultiHeadAttention.__call__
  monkeypatch.setattr(layers.MultiHeadAttention, '__call__',
                      lambda self, q, k, v, bias, deterministic=True: 0 * call(
                          self, q, k, v, bias, deterministic))
  patched = step_costs.compiled_step_loop(model, x, **common)
  monkeypatch.undo()
  again = step_costs.compiled_step_loop(model, x, **common)
  first, second, third = (np.asarray(run()) for run in (as_is, patched, again))
  assert not np.array_equal(first, second) and np.array_equal(first, third)
