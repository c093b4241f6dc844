"""Tests for spec_decode.training.metrics: BLEU and ROUGE as T5 scores them, without seqio."""

import subprocess
import sys

import pytest

from spec_decode.training import metrics


def test_metrics():
  targets = ['Der Hund läuft schnell über die Wiese .',
             'Ein Mann fährt Fahrrad .']
  assert metrics.bleu(targets, targets)['bleu'] == pytest.approx(100)
  assert metrics.rouge(targets, targets) == pytest.approx(
      {'rouge1': 100, 'rouge2': 100, 'rougeLsum': 100})
  partial = ['Der Hund läuft langsam über die Straße .', 'Ein Mann fährt .']
  assert 0 < metrics.bleu(targets, partial)['bleu'] < 100
  scores = metrics.rouge(targets, partial)
  assert all(0 < v < 100 for v in scores.values())
  assert scores['rouge1'] > scores['rouge2']
  unrelated = ['xyz qqq', 'abc']
  assert metrics.bleu(targets, unrelated)['bleu'] < 1
  assert metrics.rouge(targets, unrelated)['rouge1'] == 0


def test_the_walltime_harness_imports_neither_seqio_nor_tensorflow():
  # They take seconds to import, which every script and the demo would pay at start.
  code = ('import sys; import spec_decode.demo, spec_decode.harness.experiments; '
          'print(sorted({"seqio", "tensorflow", "nltk"} & set(sys.modules)))')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == '[]'


def test_a_metric_without_its_library_is_left_out_with_a_note(monkeypatch, capsys):
  from spec_decode.harness import experiments  # pylint: disable=import-outside-toplevel
  assert metrics.missing('bleu') is None
  monkeypatch.setitem(metrics.LIBRARIES, 'bleu', 'no_such_bleu_library')
  assert metrics.missing('bleu') == 'no_such_bleu_library'
  assert experiments.output_quality('demo_ende', ['Zwei Hunde.'], [[5, 6, 1]]) == {}
  assert 'no_such_bleu_library is not installed' in capsys.readouterr().err
