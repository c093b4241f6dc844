"""Output quality as T5 scores it: corpus BLEU (translation) and ROUGE (summarization).

Kept apart from `spec_decode.training.tasks`, which registers these as the seqio tasks'
metric functions: importing seqio and TensorFlow takes seconds, and the
walltime harness (the demo, the scripts) needs only the two scores. Both
libraries come with the `[harness]` extra; `missing()` says which are absent.
"""

import importlib.util

import numpy as np

LIBRARIES = {'bleu': 'sacrebleu', 'rouge': 'rouge_score'}


def missing(metric: str) -> str | None:
  """The library a metric ('bleu', 'rouge') needs, if it is not installed; else None."""
  library = LIBRARIES[metric]
  return library if importlib.util.find_spec(library) is None else None


def bleu(targets: list[str], predictions: list[str]) -> dict[str, float]:
  """Corpus BLEU from sacrebleu, set up as T5's `metrics.bleu`."""
  import sacrebleu  # pylint: disable=import-outside-toplevel

  score = sacrebleu.corpus_bleu(
      predictions, [targets], smooth_method='exp', tokenize='intl')
  return {'bleu': score.score}


def rouge(targets: list[str], predictions: list[str]) -> dict[str, float]:
  """Mean ROUGE-1/2/Lsum F-measure x 100, rouge-score's default tokenizer.

  As in T5's `metrics.rouge`, " . " ends a sentence for ROUGE-Lsum; the mean
  replaces T5's bootstrap midpoint, which it approximates.
  """
  # Imported here: rouge-score loads NLTK (~1.5 s), which only summarization needs.
  from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel

  keys = ('rouge1', 'rouge2', 'rougeLsum')
  scorer = rouge_scorer.RougeScorer(keys)

  def sentences(text):
    return text.replace(' . ', ' .\n')

  scores = [scorer.score(sentences(t), sentences(p))
            for t, p in zip(targets, predictions)]
  return {k: 100 * float(np.mean([s[k].fmeasure for s in scores])) for k in keys}
