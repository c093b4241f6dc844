"""The files of `infer`: input lines in, JSON records out, complete or clearly not.

Input: one example per line (LF, CRLF or CR), UTF-8 (a leading byte order mark
dropped), plain text or a JSON object with a non-blank string "inputs" field; a
blank line, an empty file, a line that starts like JSON but is not an object
with "inputs", an input that is no token of the vocabulary (invisible
characters only) or a JSON string holding a lone UTF-16 surrogate is an error
naming the file and line. Output: one JSON record per example,
written to `<output>.incomplete` and renamed to `<output>` only once every
record is in; a run that fails or is interrupted leaves no `<output>`, and the
records it did write stay in `<output>.incomplete`.
"""

import codecs
import contextlib
import dataclasses
import json
import os
import sys
from typing import Any, BinaryIO, Iterator, Sequence, TextIO

from etils import epath

from spec_decode.cli.gin_utils import ConfigError, Interrupted
from spec_decode.text import EOS_ID  # every T5 input ends with it, decoding stops at it
INCOMPLETE = '.incomplete'  # suffix of the output file until its last record is written

# Fields every output record has; an input JSON field of these names would be lost.
OUTPUT_FIELDS = ('line', 'output', 'output_ids', 'generated_tokens', 'target_calls',
                 'draft_calls', 'tokens_per_target_call', 'batch', 'batch_walltime_s',
                 'batch_accept_histogram')
# Fields the records of DECODE = 'beam' add.
BEAM_FIELDS = ('score', 'beams', 'beam_steps')


@dataclasses.dataclass(frozen=True)
class Example:
  """One input line.

  Attributes:
    line: 1-based line number in the input file.
    fields: the JSON record ({'inputs': text} for a plain text line).
    tokens: the encoded inputs, EOS appended, at most max_input_len ids.
  """

  line: int
  fields: dict[str, Any]
  tokens: list[int]


def read_examples(path: str, vocabulary: Any, *, input_prefix: str = '', max_input_len: int,
                  truncate: bool = False, output_fields: Sequence[str] = OUTPUT_FIELDS,
                  eos: bool = True) -> list[Example]:
  """Reads and encodes every line of a text or JSONL file.

  Lines end at LF, CRLF or a lone CR; a UTF-8 byte order mark at the start is
  dropped. A line that starts with `{` or `[` is JSON: an object with a
  non-blank string "inputs" field and no field named as an output field
  (`output_fields`): records never overwrite an input field. Any other line is
  the input text itself.

  Args:
    path: the file, '-' for stdin.
    vocabulary: a seqio.Vocabulary.
    input_prefix: prepended to every input before encoding.
    max_input_len: most tokens per input, EOS included.
    truncate: cut longer inputs (as seqio's append_eos_after_trim) instead of
      raising ConfigError.
    output_fields: the fields the records add (OUTPUT_FIELDS, plus
      BEAM_FIELDS with beam search).
    eos: append EOS (an encoder input); False for a decoder-only model's
      prompt, which its continuation follows.

  Returns:
    The examples in file order, at least one.

  Raises:
    ConfigError: naming the file (and line): a missing or empty file, a blank
      line, a line that is not UTF-8, a JSON line that does not parse or is
      not an object with a non-blank string "inputs", a JSON object with an
      output field, an input over max_input_len, an input that encodes to
      no token (zero-width spaces), a string with a lone surrogate (a JSON
      \\ud800 escape; in input_prefix too), an input the tokenizer fails on.
  """
  name = 'stdin' if path == '-' else path
  _check_text(input_prefix, 'input_prefix (INPUT_PREFIX in gin)')
  nothing = _encode(vocabulary, '', 'an empty text')  # what a tokenizer adds to any text (BOS)
  examples = []
  with _open_input(path) as f:
    for line_number, raw in enumerate(_lines(f), start=1):
      where = f'{name} line {line_number}'
      try:
        line = raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise ConfigError(f'{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column '
                          f'{e.start + 1})') from None
      if not line.strip():
        raise ConfigError(f'{where}: a blank line (every line is one input): remove it')
      fields = _parse_line(line, where)
      clashes = [field for field in output_fields if field in fields]
      if clashes:
        raise ConfigError(f'{where}: the input field(s) {", ".join(map(repr, clashes))} would be '
                          'overwritten by the output field of that name: rename them')
      text = fields['inputs']
      tokens = _encode(vocabulary, input_prefix + text, where)
      alone = _encode(vocabulary, text, where) if input_prefix else tokens
      if alone == nothing:
        raise ConfigError(f'{where}: the input {_shown(text)} is no token of the vocabulary '
                          '(only spaces or invisible characters): nothing to decode; remove it')
      tokens += [EOS_ID] * eos
      if len(tokens) > max_input_len:
        if not truncate:
          raise ConfigError(
              f'{where}: input of {len(tokens)} tokens{" (EOS included)" * eos} > '
              f'max_input_len={max_input_len}; raise MAX_INPUT_LEN or set TRUNCATE_INPUTS = True')
        tokens = tokens[:max_input_len - eos] + [EOS_ID] * eos
      examples.append(Example(line_number, fields, tokens))
  if not examples:
    raise ConfigError(f'input file {name} is empty: it needs one input per line')
  return examples


