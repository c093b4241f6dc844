"""The bundled demo data and vocabulary, read in plain Python (no TensorFlow).

Each folder holds one corpus and its PROVENANCE.md. Large text files are
stored gzipped; `open_text` reads `name` or `name.gz`, whichever exists.

`load_examples` gives the examples of the local seqio tasks of
`spec_decode.tasks` exactly as those tasks read them, task prefix included,
so decoding scripts can read test inputs without importing seqio.
"""

import functools
import gzip
import json
import pathlib
from typing import Callable, Optional, TextIO

from spec_decode import text

DATA_DIR = pathlib.Path(__file__).resolve().parent
_PACKAGE_DIR = DATA_DIR.parent
VOCAB_PATH = DATA_DIR / 'vocab' / 'spm_8k.model'
VOCAB_SIZE = 8192  # the bundled vocabulary's ids, which the bundled models embed
# The bundled models (models/<name>/, T5 1.1 layers over the bundled vocabulary): (emb_dim,
# num_heads, encoder layers, decoder layers, head_dim, mlp_dim), as spec_decode.t5.SIZES.
MODEL_SIZES = {
    'target': (384, 6, 4, 4, 64, 768),
    'draft_large': (256, 4, 2, 2, 64, 768),
    'draft_small': (128, 2, 2, 2, 64, 512),
}
# The bundled decoder-only language models (models/<name>/, spec_decode.t5.decoder_only):
# (emb_dim, num_heads, num_layers, head_dim, mlp_dim).
LM_SIZES = {
    'lm_target': (256, 4, 3, 64, 768),
    'lm_draft': (128, 2, 2, 64, 512),
}


@functools.cache
def vocabulary() -> text.Vocabulary:
  """The bundled vocabulary (VOCAB_PATH), one instance: the model file is read once."""
  return text.Vocabulary(VOCAB_PATH)


def repository_dir(name: str) -> pathlib.Path:
  """A top-level folder of the repository (`gin`, `configs`), wherever spec_decode is installed.

  A wheel carries a copy inside the package (see setup.py); a checkout (or an editable install)
  has it beside the package, next to setup.py.

  Raises:
    FileNotFoundError: neither place has the folder.
  """
  packaged, checkout = _PACKAGE_DIR / name, _PACKAGE_DIR.parent / name
  if packaged.is_dir():
    return packaged
  if checkout.is_dir() and (_PACKAGE_DIR.parent / 'setup.py').is_file():
    return checkout
  raise FileNotFoundError(f'no {name}/ folder in {_PACKAGE_DIR} or beside it: reinstall spec_decode')


def manifest(name: str) -> dict:
  """An experiment manifest of configs/, e.g. `manifest('paper_table2')`, parsed from JSON."""
  return json.loads((repository_dir('configs') / f'{name}.json').read_text(encoding='utf-8'))


TRANSLATION_PREFIX = 'translate English to German: '
SUMMARIZATION_PREFIX = 'summarize: '

# split -> (folder, file stem) of aligned .en/.de files, concatenated in order.
_TRANSLATION_FILES = {
    'train': (('multi30k_en_de', 'train'), ('debian_descriptions_en_de', 'train')),
    'validation': (('multi30k_en_de', 'val'),
                   ('debian_descriptions_en_de', 'validation')),
    'test_multi30k': (('multi30k_en_de', 'test'),),
    'test_ddtp': (('debian_descriptions_en_de', 'test'),),
    'test_newstest2014': (('wmt14_newstest2014_en_de', 'test'),),
}
# The Multi30k part alone, so a mixture can weight it apart from DDTP.
_MULTI30K_FILES = {
    'train': (('multi30k_en_de', 'train'),),
    'validation': (('multi30k_en_de', 'val'),),
    'test': (('multi30k_en_de', 'test'),),
}
# split -> (file, document key, summary key), concatenated in order.
_SUMMARIZATION_FILES = {
    'train': (('debian_descriptions/train.jsonl', 'description', 'summary'),),
    'validation': (
        ('debian_descriptions/validation.jsonl', 'description', 'summary'),),
    'test': (('debian_descriptions/test.jsonl', 'description', 'summary'),),
    'test_cnndm': (
        ('cnndm_test_subsets/summeval_cnndm_test.jsonl', 'article', 'highlights'),
        ('cnndm_test_subsets/realsumm_cnndm_test.jsonl', 'article', 'highlights'),
    ),
}


