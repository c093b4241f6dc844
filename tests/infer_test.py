"""End-to-end tests of scripts/decode.py (spec_decode.cli.infer) on tiny random T5 checkpoints.

Each command-line run is a subprocess (8-9 s each in a full suite run: imports,
loading, compiling).
"""

import json
import pathlib
import subprocess
import sys

import jax
import pytest
import sentencepiece

from spec_decode import checkpoints
from spec_decode.cli import infer
from spec_decode.cli import jsonl
from spec_decode import data
from spec_decode import models
from spec_decode.t5 import t5_1_1
from tests import tolerances

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / 'scripts' / 'decode.py'
GAMMA = 3
INPUTS = [
    'A man is riding a bicycle.',
    '{"inputs": "Two dogs play in the snow.", "targets": "Zwei Hunde spielen im Schnee."}',
    'The weather is nice today.',
    'Children are playing football in the park.',
    'She reads a book.',
]
RECORD_FIELDS = {'line', 'inputs', 'output', 'output_ids', 'generated_tokens', 'target_calls',
                 'draft_calls', 'tokens_per_target_call', 'batch', 'batch_walltime_s',
                 'batch_accept_histogram'}


@pytest.fixture(scope='module')
def checkpoint_dir(tmp_path_factory):
  """T5X checkpoints of a tiny target over the 8k vocabulary and a draft of the
  same size whose perturbed weights make it right some of the time."""
  directory = tmp_path_factory.mktemp('checkpoints')
  target = models.T5Model.random(t5_1_1('tiny', vocab_size=8192), jax.random.key(0))
  leaves, treedef = jax.tree.flatten(target.params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  draft = jax.tree.unflatten(treedef, [x + 0.3 * x.std() * jax.random.normal(k, x.shape)
                                       for x, k in zip(leaves, keys)])
  checkpoints.write_t5x(str(directory / 'target'), target.params)
  checkpoints.write_t5x(str(directory / 'draft'), draft)
  return directory


def _gin_file(tmp_path, checkpoint_dir, run: str) -> pathlib.Path:
  """A run file over the repository's runs/{run}.gin and models/tiny.gin."""
  lines = [
      'from __gin__ import dynamic_registration',
      'from spec_decode import t5',
      f"include 'runs/{run}.gin'",
      "include 'models/tiny.gin'",
      'TARGET_CONFIG = @tiny/t5.T5Config()',
      f"TARGET_CHECKPOINT = '{checkpoint_dir / 'target'}'",
      f"VOCABULARY_FILE = '{data.VOCAB_PATH}'",
      'MAX_INPUT_LEN = 24',
      'MAX_DECODE_LEN = 12',
  ]
  if run == 'decode':
    lines += ['DRAFT_CONFIG = @tiny/t5.T5Config()',
              f"DRAFT_CHECKPOINT = '{checkpoint_dir / 'draft'}'"]
  path = tmp_path / f'{run}.gin'
  path.write_text('\n'.join(lines) + '\n')
  return path


def _decode(gin_file, *flags, stdin='') -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(SCRIPT), f'--gin_file={gin_file}', *flags],
                        input=stdin, capture_output=True, text=True, timeout=300)


def _records(jsonl: str) -> list[dict]:
  return [json.loads(line) for line in jsonl.splitlines()]


