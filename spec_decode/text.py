"""Text in and out: a SentencePiece vocabulary with T5's conventions.

`Vocabulary` reads a SentencePiece model as seqio's SentencePieceVocabulary
does (pad 0, EOS 1, unknown 2; `extra_ids` sentinel ids above the model's
pieces) and offers the same `encode`, `decode`, `vocab_size`, `eos_id` and
`sentencepiece_model_file`, so the command line takes either; it needs only
the sentencepiece package (no seqio, no TensorFlow). `encode_batch` and
`decode_batch` turn texts into the encoder inputs the decoding loops take
and their output tokens back into texts:

  vocab = Vocabulary(demo.VOCABULARY)
  inputs = vocab.encode_batch(['translate English to German: A dog runs.'])  # [1, 16]
  texts = vocab.decode_batch(out.tokens)

`fingerprint(path)` (and `Vocabulary.fingerprint`) identifies a SentencePiece
model by the sha256 of its file: two models of the same size from different
trainings map the same ids to different pieces, and a checkpoint records the
fingerprint of the vocabulary it was trained with
(`spec_decode.checkpoints.check_vocabulary`).
"""

import functools
import hashlib
import os
import posixpath
from typing import Sequence

import numpy as np
import sentencepiece as spm

from spec_decode.decoding import BOS_ID  # noqa: F401 (the loops' decoder start token)

# T5's conventions, the one home of the special ids: BOS_ID 0 starts every
# decoder sequence, PAD_ID 0 pads inputs, EOS_ID 1 ends a sequence.
PAD_ID = 0
EOS_ID = 1
BATCH_MULTIPLE = 16  # encode_batch rounds the common length up to this


def read_model_file(path: str | os.PathLike) -> bytes:
  """The bytes of a SentencePiece model file, local or at a URL tensorstore reads (gs://...).

  Raises:
    FileNotFoundError: no such file.
  """
  path = os.fspath(path)
  if '://' not in path:
    if not os.path.isfile(path):
      raise FileNotFoundError(f'vocabulary file not found: {path}')
    with open(path, 'rb') as f:
      return f.read()
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  directory, name = posixpath.split(path)
  data = ts.KvStore.open(directory + '/').result().read(name).result()
  if data.state != 'value':
    raise FileNotFoundError(f'vocabulary file not found: {path}')
  return bytes(data.value)


def fingerprint(path: str | os.PathLike) -> str:
  """The sha256 of a SentencePiece model file's bytes (its serialized proto), hex.

  Args:
    path: the model file, local or a URL tensorstore reads (gs://...).

  Raises:
    FileNotFoundError: no such file.
  """
  return hashlib.sha256(read_model_file(path)).hexdigest()


