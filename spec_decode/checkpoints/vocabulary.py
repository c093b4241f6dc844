"""The vocabulary a checkpoint was trained with: a sidecar file and its checks.

A SentencePiece model of the right size from another training maps the same
ids to other pieces: a model decodes with it to fluent-looking garbage and
nothing fails. Our writers (the training loops, `write_t5x` with a
vocabulary) therefore put `vocabulary.json` in the checkpoint directory:

  {"sha256": "<hex>", "vocab_size": 8192, "file": "spm_8k.model"}

`sha256` is `spec_decode.text.fingerprint` of the model file (its serialized
proto), `vocab_size` the Vocabulary's size (pieces plus extra ids), `file` the
model file's name, for messages only. `check_vocabulary` compares a
vocabulary with a checkpoint's record and `check_vocabulary_pair` a target's
record with a draft's. A checkpoint without a record (T5X's own, Hugging
Face's) cannot be checked: both return None for it, silently.
"""

import json
import os
import posixpath
import warnings
from typing import Any

import tensorstore as ts

from spec_decode import text as text_lib

SIDECAR = 'vocabulary.json'
_FIELDS = {'sha256': str, 'vocab_size': int, 'file': str}
_DEFAULT_OVERRIDE = 'allow_mismatch=True'


def vocabulary_record(vocabulary: Any) -> dict[str, Any]:
  """The sidecar's contents for a vocabulary.

  Args:
    vocabulary: a SentencePiece model file, a Vocabulary or anything with
      `sentencepiece_model_file` and `vocab_size` (seqio's), or a record
      (its three fields are kept).
  """
  if isinstance(vocabulary, dict):
    return {k: vocabulary[k] for k in _FIELDS}
  if not hasattr(vocabulary, 'sentencepiece_model_file'):
    vocabulary = text_lib.Vocabulary(vocabulary)
  path = os.fspath(vocabulary.sentencepiece_model_file)
  return {'sha256': text_lib.fingerprint(path), 'vocab_size': int(vocabulary.vocab_size),
          'file': posixpath.basename(path)}


def _directory(path: str | os.PathLike) -> str:
  """A checkpoint directory, or the directory of a checkpoint file (msgpack, safetensors)."""
  path = os.fspath(path).rstrip('/')
  if '://' not in path:
    return os.path.dirname(path) if os.path.isfile(path) else path
  if posixpath.basename(path) == 'checkpoint' or path.endswith(('.safetensors', '.json')):
    return posixpath.dirname(path)
  return path


def _kvstore(directory: str) -> ts.KvStore:
  if '://' in directory:
    return ts.KvStore.open(directory.rstrip('/') + '/').result()
  return ts.KvStore.open({'driver': 'file', 'path': os.path.abspath(directory) + '/'}).result()


def write_vocabulary(checkpoint_dir: str | os.PathLike, vocabulary: Any) -> dict[str, Any]:
  """Writes CHECKPOINT_DIR/vocabulary.json (local or gs://); returns what it wrote.

  Args:
    checkpoint_dir: the checkpoint directory (created if needed).
    vocabulary: what `vocabulary_record` takes (a Vocabulary's extra ids
      count in vocab_size).
  """
  record = vocabulary_record(vocabulary)
  _kvstore(os.fspath(checkpoint_dir)).write(SIDECAR, json.dumps(record, indent=1) + '\n').result()
  return record