def test_greedy_speculative_equals_greedy_baseline(tmp_path, checkpoint_dir):
  # Speculative: stdin to stdout, batches of 2 (the last one padded).
  # Block verification and an adaptive draft length with a short verify call (the defaults,
  # 'token', gamma drafts and gamma + 1 positions, run in the other tests): the same outputs.
  speculative = _decode(_gin_file(tmp_path, checkpoint_dir, 'decode'), f'--gin.GAMMA={GAMMA}',
                        '--gin.BATCH_SIZE=2', "--gin.VERIFICATION='block'",
                        '--gin.CONFIDENCE_THRESHOLD=0.4', '--gin.VERIFY_LENGTHS=[2]',
                        stdin='\n'.join(INPUTS) + '\n')
  assert speculative.returncode == 0, speculative.stderr
  # Baseline: file to file, batches of 3.
  input_file, output_file = tmp_path / 'inputs.txt', tmp_path / 'outputs.jsonl'
  input_file.write_text('\n'.join(INPUTS) + '\n')
  baseline = _decode(_gin_file(tmp_path, checkpoint_dir, 'baseline'), '--gin.BATCH_SIZE=3',
                     f"--gin.INPUT_FILE='{input_file}'", f"--gin.OUTPUT_FILE='{output_file}'")
  assert baseline.returncode == 0, baseline.stderr
  assert baseline.stdout == ''

  speculative_records, baseline_records = _records(speculative.stdout), _records(
      output_file.read_text())
  lines = list(range(1, len(INPUTS) + 1))
  for records in (speculative_records, baseline_records):
    assert [r['line'] for r in records] == lines
    for r in records:
      assert RECORD_FIELDS <= set(r), r
      assert len(r['output_ids']) == r['generated_tokens'] > 0
      assert r['tokens_per_target_call'] == pytest.approx(r['generated_tokens'] /
                                                          r['target_calls'])
    assert records[1]['inputs'] == 'Two dogs play in the snow.'
    assert records[1]['targets'] == 'Zwei Hunde spielen im Schnee.'
  assert [r['batch'] for r in speculative_records] == [0, 0, 1, 1, 2]
  assert all(len(r['batch_accept_histogram']) == GAMMA + 1
             and r['draft_calls'] >= r['target_calls']
             for r in speculative_records)
  assert sum(sum(r['batch_accept_histogram'][1:]) for r in speculative_records) > 0
  assert all(r['draft_calls'] == 0 for r in baseline_records)
  for s, b in zip(speculative_records, baseline_records):
    assert (s['output_ids'], s['output']) == (b['output_ids'], b['output'])
  for result in (speculative, baseline):
    assert 'compile' in result.stderr and 'tokens per target call' in result.stderr
  assert 'accepted drafts 0..3' in speculative.stderr
  assert 'drafts proposed 0..3' in speculative.stderr


TOO_LONG = 'one two three four five six seven eight nine ten ' * 4
TOO_LONG_TOKENS = len(sentencepiece.SentencePieceProcessor(
    model_file=str(data.VOCAB_PATH)).encode(TOO_LONG)) + 1  # EOS


@pytest.mark.parametrize('flags, message', [
    ((), f'stdin line 3: input of {TOO_LONG_TOKENS} tokens (EOS included) > max_input_len=24'),
    (("--gin.DRAFT_CHECKPOINT='/nonexistent/checkpoint_1'",),
     'draft checkpoint: no checkpoint at /nonexistent/checkpoint_1'),
])
def test_errors(tmp_path, checkpoint_dir, flags, message):
  stdin = '\n'.join(['A short line.', 'Another one.', TOO_LONG]) + '\n'
  result = _decode(_gin_file(tmp_path, checkpoint_dir, 'decode'), *flags, stdin=stdin)
  assert result.returncode == 1
  assert f'error: {message}' in result.stderr, result.stderr
  assert 'Traceback' not in result.stderr
  assert result.stdout == ''


class _CharVocabulary:
  """One id per character: a stand-in for seqio vocabularies."""

  vocab_size = 256

  def encode(self, text):
    return [2 + ord(c) % 254 for c in text]


def test_read_examples_truncates_like_seqio(tmp_path):
  path = tmp_path / 'inputs.jsonl'
  path.write_text('abcdefgh\n{"inputs": "xy", "id": 7}\nnot json\n')
  examples = infer.read_examples(str(path), _CharVocabulary(), input_prefix='p:',
                                 max_input_len=6, truncate=True)
  assert [e.line for e in examples] == [1, 2, 3]
  assert examples[0].tokens == _CharVocabulary().encode('p:abc') + [jsonl.EOS_ID]
  assert examples[1].fields == {'inputs': 'xy', 'id': 7}
  assert examples[1].tokens == _CharVocabulary().encode('p:xy') + [jsonl.EOS_ID]
  assert examples[2].fields == {'inputs': 'not json'}
  with pytest.raises(infer.ConfigError, match=r'line 1: input of 11 tokens .* max_input_len=6'):
    infer.read_examples(str(path), _CharVocabulary(), input_prefix='p:', max_input_len=6)