class Vocabulary:
  """A SentencePiece model with T5's ids: pad 0, EOS 1, unknown 2.

  Attributes:
    sentencepiece_model_file: the model file, local or gs:// (`read_model_file`).
    extra_ids: sentinel ids appended above the model's pieces (T5's 100).
  """

  eos_id = EOS_ID
  pad_id = PAD_ID

  def __init__(self, sentencepiece_model_file: str | os.PathLike, extra_ids: int = 0):
    if isinstance(extra_ids, bool) or not isinstance(extra_ids, int) or extra_ids < 0:
      raise ValueError(f'extra_ids must be an integer >= 0, got {extra_ids!r}')
    if not isinstance(sentencepiece_model_file, (str, os.PathLike)):
      raise TypeError(f'sentencepiece_model_file (VOCABULARY_FILE in the command line\'s gin '
                      f'files) must be the path of a SentencePiece model, got '
                      f'{sentencepiece_model_file!r}; VOCABULARY_FILE = None goes with VOCABULARY '
                      'bound to a vocabulary of another kind (a seqio.Vocabulary)')
    self.sentencepiece_model_file = os.fspath(sentencepiece_model_file)
    self.extra_ids = extra_ids

  @functools.cached_property
  def _proto(self) -> bytes:
    return read_model_file(self.sentencepiece_model_file)

  @functools.cached_property
  def _model(self) -> spm.SentencePieceProcessor:
    try:
      model = spm.SentencePieceProcessor(model_proto=self._proto)
    except (OSError, RuntimeError) as e:
      raise ValueError(f'vocabulary file {self.sentencepiece_model_file}: not a SentencePiece '
                       f'model ({str(e).splitlines()[0]})') from None
    if (model.pad_id(), model.eos_id()) != (PAD_ID, EOS_ID):
      raise ValueError(f'vocabulary file {self.sentencepiece_model_file}: pad and EOS ids are '
                       f'{model.pad_id()} and {model.eos_id()}, T5 needs {PAD_ID} and {EOS_ID}')
    return model

  @functools.cached_property
  def fingerprint(self) -> str:
    """`fingerprint` of the model file (the bytes it loaded; a SentencePiece model)."""
    _ = self._model  # a file that is not a SentencePiece model raises here
    return hashlib.sha256(self._proto).hexdigest()

  @property
  def vocab_size(self) -> int:
    """The model's pieces plus the extra ids."""
    return self._model.get_piece_size() + self.extra_ids

  def encode(self, text: str) -> list[int]:
    """Text -> ids, without EOS (as seqio)."""
    if not isinstance(text, str):
      raise TypeError(f'encode takes a str, got {type(text).__name__}')
    return self._model.encode(text)

  def encode_input(self, text: str, max_len: int | None = None) -> list[int]:
    """Text -> ids ending with EOS, cut to max_len tokens (EOS kept), as seqio's tasks."""
    tokens = self.encode(text)
    return (tokens if max_len is None else tokens[:max_len - 1]) + [EOS_ID]

  def decode(self, ids: Sequence[int]) -> str:
    """Ids -> text, cut at the first EOS; padding and extra ids are dropped."""
    ids = [int(i) for i in ids]
    if EOS_ID in ids:
      ids = ids[:ids.index(EOS_ID)]
    pieces = self._model.get_piece_size()
    return self._model.decode([i for i in ids if PAD_ID < i < pieces])

  def encode_batch(self, texts: Sequence[str], max_len: int | None = None,
                   multiple: int = BATCH_MULTIPLE) -> np.ndarray:
    """Texts -> encoder inputs of one shape: EOS appended, 0-padded.

    Args:
      texts: the inputs (a task prefix such as 'translate English to German: '
        included).
      max_len: longer inputs are cut to this many tokens, EOS kept (None: none
        is cut).
      multiple: the common length is the longest input rounded up to this, so
        that batches of similar lengths share one compiled shape.

    Returns:
      [N, S] int32.

    Raises:
      ValueError: no texts, an empty text, or a max_len below 2.
    """
    if isinstance(texts, str):
      raise TypeError('encode_batch takes a sequence of texts, got one str: wrap it in a list')
    texts = list(texts)
    if not texts:
      raise ValueError('encode_batch needs at least one text')
    if max_len is not None and max_len < 2:
      raise ValueError(f'max_len must be >= 2 (a token and EOS), got {max_len}')
    ids = []
    for i, text in enumerate(texts):
      tokens = self.encode_input(text, max_len)
      if len(tokens) == 1:
        raise ValueError(f'text {i} encodes to no tokens: {text!r}')
      ids.append(tokens)
    length = -(-max(map(len, ids)) // multiple) * multiple
    batch = np.zeros((len(ids), length), np.int32)
    for row, x in zip(batch, ids):
      row[:len(x)] = x
    return batch

  def decode_batch(self, tokens: np.ndarray) -> list[str]:
    """[N, L] output tokens -> N texts, each cut at its first EOS."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f'decode_batch takes [N, L] tokens, got shape {tokens.shape}')
    return [self.decode(row) for row in tokens.tolist()]
