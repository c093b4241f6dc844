"""seqio tasks: the paper's T5 tasks (tfds) and the bundled local demo tasks.

Importing this module registers (again, if it was reloaded):
  wmt_t2t_ende_v003    tfds wmt_t2t_translate/de-en, "translate English to
                       German: ", BLEU; the public T5 vocabulary.
  cnn_dailymail_v002   tfds cnn_dailymail, "summarize: ", ROUGE; same vocab.
  demo_ende            Multi30k + DDTP En-De (train, validation), tests
                       test_multi30k, test_ddtp, test_newstest2014; BLEU.
  demo_debsum          Debian description -> synopsis (train, validation,
                       test), test_cnndm (200 CNN/DM articles); ROUGE.
  demo_multi30k        the Multi30k part of demo_ende alone (train,
                       validation, test); BLEU.
  demo_mix             demo_ende + demo_multi30k + demo_debsum by
                       training-example count, scaled by DEMO_MULTI30K_RATE
                       and DEMO_SUMMARIZATION_RATE.
`distilled_task(data_dir)` registers one more on request: a folder of the
target's own outputs written by scripts/distill.py (draft distillation).
The demo tasks use the bundled 8k vocabulary. Nothing here reads data, a
vocabulary or the network before a dataset is requested.
"""

import functools
from typing import Callable, Sequence

import numpy as np
import seqio
import tensorflow as tf

from spec_decode import data
from spec_decode.training import distill
from spec_decode.training import metrics

T5_VOCAB_PATH = 'gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model'
# demo_mix sees 30% of the summarization examples (a Debian description is ~4x
# longer than a translation pair) and Multi30k 1 + 4 = 5 times as often as
# DDTP: short image captions are the cheapest tokens to learn translation
# from, and Multi30k test is the headline BLEU of the bundled target.
DEMO_SUMMARIZATION_RATE = 0.3
DEMO_MULTI30K_RATE = 4.0

# Example counts of the local splits (see each corpus's PROVENANCE.md).
NUM_EXAMPLES = {
    'demo_ende': {'train': 60360, 'validation': 1705, 'test_multi30k': 1000,
                  'test_ddtp': 644, 'test_newstest2014': 3003},
    'demo_debsum': {'train': 48113, 'validation': 1044, 'test': 1001,
                    'test_cnndm': 200},
    'demo_multi30k': {'train': 29000, 'validation': 1014, 'test': 1000},
}


def _features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  return {
      'inputs': seqio.Feature(vocabulary=vocabulary, add_eos=True,
                              required=False),
      'targets': seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }


def _text_to_tokens() -> list:
  return [seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
          seqio.preprocessors.append_eos_after_trim]


@seqio.map_over_dataset
def _prefix(x, source_key, target_key, prefix):
  return {'inputs': tf.strings.join([prefix, x[source_key]]),
          'targets': x[target_key]}


def _in_memory_source(read_split: Callable[[str], list[dict[str, str]]], splits: Sequence[str],
                      num_input_examples: dict[str, int]) -> seqio.FunctionDataSource:
  """A source over text examples held in memory, read_split(split) -> [{inputs, targets}]."""

  def dataset_fn(split, shuffle_files, seed=None):
    examples = read_split(split)
    if shuffle_files:
      # One in-memory shard: a full permutation here, since seqio's shuffle
      # buffer alone would keep concatenated corpora apart.
      order = np.random.default_rng(seed).permutation(len(examples))
      examples = [examples[i] for i in order]
    return tf.data.Dataset.from_tensor_slices({
        'inputs': [e['inputs'] for e in examples],
        'targets': [e['targets'] for e in examples],
    })

  return seqio.FunctionDataSource(dataset_fn, splits=splits,
                                  num_input_examples=num_input_examples)


def _local_source(task_name: str) -> seqio.FunctionDataSource:
  """A source over `data.load_examples`, so both read the same text."""
  return _in_memory_source(functools.partial(data.load_examples, task_name),
                           data.splits(task_name), NUM_EXAMPLES[task_name])