def test_json_input_without_inputs_field(tmp_path):
  path = tmp_path / 'inputs.jsonl'
  path.write_text('{"text": "no inputs field"}\n')
  with pytest.raises(infer.ConfigError, match='line 1: a JSON input needs a string "inputs"'):
    infer.read_examples(str(path), _CharVocabulary(), max_input_len=64)


@pytest.mark.parametrize('draft_vocab, vocabulary_size, message', [
    (128, 256, r"the vocabulary \(_CharVocabulary\) has 256 ids but the models' vocab_size is "
               r'128 \(expected 256, '),
    (64, 100, 'draft vocab_size 64 != target vocab_size 128'),
    # 100 ids padded to 128 fit the models: the check moves on to the checkpoints.
    (128, 100, 'target checkpoint: no checkpoint at unused'),
])
def test_vocabulary_mismatch(draft_vocab, vocabulary_size, message):
  vocabulary = _CharVocabulary()
  vocabulary.vocab_size = vocabulary_size
  with pytest.raises(infer.ConfigError, match=message):
    infer.infer(target_config=t5_1_1('tiny', vocab_size=128), target_checkpoint='unused',
                draft_config=t5_1_1('nano', vocab_size=draft_vocab), draft_checkpoint='unused',
                vocabulary=vocabulary)


def test_beam_search_with_and_without_a_draft(tmp_path, checkpoint_dir):
  """DECODE='beam': the draft changes the target calls, not the beams."""
  stdin = '\n'.join(INPUTS) + '\n'
  plain = _decode(_gin_file(tmp_path, checkpoint_dir, 'baseline'), "--gin.DECODE='beam'",
                  '--gin.BEAM_SIZE=3', '--gin.BATCH_SIZE=2', stdin=stdin)
  assert plain.returncode == 0, plain.stderr
  speculative = _decode(_gin_file(tmp_path, checkpoint_dir, 'decode'), "--gin.DECODE='beam'",
                        '--gin.BEAM_SIZE=3', '--gin.BATCH_SIZE=2', '--gin.GAMMA=2',
                        '--gin.DRAFT_WIDTH=2', stdin=stdin)
  assert speculative.returncode == 0, speculative.stderr
  plain_records, speculative_records = _records(plain.stdout), _records(speculative.stdout)
  assert len(plain_records) == len(speculative_records) == 5
  for p, s in zip(plain_records, speculative_records):
    assert len(p['beams']) == 3 and p['beam_steps'] == p['target_calls']
    assert (p['output_ids'], p['score']) == (p['beams'][0]['output_ids'], p['beams'][0]['score'])
    assert p['beams'][0]['score'] >= p['beams'][1]['score'] >= p['beams'][2]['score']
    assert [b['output_ids'] for b in s['beams']] == [b['output_ids'] for b in p['beams']]
    # Scored by calls over gamma + 1 positions against one position: float32 rounding apart.
    tolerances.assert_close([b['score'] for b in s['beams']], [b['score'] for b in p['beams']],
                            ulps=32)
    assert s['draft_calls'] >= 2 * s['target_calls'] and p['draft_calls'] == 0


def test_the_drafts_own_knobs_reach_the_loop(tmp_path, checkpoint_dir):
  # The target as its own draft at T = 1: with the target's knobs q = p and every draft is
  # accepted; a greedy q (DRAFT_TEMPERATURE = 0) differs from p and some are rejected.
  gin_file = _gin_file(tmp_path, checkpoint_dir, 'decode')
  flags = [f"--gin.DRAFT_CHECKPOINT='{checkpoint_dir / 'target'}'", f'--gin.GAMMA={GAMMA}',
           '--gin.TEMPERATURE=1.0', '--gin.BATCH_SIZE=5']
  stdin = '\n'.join(INPUTS) + '\n'
  histograms = {}
  for name, extra in (('same', []), ('greedy_q', ['--gin.DRAFT_TEMPERATURE=0.0'])):
    result = _decode(gin_file, *flags, *extra, stdin=stdin)
    assert result.returncode == 0, result.stderr
    histograms[name] = _records(result.stdout)[0]['batch_accept_histogram']
  assert sum(histograms['same'][:GAMMA]) == 0 < histograms['same'][GAMMA], histograms
  assert sum(histograms['greedy_q'][:GAMMA]) > 0, histograms
