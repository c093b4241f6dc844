"""The input file reader of the command line (spec_decode.cli.jsonl.read_examples)."""

import pytest

from spec_decode.cli import jsonl
from spec_decode.cli.gin_utils import ConfigError


class _CharVocabulary:
  """One id per character: a stand-in for seqio vocabularies."""

  vocab_size = 256

  def encode(self, text):
    return [2 + ord(c) % 254 for c in text]


def _read(tmp_path, data: bytes) -> list[jsonl.Example]:
  path = tmp_path / 'inputs.txt'
  path.write_bytes(data)
  return jsonl.read_examples(str(path), _CharVocabulary(), max_input_len=64)


@pytest.mark.parametrize('data', [
    b'one\ntwo\nthree\n', b'one\r\ntwo\r\nthree\r\n', b'one\rtwo\rthree\r', b'one\r\ntwo\rthree',
    b'\xef\xbb\xbfone\ntwo\nthree\n', b'\xef\xbb\xbfone\r\ntwo\r\nthree',
])
def test_line_ends_and_byte_order_mark(tmp_path, data):
  examples = _read(tmp_path, data)
  assert [(e.line, e.fields['inputs']) for e in examples] == [
      (1, 'one'), (2, 'two'), (3, 'three')]
  assert examples[0].tokens == _CharVocabulary().encode('one') + [jsonl.EOS_ID]


def test_json_lines_with_crlf_and_bom(tmp_path):
  examples = _read(tmp_path, b'\xef\xbb\xbf{"inputs": "a", "id": 1}\r\n {"inputs": "b"}\r\n')
  assert [e.fields for e in examples] == [{'inputs': 'a', 'id': 1}, {'inputs': 'b'}]


@pytest.mark.parametrize('data, message', [
    (b'', 'is empty: it needs one input per line'),
    (b'\xef\xbb\xbf', 'is empty'),
    (b'one\n\ntwo\n', 'line 2: a blank line'),
    (b'one\n   \n', 'line 2: a blank line'),
    (b'one\r\r\ntwo\n', 'line 2: a blank line'),
    (b'one\ntwo\n\n', 'line 3: a blank line'),
    (b'one\n{not json\n', r'line 2: not valid JSON \(Expecting property name enclosed in double '
                          r'quotes at column 2\); a text input that starts with \{ or \['),
    (b'[1, 2\n', r'line 1: not valid JSON'),
    (b'one\n[1, 2]\n', r'line 2: a JSON input must be an object with an "inputs" field, got a '
                       r'list'),
    (b'{"inputs": ""}\n', r'line 1: the "inputs" field is blank'),
    (b'{"inputs": "  "}\n', r'line 1: the "inputs" field is blank'),
    (b'{"inputs": 3}\n', r'line 1: a JSON input needs a string "inputs" field'),
    (b'one\ncaf\xe9\n', r'inputs.txt line 2: not UTF-8 text \(byte 0xe9 at column 4\)'),
    (b'\xff\xfeo\x00n\x00e\x00\n\x00', r'inputs.txt line 1: not UTF-8 text \(byte 0xff at '
                                       r'column 1\)'),
])
def test_bad_input_files_name_the_line(tmp_path, data, message):
  with pytest.raises(ConfigError, match=message):
    _read(tmp_path, data)
