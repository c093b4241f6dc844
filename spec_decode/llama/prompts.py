"""Chat prompts for SmolLM2-Instruct built from the bundled English text.

The real-model pair (SmolLM2-135M-Instruct and the draft trained for it) is
trained on prompts of the `train` split and demonstrated on the `test` split,
so the demo's prompts are held out. Each prompt asks for a paragraph about
one bundled item, in three kinds that alternate:

  package  a Debian package's name and summary (debian_descriptions)
  story    a short story about a Multi30k image caption
  scene    a description of the scene of a Multi30k image caption

`chat(user)` is SmolLM2's ChatML template (its tokenizer's chat_template.jinja
with the default system message and the assistant's turn opened); the model
ends its answer with <|im_end|>, its EOS (id 2).

  texts = prompts('test', 20)   # the demo's prompts
"""

import gzip
import json

import numpy as np

from spec_decode import data

SPLITS = ('train', 'test')
KINDS = ('package', 'story', 'scene')
SYSTEM = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face'


def pad(ids: list[list[int]], multiple: int = 16,
        width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """[N, W] int32 ids left-aligned and 0-padded, and [N] int32 lengths.

  W is `width`, else the longest row rounded up to `multiple` (one width for
  all rows: one compile per program).
  """
  width = width or -(-max(map(len, ids)) // multiple) * multiple
  out = np.zeros((len(ids), width), np.int32)
  for i, row in enumerate(ids):
    out[i, :len(row)] = row
  return out, np.array([len(r) for r in ids], np.int32)


def chat(user: str) -> str:
  """`user`'s message in SmolLM2's chat template, the assistant's turn opened."""
  return (f'<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n'
          '<|im_start|>assistant\n')


def _packages(split: str) -> list[dict[str, str]]:
  path = data.DATA_DIR / 'debian_descriptions' / f'{split}.jsonl.gz'
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def _captions(split: str) -> list[str]:
  with data.open_text(data.DATA_DIR / 'multi30k_en_de' / f'{split}.en') as f:
    return [line.strip() for line in f if line.strip()]


def _user(kind: str, item) -> str:
  if kind == 'package':
    return (f'Describe the Debian package "{item["package"]}" ({item["summary"]}) in a '
            'paragraph.')
  if kind == 'story':
    return f'Write a short story about this picture: {item}'
  return f'Describe the scene in this picture in a paragraph: {item}'


def package_answers(split: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
  """`n` (chat prompt, human answer) pairs: a package's description asked, its text answered.

  Raises:
    ValueError: an unknown split, or n out of range.
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  packages = _packages(split)
  if not 1 <= n <= len(packages):
    raise ValueError(f'n must be in 1..{len(packages)}, got {n}')
  chosen = np.random.default_rng(seed).choice(len(packages), n, replace=False)
  return [(chat(_user('package', packages[i])), packages[i]['description']) for i in chosen]


def prompts(split: str, n: int, seed: int = 0) -> list[str]:
  """`n` chat prompts of `split`, the kinds alternating, items drawn without replacement.

  Args:
    split: 'train' (for training drafts) or 'test' (held out: the demo's).
    n: how many, at most what the split holds per kind times three.
    seed: which items (numpy's default_rng); the same arguments give the same prompts.

  Raises:
    ValueError: an unknown split, or n out of range.
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  packages, captions = _packages(split), _captions(split)
  per_kind = -(-n // len(KINDS))
  if not 1 <= n or per_kind > min(len(packages), len(captions) // 2):
    raise ValueError(f'n must be in 1..{3 * min(len(packages), len(captions) // 2)}, got {n}')
  rng = np.random.default_rng(seed)
  chosen_packages = [packages[i] for i in rng.choice(len(packages), per_kind, replace=False)]
  chosen_captions = [captions[i] for i in rng.choice(len(captions), 2 * per_kind, replace=False)]
  items = {'package': chosen_packages, 'story': chosen_captions[:per_kind],
           'scene': chosen_captions[per_kind:]}
  return [chat(_user(KINDS[i % 3], items[KINDS[i % 3]][i // 3])) for i in range(n)]
