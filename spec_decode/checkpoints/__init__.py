"""T5 1.1 parameters from and to T5X, orbax and Hugging Face checkpoints.

Every reader is a function of (path, dtype) that returns our parameter tree (T5X's
minimal T5, see spec_decode.t5.network) as nested dicts of numpy arrays, read on
the host and cast to `dtype` (None keeps the stored dtype). `load_params` detects
the format and checks the tree against a T5Config.

Formats:
  T5X (`read_t5x`, `write_t5x`): a checkpoint directory holding a msgpack file
    `checkpoint` = {'version': 3, 'optimizer': {'target': params, 'state': ...}}
    (flax.serialization) whose leaves are inline arrays or tensorstore spec dicts
    with a path relative to the directory, e.g. `target.encoder.layers_0.mlp.wo.kernel/`,
    a zarr array (gzip). Local paths and gs:// URLs both go through tensorstore.
    The optimizer slots are never read. This is also our own format: our trained
    models are written with `write_t5x` (float32 or bfloat16), so one format
    serves the committed models, the public T5 1.1 checkpoints and T5X itself.
  T5X's orbax layout (`read_orbax`): `checkpoint_N/state/`, an orbax PyTree with
    `target` (or `_optimizer/target`); any orbax PyTree of our params also reads.
  Hugging Face (`read_hf`, `write_hf`, `hf_config`, in `spec_decode.checkpoints.hf`
    and here): `model.safetensors` or shards listed by `model.safetensors.index.json`,
    T5ForConditionalGeneration names; local paths only.

Writes are committed last: `write_t5x` writes the msgpack file after every array,
so an interrupted save leaves a directory that no reader takes for a checkpoint.

The vocabulary a checkpoint was trained with (`spec_decode.checkpoints.vocabulary`,
here too): our writers record its fingerprint in `vocabulary.json` beside the
arrays; `check_vocabulary(checkpoint, vocabulary_file)` and
`check_vocabulary_pair(target, draft)` compare the records.
"""

import functools
import math
import os
import posixpath
import re
from typing import Any

import flax.serialization
import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

# hf_config, write_hf and expected_shapes: public here too, every format in one module.
from spec_decode.checkpoints.hf import (  # noqa: F401
    HF_FILE, HF_INDEX, check_hf_json, hf_config, hf_names, read_hf, write_hf)
from spec_decode.checkpoints.param_trees import (  # noqa: F401
    Params, cast, check_params, expected_shapes, flatten, unflatten)
from spec_decode.checkpoints.vocabulary import (  # noqa: F401
    SIDECAR, check_vocabulary, check_vocabulary_pair, read_vocabulary, vocabulary_record,
    write_vocabulary)
from spec_decode.t5.config import T5Config
from spec_decode.t5.decoder_only import DecoderOnlyConfig

T5X_VERSION = 3  # Since 2021: bfloat16 is stored as zarr 'bfloat16', not uint16.
_T5X_FILE = 'checkpoint'
_CHUNK_BYTES = 64 * 2**20  # T5X's target zarr chunk size.
_ORBAX_MARKERS = ('_METADATA', '_CHECKPOINT_METADATA', 'manifest.ocdbt')

# ---------------------------------------------------------------------------
# Storage locations: a local directory or a gs:// URL, as a tensorstore kvstore.


def _kvstore(directory: str) -> dict[str, Any]:
  """Kvstore spec of a directory (path ending in '/')."""
  directory = os.fspath(directory)
  if '://' in directory:
    return ts.KvStore.Spec(directory.rstrip('/') + '/').to_json()
  return {'driver': 'file', 'path': os.path.abspath(directory) + '/'}


def _child(kvstore: dict[str, Any], relative: str) -> dict[str, Any]:
  return {**kvstore, 'path': posixpath.join(kvstore['path'], relative)}


def _entries(directory: str) -> set[str]:
  """Names directly under a directory (empty if there is none)."""
  if '://' not in directory:
    return set(os.listdir(directory)) if os.path.isdir(directory) else set()
  keys = ts.KvStore.open(_kvstore(directory)).result().list().result()
  return {key.decode().split('/', 1)[0] for key in keys}


def _result(future, what: str):
  """Waits for a tensorstore future; its error becomes a ValueError naming `what`."""
  try:
    return future.result()
  except ValueError as e:
    raise ValueError(f'{what}: ' + re.sub(r' \[tensorstore_spec=.*\]$', '', str(e))) from e


# ---------------------------------------------------------------------------
# T5X: msgpack + zarr.


