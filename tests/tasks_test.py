"""Tests for spec_decode.training.tasks and the bundled data and vocabulary."""

import gzip
import importlib

import numpy as np
import pytest
import seqio
import sentencepiece as spm
import tensorflow as tf

from spec_decode import data
from spec_decode.training import tasks

# Split sizes stated in each corpus's PROVENANCE.md.
PROVENANCE_COUNTS = {
    'demo_ende': {'train': 29000 + 31360, 'validation': 1014 + 691,
                  'test_multi30k': 1000, 'test_ddtp': 644,
                  'test_newstest2014': 3003},
    'demo_debsum': {'train': 48113, 'validation': 1044, 'test': 1001,
                    'test_cnndm': 100 + 100},
    'demo_multi30k': {'train': 29000, 'validation': 1014, 'test': 1000},
}
GERMAN = 'Die Straße über den Fluß führt zu schönen Häusern; Öl ist größer als Äpfel.'


def test_tasks_registered():
  for name in ('wmt_t2t_ende_v003', 'cnn_dailymail_v002', 'demo_ende',
               'demo_debsum', 'demo_multi30k'):
    assert name in seqio.TaskRegistry.names()
  assert 'demo_mix' in seqio.MixtureRegistry.names()


def test_reimport_is_idempotent():
  importlib.reload(tasks)
  assert 'demo_ende' in seqio.TaskRegistry.names()
  assert 'demo_mix' in seqio.MixtureRegistry.names()


@pytest.mark.parametrize('task_name', ['demo_ende', 'demo_debsum', 'demo_multi30k'])
def test_split_sizes_match_provenance(task_name):
  counts = PROVENANCE_COUNTS[task_name]
  assert tasks.NUM_EXAMPLES[task_name] == counts
  assert data.splits(task_name) == tuple(counts)
  for split, count in counts.items():
    assert len(data.load_examples(task_name, split)) == count
  task = seqio.get_mixture_or_task(task_name)
  for split, count in counts.items():
    assert task.num_input_examples(split) == count


def test_dataset_is_tokenized_with_eos():
  task = seqio.get_mixture_or_task('demo_ende')
  ds = task.get_dataset({'inputs': 32, 'targets': 128}, split='test_ddtp',
                        shuffle=False)
  examples = list(ds.take(3).as_numpy_iterator())
  raw = data.load_examples('demo_ende', 'test_ddtp', limit=3)
  vocab = task.output_features['targets'].vocabulary
  for ex, expected in zip(examples, raw):
    for key in ('inputs', 'targets'):
      assert ex[key][-1] == 1
      assert ex[f'{key}_pretokenized'].decode() == expected[key]
    assert len(ex['inputs']) <= 32  # Trimmed, then eos appended.
    assert vocab.decode(ex['targets'][:-1].tolist()) == expected['targets']


def test_summarization_dataset_counts_test_cnndm():
  task = seqio.get_mixture_or_task('demo_debsum')
  ds = task.get_dataset({'inputs': 512, 'targets': 128}, split='test_cnndm',
                        shuffle=False)
  lengths = [len(ex['inputs']) for ex in ds.as_numpy_iterator()]
  assert len(lengths) == 200 and max(lengths) == 512


def test_mixture_rates():
  mix = seqio.get_mixture_or_task('demo_mix')
  rates = {t.name: mix.get_rate(t) for t in mix.tasks}
  assert rates == {'demo_ende': 60360,
                   'demo_multi30k': 29000 * tasks.DEMO_MULTI30K_RATE,
                   'demo_debsum': 48113 * tasks.DEMO_SUMMARIZATION_RATE}
  tasks.register_mixture('demo_mix_test', summarization_rate=0.25, multi30k_rate=0)
  try:
    mix = seqio.get_mixture_or_task('demo_mix_test')
    rates = {t.name: mix.get_rate(t) for t in mix.tasks}
    assert rates == {'demo_ende': 60360, 'demo_debsum': 48113 * 0.25}
    ds = mix.get_dataset({'inputs': 16, 'targets': 16}, split='train',
                         shuffle=True, seed=0)
    for ex in ds.take(4).as_numpy_iterator():
      assert ex['targets'][-1] == 1
  finally:
    seqio.MixtureRegistry.remove('demo_mix_test')


def test_vocabulary():
  sp = spm.SentencePieceProcessor(model_file=str(data.VOCAB_PATH))
  assert sp.get_piece_size() == 8192
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  vocab = seqio.get_mixture_or_task('demo_ende').output_features[
      'targets'].vocabulary
  assert vocab.vocab_size == 8192 and vocab.eos_id == 1 and vocab.pad_id == 0
  ids = vocab.encode(GERMAN)
  assert sp.unk_id() not in ids
  assert vocab.decode(ids) == GERMAN
  assert vocab.decode_tf(tf.constant(ids)).numpy().decode() == GERMAN


def test_t5_tasks_are_lazy_and_prefix_inputs():
  wmt = seqio.get_mixture_or_task('wmt_t2t_ende_v003')
  assert wmt.output_features['targets'].vocabulary.extra_ids == 100
  ds = tf.data.Dataset.from_tensors({'en': 'Hello.', 'de': 'Hallo.'})
  ex = next(wmt.preprocessors[0](ds).as_numpy_iterator())
  assert ex == {'inputs': b'translate English to German: Hello.',
                'targets': b'Hallo.'}
  cnndm = seqio.get_mixture_or_task('cnn_dailymail_v002')
  ds = tf.data.Dataset.from_tensors({'article': 'A b.', 'highlights': 'A.'})
  ex = next(cnndm.preprocessors[0](ds).as_numpy_iterator())
  assert ex == {'inputs': b'summarize: A b.', 'targets': b'A.'}


def test_load_examples():
  examples = data.load_examples('demo_ende', 'test_newstest2014', limit=2)
  assert examples[0] == {
      'inputs': 'translate English to German: '
                'Gutach: Increased safety for pedestrians',
      'targets': 'Gutach: Noch mehr Sicherheit für Fußgänger'}
  assert len(examples) == 2
  examples = data.load_examples('demo_debsum', 'test_cnndm')
  assert all(e['inputs'].startswith('summarize: ') for e in examples)
  assert np.median([len(e['inputs'].split()) for e in examples]) > 300
  train = data.load_examples('demo_ende', 'train')  # Gzipped files.
  assert train[0]['inputs'].startswith('translate English to German: ')
  with pytest.raises(ValueError):
    data.load_examples('demo_ende', 'test')
  with pytest.raises(ValueError):
    data.load_examples('wmt_t2t_ende_v003', 'validation')


def test_open_text_reads_gzip(tmp_path):
  with gzip.open(tmp_path / 'a.txt.gz', 'wt', encoding='utf-8') as f:
    f.write('Grüße\n')
  with data.open_text(tmp_path / 'a.txt') as f:
    assert f.read() == 'Grüße\n'
  with pytest.raises(FileNotFoundError):
    data.open_text(tmp_path / 'b.txt')


def test_multi30k_task_is_the_multi30k_part_of_demo_ende():
  n = PROVENANCE_COUNTS['demo_multi30k']['train']
  assert (data.load_examples('demo_multi30k', 'train')
          == data.load_examples('demo_ende', 'train', limit=n))
  assert (data.load_examples('demo_multi30k', 'test')
          == data.load_examples('demo_ende', 'test_multi30k'))
