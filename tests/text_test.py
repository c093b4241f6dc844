"""Tests for spec_decode.text: the vocabulary with T5's conventions."""

import hashlib

import numpy as np
import pytest
import sentencepiece as spm

from spec_decode import data
from spec_decode import text

TEXTS = ['translate English to German: Two dogs play in the snow.', 'summarize: A tool.']


@pytest.fixture(scope='module')
def vocab():
  return text.Vocabulary(data.VOCAB_PATH)


def test_encode_batch_appends_eos_pads_with_zeros_and_rounds_the_length(vocab):
  model = spm.SentencePieceProcessor(model_file=str(data.VOCAB_PATH))
  batch = vocab.encode_batch(TEXTS)
  assert batch.dtype == np.int32 and batch.shape == (2, 16)
  for row, s in zip(batch, TEXTS):
    ids = model.encode(s) + [text.EOS_ID]
    assert row[:len(ids)].tolist() == ids and not row[len(ids):].any()
  cut = vocab.encode_batch(TEXTS, max_len=4, multiple=1)
  assert cut.shape == (2, 4) and (cut[:, -1] == text.EOS_ID).all()


def test_decode_stops_at_eos_and_drops_padding_and_extra_ids(vocab):
  batch = vocab.encode_batch(TEXTS)
  assert vocab.decode_batch(batch) == [s for s in TEXTS]
  ids = vocab.encode('Ein Hund.')
  assert vocab.decode(ids + [text.EOS_ID] + vocab.encode('Nein.')) == 'Ein Hund.'
  with_extra = text.Vocabulary(data.VOCAB_PATH, extra_ids=100)
  assert with_extra.vocab_size == vocab.vocab_size + 100 == 8192 + 100
  assert with_extra.decode(ids + [8192 + 5]) == 'Ein Hund.'


@pytest.mark.parametrize('call, message', [
    (lambda v: v.encode_batch('one text'), 'wrap it in a list'),
    (lambda v: v.encode_batch([]), 'at least one text'),
    (lambda v: v.encode_batch(['ok', '']), 'text 1 encodes to no tokens'),
    (lambda v: v.encode_batch(['ok'], max_len=1), 'max_len must be >= 2'),
    (lambda v: v.decode_batch(np.zeros(3, np.int32)), r'\[N, L\]'),
    (lambda v: v.encode(3), 'takes a str'),
    (lambda v: text.Vocabulary(data.VOCAB_PATH, extra_ids=-1), 'extra_ids'),
    (lambda v: text.Vocabulary('/nonexistent/spm.model').vocab_size, 'not found'),
])
def test_bad_input_is_named(vocab, call, message):
  with pytest.raises((ValueError, TypeError, FileNotFoundError), match=message):
    call(vocab)


def test_a_file_that_is_not_a_sentencepiece_model_is_named(tmp_path):
  bad = tmp_path / 'spm.model'
  bad.write_bytes(b'not a model')
  with pytest.raises(ValueError, match=f'{bad}: not a SentencePiece model'):
    text.Vocabulary(bad).vocab_size


def test_fingerprint_is_the_sha256_of_the_file_and_tells_two_trainings_apart(vocab, tmp_path,
                                                                             other_vocabulary):
  bundled = data.VOCAB_PATH.read_bytes()
  assert text.fingerprint(data.VOCAB_PATH) == hashlib.sha256(bundled).hexdigest()
  assert vocab.fingerprint == text.fingerprint(data.VOCAB_PATH)
  assert text.fingerprint(f'file://{data.VOCAB_PATH}') == vocab.fingerprint
  copy = tmp_path / 'copy.model'
  copy.write_bytes(bundled)
  assert text.Vocabulary(copy).fingerprint == vocab.fingerprint
  # Another training of the same size: the same ids are other pieces.
  other = text.Vocabulary(other_vocabulary)
  assert other.fingerprint != vocab.fingerprint and len(other.fingerprint) == 64
  with pytest.raises(FileNotFoundError, match='vocabulary file not found: /nonexistent'):
    text.fingerprint('/nonexistent/spm.model')
  bad = tmp_path / 'bad.model'
  bad.write_bytes(b'not a model')
  with pytest.raises(ValueError, match='not a SentencePiece model'):
    text.Vocabulary(bad).fingerprint