def _t5x_location(path: str) -> tuple[str, str]:
  """A checkpoint directory or its msgpack file -> (directory, msgpack path)."""
  path = os.fspath(path).rstrip('/')
  if posixpath.basename(path) == _T5X_FILE and _T5X_FILE not in _entries(path):
    return posixpath.dirname(path), path
  return path, posixpath.join(path, _T5X_FILE)


def read_t5x(path: str, dtype=None) -> Params:
  """Reads the parameters (`optimizer/target`) of a T5X checkpoint.

  Args:
    path: the checkpoint directory (e.g. .../checkpoint_1000000) or its
      `checkpoint` msgpack file; local or gs://.
    dtype: dtype to cast every array to; None keeps the stored dtypes.

  Returns:
    The parameter tree as stored, numpy arrays.

  Raises:
    FileNotFoundError: no msgpack file.
    ValueError: a corrupted or truncated msgpack file or zarr chunk, a missing
      zarr array or chunk, or an array whose stored shape disagrees with the
      msgpack file; the message names the array.
  """
  return _read_t5x(*_open_t5x(path), dtype)


def _open_t5x(path: str) -> tuple[str, dict[str, np.ndarray | ts.TensorStore]]:
  """The checkpoint directory and its target arrays: inline, or opened but not read."""
  directory, msgpack_path = _t5x_location(path)
  kvstore = _kvstore(directory)
  data = ts.KvStore.open(kvstore).result().read(_T5X_FILE).result()
  if data.state != 'value':
    raise FileNotFoundError(f'no T5X checkpoint file at {msgpack_path}')
  try:
    contents = flax.serialization.msgpack_restore(data.value)
  except Exception as e:  # msgpack raises several types for damaged bytes.
    raise ValueError(f'{msgpack_path} is corrupted or truncated: {e!r}') from e
  if not isinstance(contents, dict):
    raise ValueError(f'{msgpack_path} is not a T5X checkpoint')
  state = contents.get('optimizer', contents)  # Version 0 has no 'optimizer' level.
  if not isinstance(state, dict) or not isinstance(state.get('target'), dict):
    raise ValueError(f'{msgpack_path} has no optimizer/target parameters')

  leaves = flatten(state['target'])
  for name, leaf in leaves.items():
    if not isinstance(leaf, (dict, np.ndarray)):
      raise ValueError(f'T5X array {name} in {msgpack_path} is neither an array nor a '
                       f'tensorstore spec: {leaf!r}')
  opening = {name: _open_zarr(kvstore, name, leaf, msgpack_path)
             for name, leaf in leaves.items() if isinstance(leaf, dict)}
  for name, future in opening.items():
    leaves[name] = _check_stored_shape(name, _result(future, _where(name, directory)),
                                       leaves[name])
  return directory, leaves


def _where(name: str, directory: str) -> str:
  return f'T5X array {name} in {directory}'


def _read_t5x(directory: str, arrays: dict[str, np.ndarray | ts.TensorStore], dtype) -> Params:
  """Reads the opened arrays of `_open_t5x` (concurrently) -> the parameter tree."""
  reads = {name: x.read() for name, x in arrays.items() if isinstance(x, ts.TensorStore)}
  return unflatten({name: cast(_result(reads[name], _where(name, directory))
                                 if name in reads else x, dtype)
                     for name, x in arrays.items()})


def _read_t5x_sharded(directory: str, arrays: dict[str, np.ndarray | ts.TensorStore], dtype,
                      shardings: dict[str, jax.sharding.Sharding]) -> Params:
  """Reads the opened arrays of `_open_t5x` straight onto their shards.

  One array at a time, so a host holds at most one array's local slices.
  """
  params = {}
  for name, x in arrays.items():
    if name not in shardings:
      raise ValueError(f'no sharding for {_where(name, directory)}')
    if isinstance(x, np.ndarray):
      params[name] = jax.device_put(cast(x, dtype), shardings[name])
      continue
    # The distinct slices this host's devices hold (replicas share one read), read concurrently.
    reads = {}
    for index in shardings[name].addressable_devices_indices_map(x.shape).values():
      reads.setdefault(_slice_key(index), x[index].read())
    params[name] = jax.make_array_from_callback(
        x.shape, shardings[name],
        lambda index, name=name, reads=reads: cast(
            _result(reads[_slice_key(index)], _where(name, directory)), dtype))
  return unflatten(params)


def _slice_key(index: tuple[slice, ...]) -> tuple:
  """A device's index into an array (slices), hashable."""
  return tuple((s.start, s.stop) for s in index)


