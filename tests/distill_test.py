"""Tests for spec_decode.training.distill, tasks.distilled_task and gin/runs/distill.gin."""

import json

import gin
import jax
import numpy as np
import pytest
import sentencepiece as spm
import seqio

from spec_decode.models import alpha as alpha_lib
from spec_decode import checkpoints
from spec_decode import data
from spec_decode import text
from spec_decode.training import distill
from spec_decode.training import tasks
from spec_decode.training import train
from tests import script_runner

RECORDS = [
    {'inputs': 'translate English to German: A dog runs.', 'targets': 'Ein Hund rennt.',
     'source': 'demo_ende:train'},
    {'inputs': 'summarize: A tool to read files.', 'targets': 'file reader',
     'source': 'demo_debsum:train'},
]
# An output that ran out of length (keep_unfinished): its ids, no EOS.
UNFINISHED = {'inputs': 'summarize: loops', 'targets': 'RRRR', 'target_ids': [9, 9, 9, 9],
              'finished': False, 'source': 'demo_debsum:train'}


def test_select_examples_is_a_seeded_subset_in_file_order():
  everything = data.load_examples('demo_multi30k', 'validation')
  subset = distill.select_examples('demo_multi30k', 'validation', 50, seed=3)
  assert subset == distill.select_examples('demo_multi30k', 'validation', 50, seed=3)
  assert subset != distill.select_examples('demo_multi30k', 'validation', 50, seed=4)
  positions = [everything.index({'inputs': e['inputs'], 'targets': e['targets']}) for e in subset]
  assert len(subset) == 50 and positions == sorted(positions)
  assert {e['source'] for e in subset} == {'demo_multi30k:validation'}
  assert len(distill.select_examples('demo_multi30k', 'validation', None)) == len(everything)


def _three_outputs(monkeypatch):
  """Stubs decoding with outputs 'Hallo Welt', one cut without EOS, and an empty one."""
  hello = data.vocabulary().encode('Hallo Welt')
  outputs = np.zeros((3, 8), np.int32)
  outputs[0, :len(hello) + 1] = hello + [text.EOS_ID]
  outputs[1, :] = 7  # ran out of length without EOS
  outputs[2, 0] = text.EOS_ID  # an empty output is still a finished one
  lengths = np.array([len(hello) + 1, 8, 1])
  # Decoded shortest input first, returned in the examples' order.
  monkeypatch.setattr(data.vocabulary(), 'encode_batch', lambda texts, _: texts)
  decoded = []

  def generate_sequences(target, texts, **kwargs):
    decoded.append(texts)
    return outputs[[2, 0, 1]], lengths[[2, 0, 1]]

  monkeypatch.setattr(alpha_lib, 'generate_sequences', generate_sequences)
  return decoded, [dict(inputs='x' * n, targets='reference', source='s') for n in (2, 3, 1)]


def test_distill_keeps_outputs_that_end_with_eos(monkeypatch):
  decoded, examples = _three_outputs(monkeypatch)
  kept, dropped = distill.distill_examples(None, examples, max_input_len=16, max_decode_len=8,
                                           progress=False)
  assert decoded == [['x', 'xx', 'xxx']] and dropped == 1
  assert kept == [dict(inputs='xx', targets='Hallo Welt', source='s'),
                  dict(inputs='x', targets='', source='s')]


def test_distill_keeps_unfinished_outputs_with_their_ids_on_request(monkeypatch):
  _, examples = _three_outputs(monkeypatch)
  kept, unfinished = distill.distill_examples(None, examples, max_input_len=16, max_decode_len=8,
                                              keep_unfinished=True, progress=False)
  assert unfinished == 1
  cut = data.vocabulary().decode([7] * 8)
  assert kept == [dict(inputs='xx', targets='Hallo Welt', source='s'),
                  dict(inputs='xxx', targets=cut, target_ids=[7] * 8, finished=False, source='s'),
                  dict(inputs='x', targets='', source='s')]


def test_distill_samples_at_the_given_temperature_and_seed(monkeypatch):
  calls = []

  def generate_sequences(target, texts, *, sampling, rng, **kwargs):
    calls.append((float(sampling.temperature), jax.random.key_data(rng).tolist()))
    return np.array([[text.EOS_ID]]), np.array([1])

  monkeypatch.setattr(alpha_lib, 'generate_sequences', generate_sequences)
  example = [dict(inputs='x', targets='reference')]
  for temperature, seed in ((0.0, 0), (1.0, 5)):
    distill.distill_examples(None, example, max_input_len=16, max_decode_len=8,
                             temperature=temperature, seed=seed, progress=False)
  assert calls == [(0.0, jax.random.key_data(jax.random.key(0)).tolist()),
                   (1.0, jax.random.key_data(jax.random.key(5)).tolist())]


def test_splits_round_trip_and_bad_files_are_named(tmp_path):
  distill.write_split(tmp_path / 'd' / 'train.jsonl', RECORDS + [UNFINISHED])
  assert distill.read_split(tmp_path / 'd', 'train') == RECORDS + [UNFINISHED]
  with pytest.raises(FileNotFoundError, match='validation.jsonl'):
    distill.read_split(tmp_path / 'd', 'validation')
  (tmp_path / 'd' / 'validation.jsonl').write_text(json.dumps({'inputs': 'x'}) + '\n')
  with pytest.raises(ValueError, match='line 1: needs string "inputs" and "targets"'):
    distill.read_split(tmp_path / 'd', 'validation')
  (tmp_path / 'd' / 'validation.jsonl').write_text(
      json.dumps(dict(UNFINISHED, target_ids=[9, 'R'])) + '\n')
  with pytest.raises(ValueError, match='line 1: "target_ids" must be a list of token ids'):
    distill.read_split(tmp_path / 'd', 'validation')


