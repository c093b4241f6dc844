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


class _DroppingVocabulary(_CharVocabulary):
  """Drops what it has no piece for, as SentencePiece drops a zero-width space; `bos` first."""

  def __init__(self, bos=()):
    self.bos = list(bos)

  def encode(self, text):
    text.encode('utf-8')  # as SentencePiece, no lone surrogates
    return self.bos + [2 + ord(c) % 254 for c in text if c.isprintable() and not c.isspace()]


@pytest.mark.parametrize('bos', [(), (5,)])
@pytest.mark.parametrize('prefix', ['', 'translate: '])
@pytest.mark.parametrize('data', ['one\n\u200b\u200b \u200b\n', '{"inputs": "\\u200b\\ufeff"}\n'])
def test_inputs_that_encode_to_no_token_name_the_line(tmp_path, bos, prefix, data):
  path = tmp_path / 'inputs.txt'
  path.write_text(data, encoding='utf-8')
  line = data.count('\n')
  with pytest.raises(ConfigError, match=rf"inputs.txt line {line}: the input '\\u200b.* is no "
                                        'token of the vocabulary'):
    jsonl.read_examples(str(path), _DroppingVocabulary(bos), input_prefix=prefix,
                        max_input_len=64)
  path.write_text('one\n\u200btwo\n', encoding='utf-8')  # some text left: decoded
  examples = jsonl.read_examples(str(path), _DroppingVocabulary(bos), input_prefix=prefix,
                                 max_input_len=64)
  assert [e.fields['inputs'] for e in examples] == ['one', '\u200btwo']


@pytest.mark.parametrize('data, message', [
    (b'{"inputs": "A dog \\ud800."}\n',
     r'line 1: field "inputs" holds a lone UTF-16 surrogate \'\\ud800\' at character 7'),
    (b'{"inputs": "A dog.", "meta": {"id": ["x", "\\udc00"]}}\n',
     r'line 1: field "meta.id\[1\]" holds a lone UTF-16 surrogate'),
    (b'one\n{"inputs": "A dog.", "\\ud83d": 1}\n', r'line 2: holds a lone UTF-16 surrogate'),
])
def test_lone_surrogates_in_json_lines_name_the_line_and_field(tmp_path, data, message):
  with pytest.raises(ConfigError, match=message):
    _read(tmp_path, data)


def test_a_lone_surrogate_in_the_prefix_or_a_failing_tokenizer_is_named(tmp_path):
  path = tmp_path / 'inputs.txt'
  path.write_text('one\ntwo\n')
  with pytest.raises(ConfigError, match=r'input_prefix \(INPUT_PREFIX in gin\): holds a lone'):
    jsonl.read_examples(str(path), _CharVocabulary(), input_prefix='\ud800', max_input_len=64)

  class Failing(_CharVocabulary):
    def encode(self, text):
      if text == 'two':
        raise RuntimeError('Unable to cast Python instance')
      return super().encode(text)

  with pytest.raises(ConfigError, match=r'inputs.txt line 2: the tokenizer cannot encode it '
                                        r'\(RuntimeError: Unable to cast Python instance\)'):
    jsonl.read_examples(str(path), Failing(), max_input_len=64)


def test_a_new_run_removes_an_earlier_output_and_says_so(tmp_path, capsys):
  path = tmp_path / 'out.jsonl'
  path.write_text('{"output": "of an earlier run"}\n')
  out = jsonl.Output(str(path), '-')
  assert not path.exists()
  assert f'note: removed {path}, an earlier run\'s output' in capsys.readouterr().err
  with pytest.raises(ConfigError, match='a failure; nothing was written to'):
    with jsonl.writing(out, 3):
      raise ConfigError('a failure')
  assert not path.exists() and not (tmp_path / 'out.jsonl.incomplete').exists()


@pytest.mark.parametrize('records, state', [
    (0, 'the run failed: nothing was written to {path}'),
    (2, 'the run failed: {path} was not written; the first 2 of 3 records (the last line '
        'possibly cut) are in {path}.incomplete'),
])
def test_an_unexpected_error_says_what_the_output_holds(tmp_path, records, state):
  path = tmp_path / 'out.jsonl'
  with pytest.raises(RuntimeError, match='out of memory') as error:
    with jsonl.writing(jsonl.Output(str(path), '-'), 3) as out:
      out.write([{'line': i + 1} for i in range(records)])
      raise RuntimeError('out of memory')
  assert error.value.__notes__ == [state.format(path=path)]
  assert not path.exists()
  assert (tmp_path / 'out.jsonl.incomplete').exists() == bool(records)


def test_beam_fields_of_an_input_are_refused(tmp_path):
  path = tmp_path / 'inputs.jsonl'
  path.write_text('{"inputs": "a", "score": 1.5}\n')
  assert jsonl.read_examples(str(path), _CharVocabulary(), max_input_len=64)[0].fields == {
      'inputs': 'a', 'score': 1.5}
  with pytest.raises(ConfigError, match="line 1: the input field.s. 'score' would be overwritten"):
    jsonl.read_examples(str(path), _CharVocabulary(), max_input_len=64,
                        output_fields=jsonl.OUTPUT_FIELDS + jsonl.BEAM_FIELDS)