def _open_zarr(kvstore: dict[str, Any], name: str, spec: dict[str, Any], msgpack_path: str):
  """Opens the zarr array of one tensorstore spec from the msgpack file."""
  relative = spec.get('kvstore', {}).get('path') or spec.get('path')
  driver = spec.get('kvstore', {}).get('driver')
  if spec.get('driver') != 'zarr' or driver not in ('file', 'gfile', 'gcs') or not relative:
    raise ValueError(f'T5X array {name} in {msgpack_path} has an unsupported spec {spec}')
  if spec.get('dtype') == 'uint16':
    raise ValueError(f'T5X array {name} is stored as uint16 (a version 2 bfloat16 checkpoint); '
                     'only bfloat16 stored natively (version 3) is supported')
  # The driver in the file is where it was written; read where it lies now.
  return ts.open({'driver': 'zarr', 'kvstore': _child(kvstore, relative),
                  'fill_missing_data_reads': False}, open=True, read=True)


def _check_stored_shape(name: str, store: ts.TensorStore, spec: dict[str, Any]) -> ts.TensorStore:
  recorded = tuple(spec.get('metadata', {}).get('shape', store.shape))
  if tuple(store.shape) != recorded:
    raise ValueError(f'T5X array {name}: the zarr array has shape {tuple(store.shape)} but the '
                     f'msgpack file records {recorded}')
  return store


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """Chunks that tile `shape` exactly, at most _CHUNK_BYTES, splitting the longest axis first."""
  chunks = list(shape)
  while math.prod(chunks) * itemsize > _CHUNK_BYTES:
    axis = int(np.argmax(chunks))
    chunks[axis] = max(d for d in range(1, chunks[axis]) if chunks[axis] % d == 0)
  return chunks


def write_t5x(path: str, params: Params, step: int = 0, dtype=None,
              vocabulary: Any = None) -> None:
  """Writes `params` as a T5X checkpoint (an InferenceState: no optimizer slots).

  Every parameter is a gzip zarr array `target.<name with dots>/`; the
  vocabulary's record `vocabulary.json` next; the msgpack file `checkpoint` =
  {'version': 3, 'optimizer': {'target': specs, 'state': {'step': int32}}} last.

  Args:
    path: the checkpoint directory to create (e.g. .../checkpoint_1000), local
      or gs://; it must not exist or be empty.
    params: the parameter tree (numpy or jax arrays).
    step: the training step recorded in `state/step`.
    dtype: dtype to store the parameters in (e.g. 'bfloat16'); None keeps theirs.
    vocabulary: the SentencePiece model file (or Vocabulary) the parameters
      were trained with, recorded by `write_vocabulary` for `check_vocabulary`;
      None records nothing.
  """
  path = os.fspath(path).rstrip('/')
  if _entries(path):
    raise FileExistsError(f'{path} exists and is not empty')
  record = None if vocabulary is None else vocabulary_record(vocabulary)  # before any write
  kvstore = _kvstore(path)
  # T5X records gs:// arrays under a dummy bucket, set again on reading.
  recorded = ({'driver': 'gcs', 'bucket': 't5x-dummy-bucket'} if kvstore['driver'] == 'gcs'
              else {'driver': 'file'})
  specs, writes = {}, []
  for name, x in flatten(params).items():
    x = cast(x, dtype)
    relative = f'target.{name.replace("/", ".")}'
    metadata = {'compressor': {'id': 'gzip'}, 'shape': list(x.shape),
                'chunks': _chunk_shape(x.shape, x.dtype.itemsize)}
    spec = {'driver': 'zarr', 'dtype': x.dtype.name, 'metadata': metadata}
    specs[name] = ts.Spec({**spec, 'kvstore': {**recorded, 'path': relative}}).to_json()
    store = ts.open({**spec, 'kvstore': _child(kvstore, relative)}, create=True).result()
    writes.append(store.write(x))
  for future in writes:
    future.result()
  if record is not None:
    write_vocabulary(path, record)
  contents = {'version': T5X_VERSION,
              'optimizer': {'target': unflatten(specs), 'state': {'step': np.int32(step)}}}
  ts.KvStore.open(kvstore).result().write(
      _T5X_FILE, flax.serialization.msgpack_serialize(contents)).result()


# ---------------------------------------------------------------------------
# Orbax: T5X's newer layout.