def open_text(path: pathlib.Path) -> TextIO:
  """Opens a UTF-8 text file stored as `path` or as `path.gz`."""
  path = pathlib.Path(path)
  if path.exists():
    return open(path, encoding='utf-8')
  gz_path = path.with_name(path.name + '.gz')
  if gz_path.exists():
    return gzip.open(gz_path, 'rt', encoding='utf-8')
  raise FileNotFoundError(f'Neither {path} nor {gz_path} exists.')


def _read_lines(path: pathlib.Path) -> list[str]:
  with open_text(path) as f:
    return [line.rstrip('\n') for line in f]


def translation_pairs(split: str) -> tuple[tuple[str, str], ...]:
  """(English, German) segment pairs of a demo_ende split."""
  return _parallel_text(_TRANSLATION_FILES[split])


def multi30k_pairs(split: str) -> tuple[tuple[str, str], ...]:
  """(English, German) segment pairs of a demo_multi30k split."""
  return _parallel_text(_MULTI30K_FILES[split])


@functools.lru_cache(maxsize=None)
def _parallel_text(files: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
  """Aligned (English, German) lines of (folder, stem) files, in order."""
  pairs = []
  for folder, stem in files:
    en = _read_lines(DATA_DIR / folder / f'{stem}.en')
    de = _read_lines(DATA_DIR / folder / f'{stem}.de')
    if len(en) != len(de):
      raise ValueError(f'{folder}/{stem}: {len(en)} en vs {len(de)} de lines.')
    pairs.extend(zip(en, de))
  return tuple(pairs)


@functools.lru_cache(maxsize=None)
def summarization_pairs(split: str) -> tuple[tuple[str, str], ...]:
  """(document, summary) pairs of a summarization split."""
  pairs = []
  for name, document_key, summary_key in _SUMMARIZATION_FILES[split]:
    with open_text(DATA_DIR / name) as f:
      records = [json.loads(line) for line in f]
    pairs.extend((r[document_key], r[summary_key]) for r in records)
  return tuple(pairs)


# task -> (input prefix, pairs reader, split names).
_TASKS: dict[str, tuple[str, Callable[[str], tuple], tuple[str, ...]]] = {
    'demo_ende': (TRANSLATION_PREFIX, translation_pairs,
                  tuple(_TRANSLATION_FILES)),
    'demo_debsum': (SUMMARIZATION_PREFIX, summarization_pairs,
                    tuple(_SUMMARIZATION_FILES)),
    'demo_multi30k': (TRANSLATION_PREFIX, multi30k_pairs, tuple(_MULTI30K_FILES)),
}
LOCAL_TASKS = tuple(_TASKS)


def splits(task_name: str) -> tuple[str, ...]:
  """The split names of a local task."""
  return _TASKS[task_name][2]


def load_examples(
    task_name: str, split: str, limit: Optional[int] = None
) -> list[dict[str, str]]:
  """The raw text examples of a local task split, in file order.

  Args:
    task_name: 'demo_ende', 'demo_debsum' or 'demo_multi30k'.
    split: one of `splits(task_name)`.
    limit: keep only the first `limit` examples.

  Returns:
    A list of dict(inputs=prefix + source text, targets=reference text).
  """
  if task_name not in _TASKS:
    raise ValueError(f'Unknown local task {task_name!r}; have {LOCAL_TASKS}.')
  prefix, read_pairs, names = _TASKS[task_name]
  if split not in names:
    raise ValueError(f'{task_name} has no split {split!r}; have {names}.')
  pairs = read_pairs(split)[:limit]
  return [dict(inputs=prefix + source, targets=target) for source, target in pairs]
