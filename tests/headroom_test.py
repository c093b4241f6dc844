"""Tests for scripts/studies/headroom.py: by-hand rows, and its command line."""

import json
import math

import numpy as np
import pytest

from spec_decode import theory
from tests import script_runner

headroom = script_runner.load('studies/headroom.py')

# Speculative: 4.0 ms per iteration (1.0 of it the fixed cost) and 2.5 tokens per call,
# 1.6 ms per token against the baseline's 2.0: 1.25X.
ROW = dict(gamma=3, c=0.1, c_first=0.2, tokens_per_call=2.5, baseline_token_ms=2.0,
           iteration_ms=4.0, fixed_ms=1.0, measured_speedup=1.25, loop_alpha=0.6,
           temperature=0.0)
R = [1.0, 1.2, 1.3, 1.4, 1.5]  # r(K), K = 1 .. 5


def test_alpha_for_tokens_inverts_eq1_and_the_finite_model():
  for gamma in (1, 3, 7):
    for alpha in (0.1, 0.55, 0.9, 0.999):
      tokens = float(theory.expected_tokens(alpha, gamma))
      assert headroom.alpha_for_tokens(tokens, gamma) == pytest.approx(alpha, abs=1e-9)
  assert headroom.alpha_for_tokens(4.0, 3) == pytest.approx(1.0)
  assert math.isnan(headroom.alpha_for_tokens(4.01, 3))  # more than gamma + 1 per call
  assert headroom.alpha_for_tokens(0.5, 3) == headroom.alpha_for_tokens(1.0, 3) == 0.0
  # Outputs of 5 and 8 tokens: at alpha = 1, 2 + 2 calls of up to 4 tokens.
  assert headroom.tokens_per_call(1.0, 3, [5, 8]) == pytest.approx(13 / 4)
  assert math.isnan(headroom.alpha_for_tokens(3.3, 3, [5, 8]))
  tokens = headroom.tokens_per_call(0.6, 3, [5, 8])
  assert tokens == pytest.approx(13 / float(np.sum(theory.expected_calls(0.6, 3, [5, 8]))))
  assert tokens < float(theory.expected_tokens(0.6, 3))
  assert headroom.alpha_for_tokens(tokens, 3, [5, 8]) == pytest.approx(0.6, abs=1e-9)
  for bad in (0.0, float('nan')):
    with pytest.raises(ValueError, match='tokens must be > 0'):
      headroom.alpha_for_tokens(bad, 3)


def test_the_measured_speedup_needs_the_measured_tokens_per_call():
  entries = headroom.headroom(ROW, R, 1.25, gammas=(2, 3))
  decoded = entries[1]
  assert decoded['gamma'] == 3 and decoded['measured'] and not entries[0]['measured']
  assert decoded['loop_ms'] == pytest.approx(3.0)
  assert decoded['tokens'] == pytest.approx(2.5)
  assert decoded['alpha'] == pytest.approx(headroom.alpha_for_tokens(2.5, 3))
  # alpha = 1: 4 tokens per call, 0.4 ms fixed + 3.0 / 4 ms loop per token.
  assert decoded['ceiling'] == pytest.approx(2.0 / (0.4 + 0.75))


def test_other_gammas_scale_the_loop_by_summed_parts_or_whole_iterations():
  parts = headroom.headroom(ROW, R, 1.25, gammas=(2,))[0]
  # c_first + c + r(3) over c_first + 2 c + r(4): 1.6 / 1.8.
  assert parts['scaled'] == 'parts' and parts['loop_ms'] == pytest.approx(3.0 * 1.6 / 1.8)
  assert parts['ceiling'] == pytest.approx(2.0 / (0.4 + parts['loop_ms'] / 3))
  whole = headroom.headroom(ROW, R, 1.25, gammas=(2,), iteration_cost={'3': 2.0, '2': 1.5})[0]
  assert whole['scaled'] == 'whole' and whole['loop_ms'] == pytest.approx(2.25)
  # Without the decoded gamma's whole iteration the parts are used.
  assert headroom.headroom(ROW, R, 1.25, gammas=(2,),
                           iteration_cost={2: 1.5})[0]['scaled'] == 'parts'


def test_output_lengths_cap_the_tokens_per_call():
  row = dict(ROW, output_lengths=[5, 8])
  entry = headroom.headroom(row, R, 1.25, gammas=(3,))[0]
  assert entry['ceiling'] == pytest.approx(2.0 / (0.4 + 3.0 / (13 / 4)))
  assert entry['tokens'] == pytest.approx(2.5)
  assert entry['alpha'] == pytest.approx(headroom.alpha_for_tokens(2.5, 3, [5, 8]))
  assert entry['alpha'] > headroom.alpha_for_tokens(2.5, 3)  # eq. (1) asks for less
  with pytest.raises(ValueError, match='output_lengths must sum to > 0'):
    headroom.headroom(dict(ROW, output_lengths=[0]), R, 1.25, gammas=(3,))


def test_out_of_reach():
  easy, hard, fixed_bound = (headroom.headroom(ROW, R, s, gammas=(3,))[0]
                             for s in (0.5, 1.8, 5.0))
  assert easy['alpha'] == 0.0  # 0.5X needs fewer than one token per call
  assert hard['tokens'] > 4 and math.isnan(hard['alpha']) and hard['ceiling'] < 1.8
  # 5X leaves 0.4 ms per token, all of it the fixed cost's.
  assert fixed_bound['tokens'] == np.inf and math.isnan(fixed_bound['alpha'])


def test_bad_arguments():
  with pytest.raises(ValueError, match='no fixed_ms'):
    headroom.headroom({k: v for k, v in ROW.items() if k != 'fixed_ms'}, R, 1.45)
  with pytest.raises(ValueError, match='speedup must be > 0'):
    headroom.headroom(ROW, R, 0.0)
  with pytest.raises(ValueError, match=r'r needs K = 1 \.\. 8'):
    headroom.headroom(ROW, R, 1.45)


def test_script_prints_one_line_per_row(tmp_path):
  results = dict(walltime=[ROW, dict(ROW, temperature=1.0, top_k=40)],
                 timing=dict(r=R, iteration_cost={'3': 2.0}))
  (tmp_path / 'results.json').write_text(json.dumps(results))
  done = script_runner.run('studies/headroom.py', str(tmp_path), '--speedup', '1.25', '--gammas', '2', '3')
  assert done.returncode == 0, done.stderr[-2000:]
  rows = script_runner.table_rows(done.stdout, str(tmp_path))
  assert [row[1] for row in rows] == ['T=0', 'T=1 top_k=40']
  ceiling = 2.0 / (0.4 + 0.75)
  alpha = headroom.alpha_for_tokens(2.5, 3)
  assert rows[0][2:] == ['3', '1.25X', '2.50', '0.600', f'~{2.0 / (0.4 + 3.0 * 1.6 / 1.8 / 3):.2f}X; '
                         f'{headroom.alpha_for_tokens(3.0 * 1.6 / 1.8 / 1.2, 2):.3f}',
                         f'{ceiling:.2f}X; {alpha:.3f}']
  missing = script_runner.run('studies/headroom.py', str(tmp_path / 'nowhere'))
  assert missing.returncode == 1 and 'no results.json' in missing.stderr