def read_orbax(path: str, dtype=None) -> Params:
  """Reads the parameters of an orbax PyTree checkpoint.

  Args:
    path: T5X's `checkpoint_N` (with a `state/` item) or an orbax item
      directory; its tree holds `target`, `_optimizer/target` or the params.
    dtype: dtype to cast every array to; None keeps the stored dtypes.

  Returns:
    The parameter tree, numpy arrays; optimizer slots are not read.
  """
  path = os.fspath(path).rstrip('/')
  if '://' not in path:  # orbax refuses a relative path
    path = os.path.abspath(path)
  if 'state' in _entries(path):
    path = posixpath.join(path, 'state')
  checkpointer = ocp.PyTreeCheckpointer()
  try:
    tree = checkpointer.metadata(path).item_metadata.tree
  except Exception as e:  # orbax raises many types for unreadable metadata.
    raise ValueError(f'{path} is not a readable orbax checkpoint: {e!r}') from e
  # T5X's train state, an older T5X's, or the params alone.
  keys = next(k for k in (('target',), ('_optimizer', 'target'), ()) if not k or k[0] in tree)
  target = functools.reduce(lambda node, key: node[key], keys, tree)
  restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
  for key in reversed(keys):
    target, restore_args = {key: target}, {key: restore_args}
  try:
    restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args, partial_restore=True))
  except Exception as e:
    raise ValueError(f'{path}: orbax could not read the parameters: {e!r}') from e
  params = functools.reduce(lambda node, key: node[key], keys, restored)
  return jax.tree_util.tree_map(lambda x: cast(x, dtype), params)


# ---------------------------------------------------------------------------
# Any format.


def checkpoint_format(path: str) -> str:
  """'t5x', 'orbax' or 'hf', from the files at `path`.

  Raises:
    FileNotFoundError: nothing at `path`, or none of the formats' files.
  """
  path = os.fspath(path).rstrip('/')
  base = posixpath.basename(path)
  if base.endswith(('.safetensors', '.safetensors.index.json')):
    return 'hf'
  entries = _entries(path)
  if base == _T5X_FILE and not entries:
    return 't5x'  # The msgpack file itself.
  if not entries:
    raise FileNotFoundError(f'no checkpoint at {path}: no such directory, or it is empty')
  if 'state' in entries or any(m in entries for m in _ORBAX_MARKERS):
    return 'orbax'
  if _T5X_FILE in entries:
    return 't5x'
  if HF_FILE in entries or HF_INDEX in entries:
    return 'hf'
  raise FileNotFoundError(
      f'no checkpoint in {path}: no T5X `{_T5X_FILE}` file, no {HF_FILE} or {HF_INDEX}, no '
      f'orbax metadata; it holds {", ".join(sorted(entries)[:8])}')


def load_params(path: str, config: T5Config, dtype=None, shardings: Any = None) -> Params:
  """Reads a T5X, orbax or Hugging Face checkpoint and checks it against `config`.

  Args:
    path: a checkpoint directory or file (see `checkpoint_format`).
    config: the T5Config the parameters must fit, or a DecoderOnlyConfig
      (T5X's decoder-only layout; T5X and orbax checkpoints).
    dtype: dtype of the returned arrays; default config.param_dtype.
    shardings: optional tree of jax.sharding.Sharding, one per parameter (e.g.
      `spec_decode.models.sharding.param_shardings`): the arrays are then placed on
      their devices. A T5X array is read slice by slice, each host reading
      only the slices its own devices hold (no whole copy on any host); orbax
      and Hugging Face arrays are read whole on the host, then placed.

  Returns:
    The parameter tree for spec_decode.t5.Transformer(config): numpy arrays, or
    jax Arrays with `shardings`.

  Raises:
    FileNotFoundError: no checkpoint at `path`.
    ValueError: damaged files, or arrays missing, unexpected or of the wrong
      shape or vocabulary size for `config`; the message names each array.
  """
  kind = checkpoint_format(path)
  if kind == 'hf' and isinstance(config, DecoderOnlyConfig):
    raise ValueError(f'{path} is a Hugging Face checkpoint: decoder-only T5 models load from '
                     'T5X or orbax checkpoints (Llama checkpoints: spec_decode.llama.LlamaModel)')
  dtype = config.param_dtype if dtype is None else dtype
  source = f'{kind} checkpoint {path}'
  if kind == 't5x':  # Shapes are checked before any array is read.
    directory, arrays = _open_t5x(path)
    check_params(unflatten(arrays), config, source)
    if shardings is not None:
      return _read_t5x_sharded(directory, arrays, dtype, flatten(shardings))
    return _read_t5x(directory, arrays, dtype)
  if kind == 'orbax':
    params = read_orbax(path, dtype)
    check_params(params, config, source)
  else:
    params = read_hf(path, dtype)
    names = hf_names(*(sum(key.startswith('layers_') for key in params[stack])
                       for stack in ('encoder', 'decoder')))
    check_params(params, config, source, lambda name: f'{name} ({names[name]})')
    check_hf_json(path, config)
  return params if shardings is None else jax.device_put(params, shardings)