def _shown(text: str, limit: int = 40) -> str:
  """`text` quoted with Python's escapes (invisible characters show), cut to `limit` characters."""
  return ascii(text[:limit]) + ('...' if len(text) > limit else '')


def _check_text(value: Any, where: str, field: str = '') -> None:
  """ConfigError naming `where` (and the JSON field) for a string holding a lone surrogate.

  JSON's \\ud800 escapes can spell half of a UTF-16 pair, which is no text:
  no tokenizer encodes it and no UTF-8 output can hold it.
  """
  if isinstance(value, dict):
    for key, item in value.items():
      _check_text(key, where, field)
      _check_text(item, where, f'{field}.{key}' if field else str(key))
  elif isinstance(value, list):
    for i, item in enumerate(value):
      _check_text(item, where, f'{field}[{i}]')
  elif isinstance(value, str):
    try:
      value.encode('utf-8')
    except UnicodeEncodeError as e:
      named = f' field "{field}"' if field else ''
      raise ConfigError(f'{where}:{named} holds a lone UTF-16 surrogate '
                        f'{ascii(value[e.start])} at character {e.start + 1} (a JSON \\u escape '
                        'of half a pair): not text') from None


def _encode(vocabulary: Any, text: str, where: str) -> list[int]:
  """vocabulary.encode(text) as a list; ConfigError naming `where` if the tokenizer fails."""
  try:
    return list(vocabulary.encode(text))
  except Exception as e:  # pylint: disable=broad-except; any tokenizer error is this input's
    raise ConfigError(f'{where}: the tokenizer cannot encode it ({type(e).__name__}: '
                      f'{str(e).splitlines()[0] if str(e) else ""})') from None


def _lines(f: BinaryIO) -> Iterator[bytes]:
  """The lines of a binary file without their ends (LF, CRLF, CR), a leading BOM dropped.

  (A CR or LF byte never occurs inside a UTF-8 multibyte character.)
  """
  for index, raw in enumerate(f):
    if index == 0 and raw.startswith(codecs.BOM_UTF8):
      raw = raw[len(codecs.BOM_UTF8):]
      if not raw:  # the file holds the mark alone
        return
    raw = raw[:-1] if raw.endswith(b'\n') else raw
    raw = raw[:-1] if raw.endswith(b'\r') else raw
    yield from raw.split(b'\r')


def _parse_line(line: str, where: str) -> dict[str, Any]:
  """A JSON line (starting with `{` or `[`) as its object; any other line as {'inputs': line}."""
  if not line.lstrip().startswith(('{', '[')):
    return {'inputs': line}
  hint = ('; a text input that starts with { or [ goes in a JSON object: '
          '{"inputs": "[text]"}')
  try:
    fields = json.loads(line)
  except json.JSONDecodeError as e:
    raise ConfigError(f'{where}: not valid JSON ({e.msg} at column {e.colno}){hint}') from None
  if not isinstance(fields, dict):
    raise ConfigError(f'{where}: a JSON input must be an object with an "inputs" field, got a '
                      f'{type(fields).__name__}{hint}')
  if not isinstance(fields.get('inputs'), str):
    raise ConfigError(f'{where}: a JSON input needs a string "inputs" field')
  if not fields['inputs'].strip():
    raise ConfigError(f'{where}: the "inputs" field is blank: nothing to decode')
  _check_text(fields, where)
  return fields


def _open_input(path: str) -> BinaryIO:
  if path == '-':
    return open(sys.stdin.fileno(), 'rb', closefd=False)
  if not epath.Path(path).exists():
    raise ConfigError(f'input file not found: {path}')
  return epath.Path(path).open('rb')