def _add_task(name: str, **kwargs) -> None:
  seqio.TaskRegistry.remove(name)  # Re-registration on reload is not an error.
  seqio.TaskRegistry.add(name, **kwargs)


def distilled_task(data_dir: str, name: str = 'demo_distilled') -> str:
  """Registers a folder of distilled splits as a seqio task; returns its name.

  For gin: `MIXTURE = @tasks.distilled_task()` trains on the target's outputs
  (gin/runs/distill.gin).

  Args:
    data_dir: holds train.jsonl and validation.jsonl of
      `spec_decode.training.distill.write_split`.
    name: the task name.

  Raises:
    FileNotFoundError: a split file is missing.
  """
  # Unfinished outputs (keep_unfinished) would teach EOS where the target goes on.
  splits = {split: [r for r in distill.read_split(data_dir, split) if r.get('finished', True)]
            for split in distill.SPLITS}
  _add_task(name,
            source=_in_memory_source(splits.__getitem__, distill.SPLITS,
                                     {k: len(v) for k, v in splits.items()}),
            preprocessors=_text_to_tokens(),
            output_features=_features(seqio.SentencePieceVocabulary(str(data.VOCAB_PATH))))
  return name


def register_mixture(name: str = 'demo_mix',
                     summarization_rate: float = DEMO_SUMMARIZATION_RATE,
                     multi30k_rate: float = DEMO_MULTI30K_RATE) -> None:
  """Registers demo_ende + demo_multi30k + demo_debsum, T5-style rates.

  Each rate is a task's training-example count times a scale.

  Args:
    name: the mixture name.
    summarization_rate: scales demo_debsum's rate, e.g. 0.25 to see a
      quarter as many summarization examples.
    multi30k_rate: scales demo_multi30k's rate (0 leaves it out), on top of
      the Multi30k examples already in demo_ende.
  """
  components = [
      ('demo_ende', seqio.mixing_rate_num_examples),
      ('demo_debsum', functools.partial(seqio.mixing_rate_num_examples,
                                        scale=summarization_rate)),
  ]
  if multi30k_rate > 0:
    components.append(('demo_multi30k', functools.partial(
        seqio.mixing_rate_num_examples, scale=multi30k_rate)))
  seqio.MixtureRegistry.remove(name)
  seqio.MixtureRegistry.add(name, components)


def _register() -> None:
  """Registers every task of the module docstring; safe to call again."""
  t5_features = _features(seqio.SentencePieceVocabulary(T5_VOCAB_PATH,
                                                         extra_ids=100))
  _add_task(
      'wmt_t2t_ende_v003',
      source=seqio.TfdsDataSource(tfds_name='wmt_t2t_translate/de-en:1.0.0'),
      preprocessors=[functools.partial(
          _prefix, source_key='en', target_key='de',
          prefix=data.TRANSLATION_PREFIX)] + _text_to_tokens(),
      output_features=t5_features,
      metric_fns=[metrics.bleu])
  _add_task(
      'cnn_dailymail_v002',
      source=seqio.TfdsDataSource(tfds_name='cnn_dailymail:3.1.0'),
      preprocessors=[functools.partial(
          _prefix, source_key='article', target_key='highlights',
          prefix=data.SUMMARIZATION_PREFIX)] + _text_to_tokens(),
      output_features=t5_features,
      metric_fns=[metrics.rouge])

  demo_features = _features(seqio.SentencePieceVocabulary(str(data.VOCAB_PATH)))
  for task_name, metric in (('demo_ende', metrics.bleu), ('demo_multi30k', metrics.bleu),
                            ('demo_debsum', metrics.rouge)):
    _add_task(task_name, source=_local_source(task_name),
              preprocessors=_text_to_tokens(), output_features=demo_features,
              metric_fns=[metric])
  register_mixture()


_register()
