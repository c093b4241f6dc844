"""A Hugging Face checkpoint folder's tokenizer: text to ids and back, for the command line.

The command line takes any vocabulary with seqio's `encode`, `decode` and
`vocab_size`. `Tokenizer` reads the one a Llama checkpoint folder ships:

  tokenizer.json   with the `tokenizers` package (installed with transformers,
                   the `hf` extra): its own normalizer, pre-tokenizer and
                   post-processor, which adds BOS where the checkpoint's does
                   (Llama 3);
  tokenizer.model  a SentencePiece model (Llama 1 and 2) with the core's
                   sentencepiece package: BOS prepended unless the folder's
                   tokenizer_config.json sets `add_bos_token` false, as
                   transformers' LlamaTokenizer does.

tokenizer.json is read where both are present and `tokenizers` is installed.
`decode` leaves out special tokens (BOS, EOS) and ids past the tokenizer's
pieces (an embedding padded beyond them), as transformers'
`decode(ids, skip_special_tokens=True)`.

  tokenizer = Tokenizer('/ckpt/llama-2-7b')
  ids = tokenizer.encode('The capital of France is')  # [1, 450, 7483, ...]
  text = tokenizer.decode(ids)
"""

import json
import os
from typing import Sequence

import sentencepiece as spm

JSON_FILE = 'tokenizer.json'
SENTENCEPIECE_FILE = 'tokenizer.model'
CONFIG_FILE = 'tokenizer_config.json'


class Tokenizer:
  """The tokenizer of a Hugging Face checkpoint folder.

  Attributes:
    path: the checkpoint folder.
    file: the file read, tokenizer.json or tokenizer.model, under `path`.
    vocab_size: ids the tokenizer knows, added special tokens included.
  """

  def __init__(self, path: str | os.PathLike):
    """Reads the folder's tokenizer.json, else its tokenizer.model.

    Raises:
      FileNotFoundError: neither file; or only tokenizer.json and the
        `tokenizers` package is not installed (the message says so).
      ValueError: a file that does not parse, or BOS asked of a
        SentencePiece model that has none.
    """
    self.path = os.fspath(path)
    json_file, model_file = (os.path.join(self.path, name)
                             for name in (JSON_FILE, SENTENCEPIECE_FILE))
    tokenizers = _tokenizers()
    if os.path.isfile(json_file) and (tokenizers is not None or not os.path.isfile(model_file)):
      if tokenizers is None:
        raise FileNotFoundError(f'{json_file} needs the `tokenizers` package (pip install '
                                'tokenizers, or the hf extra), and there is no '
                                f'{SENTENCEPIECE_FILE}')
      self.file = json_file
      try:
        self._json = tokenizers.Tokenizer.from_file(json_file)
      except Exception as e:  # pylint: disable=broad-except; the Rust library's own errors
        raise ValueError(f'{json_file} is not a tokenizers file: {e}') from None
      self.vocab_size = self._json.get_vocab_size(with_added_tokens=True)
      return
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f'no {JSON_FILE} or {SENTENCEPIECE_FILE} in {self.path}: the '
                              'tokenizer of a Hugging Face checkpoint folder')
    self.file, self._json = model_file, None
    self._sentencepiece = spm.SentencePieceProcessor()
    try:
      self._sentencepiece.Load(model_file)
    except (OSError, RuntimeError) as e:
      raise ValueError(f'{model_file} is not a SentencePiece model: {e}') from None
    self.vocab_size = self._sentencepiece.GetPieceSize()
    self._bos = _add_bos(self.path)
    if self._bos and self._sentencepiece.bos_id() < 0:
      raise ValueError(f'{model_file} has no BOS piece, and {CONFIG_FILE} does not set '
                       'add_bos_token false')

  def encode(self, text: str) -> list[int]:
    """The ids of `text`, BOS first where the checkpoint's tokenizer adds it."""
    if self._json is not None:
      return self._json.encode(text).ids
    bos = [self._sentencepiece.bos_id()] if self._bos else []
    return bos + self._sentencepiece.EncodeAsIds(text)

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids`, special tokens and ids past vocab_size left out."""
    ids = [int(i) for i in ids if 0 <= int(i) < self.vocab_size]
    if self._json is not None:
      return self._json.decode(ids, skip_special_tokens=True)
    return self._sentencepiece.DecodeIds(ids)  # drops control pieces (BOS, EOS)


def _tokenizers():
  """The `tokenizers` module, or None where it is not installed (it is optional)."""
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return tokenizers


def _add_bos(path: str) -> bool:
  """tokenizer_config.json's add_bos_token (default True, as LlamaTokenizer's)."""
  file = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(file):
    return True
  try:
    with open(file, encoding='utf-8') as f:
      stored = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f'{file} is not a JSON config: {e}') from None
  value = stored.get('add_bos_token', True) if isinstance(stored, dict) else True
  if not isinstance(value, bool):
    raise ValueError(f'{file}: add_bos_token must be true or false, got {value!r}')
  return value