class Output:
  """JSONL output that is complete or clearly not.

  Records go to `<path>.incomplete` (opened at construction, so a bad path
  fails before any model is loaded) and `close` renames it to `path`. An
  earlier run's `path` is removed at construction (with a note on stderr), so
  `path` exists only once this run completes. `abort` leaves `path`
  unwritten, removes an empty `.incomplete` file and says where the records
  written so far are. With path '-' records go to stdout.

  Attributes:
    path: the output path, '-' for stdout.
    records: records written so far.
    complete: whether `close` made the output whole.
  """

  def __init__(self, path: str, input_file: str):
    self.path, self.records, self.complete = path, 0, False
    if path == '-':
      self._file: TextIO = open(sys.stdout.fileno(), 'w', encoding='utf-8', closefd=False)
      return
    target = epath.Path(path)
    if target.is_dir():
      raise ConfigError(f'output file {path} is a directory')
    if not target.parent.exists():
      raise ConfigError(f'output file {path}: the directory {target.parent} does not exist')
    if input_file != '-' and _same_file(input_file, path):
      raise ConfigError(f'output file {path} is the input file: it would be overwritten')
    self._partial = epath.Path(path + INCOMPLETE)
    try:
      self._file = self._partial.open('w', encoding='utf-8')
    except OSError as e:
      raise ConfigError(f'output file {path}: cannot write {self._partial}: {e}') from None
    if target.exists():
      target.unlink()
      print(f'note: removed {path}, an earlier run\'s output: this run writes it once complete',
            file=sys.stderr)

  def write(self, records: list[dict[str, Any]]) -> None:
    """Appends whole records and flushes them."""
    self._file.write(''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records))
    self._file.flush()
    self.records += len(records)

  def close(self) -> None:
    """Every record is written: `<path>.incomplete` becomes `path`."""
    self._file.close()
    if self.path != '-':
      self._partial.replace(epath.Path(self.path))
    self.complete = True

  def abort(self, total: int) -> str:
    """Closes the unfinished output; returns a sentence saying what it holds."""
    try:
      self._file.close()
    except OSError:
      pass  # A full disk fails the flush again; what reached the file stays.
    if self.path == '-':
      return f'stdout holds only the first {self.records} of {total} records'
    # Count what reached the file: a signal can land between a flush and the count.
    self.records = self._partial.read_bytes().count(b'\n')
    done = f'{self.records} of {total} records'
    if not self.records:
      self._partial.unlink(missing_ok=True)
      return f'nothing was written to {self.path}'
    return (f'{self.path} was not written; the first {done} (the last line possibly cut) are '
            f'in {self._partial}')


class Discard:
  """The output of a process other than 0 in a multi-process run: process 0 writes."""

  def __init__(self, process_id: int):
    self.path, self.records, self._process_id = '-', 0, process_id
    self.complete = False

  def write(self, records: list[dict[str, Any]]) -> None:
    self.records += len(records)

  def close(self) -> None:
    self.complete = True

  def abort(self, total: int) -> str:
    return f'process {self._process_id} writes nothing (process 0 writes the output)'


@contextlib.contextmanager
def writing(out: Output | Discard, total: int) -> Iterator[Output]:
  """Closes `out` once the block completes; else aborts it and says what it holds.

  Args:
    out: the output, opened.
    total: the records a complete output holds.

  Yields:
    out.

  Raises:
    Interrupted, ConfigError: what the block raised, the output's state added
      to the message (a failed write, OSError, becomes a ConfigError).
    Exception: any other error of the block, the output's state in a note.
  """
  try:
    yield out
  except Interrupted as e:
    raise Interrupted(e.signum, f'{e.message}: {out.abort(total)}') from None
  except OSError as e:  # A write failed, e.g. a full disk.
    raise ConfigError(f'writing {out.path}: {e}; {out.abort(total)}') from None
  except ConfigError as e:
    raise ConfigError(f'{e.message}; {out.abort(total)}') from None
  except BaseException as e:
    e.add_note(f'the run failed: {out.abort(total)}')
    raise
  out.close()


def _same_file(a: str, b: str) -> bool:
  """Whether paths a and b name one file (local paths resolved, others compared as text)."""
  if '://' in a or '://' in b:
    return a == b
  return os.path.realpath(a) == os.path.realpath(b)