def test_distilled_task_tokenizes_the_records_and_skips_unfinished_ones(tmp_path):
  for split in distill.SPLITS:
    distill.write_split(tmp_path / f'{split}.jsonl', [UNFINISHED] + RECORDS)
  name = tasks.distilled_task(str(tmp_path), name='test_distilled')
  task = seqio.get_mixture_or_task(name)
  assert task.num_input_examples('train') == 2
  ds = task.get_dataset({'inputs': 64, 'targets': 64}, split='validation', shuffle=False)
  vocab = task.output_features['targets'].vocabulary
  for example, record in zip(ds.as_numpy_iterator(), RECORDS):
    for key in ('inputs', 'targets'):
      assert example[key].tolist() == vocab.encode(record[key]) + [1]


def test_distill_gin_trains_a_draft_on_the_records(tmp_path):
  for split in distill.SPLITS:
    distill.write_split(tmp_path / 'distill' / f'{split}.jsonl', RECORDS * 8)
  gin.clear_config()
  try:
    status = train.main([
        '--gin_file=runs/distill.gin', '--gin_file=models/demo/draft_small.gin',
        '--gin.MODEL_CONFIG=@demo_draft_small/t5.T5Config()',
        f"--gin.WORKDIR='{tmp_path / 'run'}'", f"--gin.DISTILL_DIR='{tmp_path / 'distill'}'",
        '--gin.NUM_STEPS=2', '--gin.WARMUP_STEPS=1', '--gin.BATCH_TOKENS=512',
        '--gin.train.TrainConfig.eval_batches=1'])
    assert status == 0
    assert gin.query_parameter('OPTIMIZER/macro.value') == 'adafactor'
  finally:
    gin.clear_config()
  log = [json.loads(line) for line in open(tmp_path / 'run' / 'log.jsonl')]
  assert [r['step'] for r in log if 'eval_loss' in r] == [2]
  # The run recorded the vocabulary of its task, the bundled one.
  assert checkpoints.read_vocabulary(tmp_path / 'run' / 'checkpoints')['file'] == 'spm_8k.model'


def test_distill_gin_refuses_zero_steps_before_anything_runs(tmp_path, capsys):
  for split in distill.SPLITS:
    distill.write_split(tmp_path / f'{split}.jsonl', RECORDS)
  gin.clear_config()
  try:
    status = train.main([
        '--gin_file=runs/distill.gin', '--gin_file=models/demo/draft_small.gin',
        '--gin.MODEL_CONFIG=@demo_draft_small/t5.T5Config()',
        f"--gin.WORKDIR='{tmp_path / 'run'}'", f"--gin.DISTILL_DIR='{tmp_path}'",
        '--gin.NUM_STEPS=0'])
  finally:
    gin.clear_config()
  assert status == 1
  assert 'TrainConfig.num_steps = 0: must be an integer >= 1' in capsys.readouterr().err
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('flags, message', [
    (['--max_decode_len', '0'], '--max_decode_len 0: must be >= 1'),
    (['--temperature', 'nan'], '--temperature nan: must be a finite number >= 0'),
    (['--batch_size', '-1'], '--batch_size -1: must be >= 1'),
])
def test_distill_script_refuses_bad_settings(tmp_path, flags, message):
  result = script_runner.run(
      'distill.py', '--config', 'demo_target', '--checkpoint', str(data.DATA_DIR / 'models' /
                                                                   'target'),
      '--train', 'demo_multi30k:train:2', '--validation', 'demo_multi30k:validation:2',
      '--out_dir', str(tmp_path / 'out'), *flags)
  assert result.returncode == 2 and message in result.stderr
  assert not (tmp_path / 'out').exists()


def test_distill_script_refuses_a_checkpoint_of_another_vocabulary_and_records_its_own(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('\n'.join(f'Zwei Hunde spielen {i} mal im Schnee.' for i in range(200)))
  spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / 'other'),
                                 vocab_size=40, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
  checkpoints.write_vocabulary(tmp_path / 'other_target', tmp_path / 'other.model')
  args = ['--config', 'demo_target', '--train', 'demo_multi30k:train:2', '--validation',
          'demo_multi30k:validation:2', '--max_decode_len', '8', '--out_dir', str(tmp_path / 'out')]
  result = script_runner.run('distill.py', '--checkpoint', str(tmp_path / 'other_target'), *args)
  assert result.returncode == 2
  assert 'other.model' in result.stderr and '--allow_vocabulary_mismatch' in result.stderr
  result = script_runner.run('distill.py', '--checkpoint',
                             str(data.DATA_DIR / 'models' / 'target'), *args)
  assert result.returncode == 0, result.stderr
  assert checkpoints.check_vocabulary(tmp_path / 'out', data.VOCAB_PATH)['file'] == 'spm_8k.model'