def read_vocabulary(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
  """The vocabulary record of a checkpoint, or None when it has none.

  Args:
    checkpoint: a checkpoint directory or file. An orbax step directory
      (`.../checkpoints/1200`, a name of digits) without a record of its own
      takes its run's, `.../checkpoints/vocabulary.json`.

  Returns:
    {'sha256', 'vocab_size', 'file', 'path': the sidecar read}, or None.

  Raises:
    ValueError: a sidecar that is not JSON or lacks a field.
  """
  directory = _directory(checkpoint)
  candidates = [directory]
  if posixpath.basename(directory).isdigit():
    candidates.append(posixpath.dirname(directory))
  for candidate in candidates:
    path = posixpath.join(candidate, SIDECAR)
    if '://' not in candidate and not os.path.isdir(candidate):
      continue
    data = _kvstore(candidate).read(SIDECAR).result()
    if data.state != 'value':
      continue
    try:
      record = json.loads(bytes(data.value).decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(f'vocabulary record {path} is not JSON: {e}') from None
    if not isinstance(record, dict) or not all(isinstance(record.get(k), t)
                                               for k, t in _FIELDS.items()):
      raise ValueError(f'vocabulary record {path} needs string "sha256" and "file" and integer '
                       f'"vocab_size", got {record!r}')
    return {**{k: record[k] for k in _FIELDS}, 'path': path}
  return None


def _mismatch(message: str, allow_mismatch: bool) -> None:
  if not allow_mismatch:
    raise ValueError(message)
  warnings.warn(message, stacklevel=3)


def check_vocabulary(checkpoint_dir: str | os.PathLike, vocabulary_path: Any, *,
                     allow_mismatch: bool = False,
                     override: str = _DEFAULT_OVERRIDE) -> dict[str, Any] | None:
  """Checks that a checkpoint was trained with this vocabulary.

  Call it wherever a checkpoint is used together with a vocabulary, before
  decoding or training:

    checkpoints.check_vocabulary(args.checkpoint, args.vocabulary,
                                 allow_mismatch=args.allow_vocabulary_mismatch,
                                 override='--allow_vocabulary_mismatch')

  Args:
    checkpoint_dir: the checkpoint directory, or a checkpoint file (any
      format `load_params` reads).
    vocabulary_path: the SentencePiece model file (local or gs://), or a
      Vocabulary (anything with `sentencepiece_model_file`).
    allow_mismatch: a mismatch is a warning instead of an error.
    override: how the caller's user allows a mismatch, named in the message
      (e.g. a flag or gin setting).

  Returns:
    The checkpoint's record (see `read_vocabulary`), or None when it has none
    (a T5X or Hugging Face checkpoint we did not write: nothing to check).

  Raises:
    ValueError: the fingerprints differ (without allow_mismatch), naming both
      files, both fingerprints and `override`; or a damaged record.
    FileNotFoundError: no vocabulary file.
  """
  record = read_vocabulary(checkpoint_dir)
  if record is None:
    return None
  path = getattr(vocabulary_path, 'sentencepiece_model_file', vocabulary_path)
  sha256 = text_lib.fingerprint(path)
  if sha256 != record['sha256']:
    _mismatch(f'vocabulary mismatch: {os.fspath(path)} has sha256 {sha256}, but checkpoint '
              f'{os.fspath(checkpoint_dir)} was trained with {record["file"]}, sha256 '
              f'{record["sha256"]} ({record["path"]}); the same ids are other pieces there, so '
              f'its text would be garbage. Use the vocabulary it was trained with, or '
              f'{override} to go on anyway.', allow_mismatch)
  return record


def check_vocabulary_pair(target_dir: str | os.PathLike, draft_dir: str | os.PathLike, *,
                          allow_mismatch: bool = False,
                          override: str = _DEFAULT_OVERRIDE) -> None:
  """Checks that a target and a draft checkpoint were trained with one vocabulary.

  Speculative decoding compares p and q id by id: a draft of another
  vocabulary proposes ids that mean other pieces to the target, which
  rejects them almost always.
  Nothing is checked when either checkpoint has no record.

  Args:
    target_dir: the target's checkpoint directory or file.
    draft_dir: the draft's.
    allow_mismatch: a mismatch is a warning instead of an error.
    override: how the caller's user allows a mismatch, named in the message.

  Raises:
    ValueError: the recorded fingerprints differ (without allow_mismatch),
      naming both checkpoints, their vocabulary files and fingerprints.
  """
  records = read_vocabulary(target_dir), read_vocabulary(draft_dir)
  if None in records or records[0]['sha256'] == records[1]['sha256']:
    return
  (p, q), names = records, (os.fspath(target_dir), os.fspath(draft_dir))
  _mismatch(f'vocabulary mismatch: the target {names[0]} was trained with {p["file"]} (sha256 '
            f'{p["sha256"]}), the draft {names[1]} with {q["file"]} (sha256 {q["sha256"]}); '
            f'their token ids do not mean the same pieces. Use a draft trained with the '
            f"target's vocabulary, or {override} to go on anyway.", allow_mismatch)
