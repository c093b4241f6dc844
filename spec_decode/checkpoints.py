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
  Hugging Face (`read_hf`, `write_hf`, `hf_config`): `model.safetensors` or shards
    listed by `model.safetensors.index.json`, T5ForConditionalGeneration names;
    local paths only. PyTorch Linear weights are [out, in], our kernels [in, out].

Writes are committed last: `write_t5x` writes the msgpack file after every array,
so an interrupted save leaves a directory that no reader takes for a checkpoint.
"""

import functools
import json
import math
import os
import posixpath
import re
from typing import Any, Callable

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from flax import traverse_util

from spec_decode.t5.config import T5Config
from spec_decode.t5.network import Transformer

Params = dict[str, Any]  # Nested dicts of arrays, our T5X layout.

T5X_VERSION = 3  # Since 2021: bfloat16 is stored as zarr 'bfloat16', not uint16.
_T5X_FILE = 'checkpoint'
_CHUNK_BYTES = 64 * 2**20  # T5X's target zarr chunk size.
_HF_FILE = 'model.safetensors'
_HF_INDEX = 'model.safetensors.index.json'
_ORBAX_MARKERS = ('_METADATA', '_CHECKPOINT_METADATA', 'manifest.ocdbt')


def _cast(x, dtype) -> np.ndarray:
  """Any array -> numpy, cast to `dtype` (a name or dtype) unless None."""
  x = np.asarray(x)
  return x if dtype is None else x.astype(jnp.dtype(dtype), copy=False)


def _flatten(tree: dict) -> dict[str, Any]:
  """Nested dicts -> {'a/b/c': leaf}; tensorstore spec dicts are leaves."""
  return traverse_util.flatten_dict(tree, sep='/', is_leaf=lambda _, node: 'driver' in node)


def _unflatten(flat: dict[str, Any]) -> Params:
  return traverse_util.unflatten_dict(flat, sep='/')


# ---------------------------------------------------------------------------
# Validation against a config.


@functools.cache
def expected_shapes(config: T5Config) -> dict[str, tuple[int, ...]]:
  """The network's own parameter names and shapes, e.g. 'encoder/encoder_norm/scale': (E,)."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  shapes = jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens, tokens)
  return {name: x.shape for name, x in _flatten(shapes['params']).items()}


def check_params(params: Params, config: T5Config, source: str = 'checkpoint',
                 describe: Callable[[str], str] = lambda name: name) -> None:
  """Raises ValueError naming every array of `params` that does not fit `config`.

  Args:
    params: a parameter tree; its leaves need only a `shape`.
    config: the T5Config it should fit.
    source: the checkpoint path, for the message.
    describe: our array name -> its name in the message (e.g. with the HF name).
  """
  expected = expected_shapes(config)
  found = {name: np.shape(x) for name, x in _flatten(params).items()}
  problems, vocab_mismatch = [], set()
  for name, axis in (('token_embedder/embedding', 0), ('decoder/logits_dense/kernel', 1)):
    shape = found.get(name)
    if shape is not None and len(shape) == 2 and shape[axis] != config.vocab_size:
      vocab_mismatch.add(name)
      problems.append(f'vocab size mismatch: {describe(name)} {shape} has vocab '
                      f'{shape[axis]}, config.vocab_size is {config.vocab_size}')
  problems += [f'missing array {describe(n)}, expected shape {expected[n]}'
               for n in expected if n not in found]
  problems += [f'unexpected array {describe(n)} {found[n]}' for n in found if n not in expected]
  problems += [f'shape mismatch for {describe(n)}: expected {expected[n]} (from the config), '
               f'found {found[n]}' for n in expected
               if n in found and found[n] != expected[n] and n not in vocab_mismatch]
  if problems:
    raise ValueError(f'{source} does not fit the config:\n  ' + '\n  '.join(problems))


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

  leaves = _flatten(state['target'])
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
  return _unflatten({name: _cast(_result(reads[name], _where(name, directory))
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
      params[name] = jax.device_put(_cast(x, dtype), shardings[name])
      continue
    # The distinct slices this host's devices hold (replicas share one read), read concurrently.
    reads = {}
    for index in shardings[name].addressable_devices_indices_map(x.shape).values():
      reads.setdefault(_slice_key(index), x[index].read())
    params[name] = jax.make_array_from_callback(
        x.shape, shardings[name],
        lambda index, name=name, reads=reads: _cast(
            _result(reads[_slice_key(index)], _where(name, directory)), dtype))
  return _unflatten(params)


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


def write_t5x(path: str, params: Params, step: int = 0, dtype=None) -> None:
  """Writes `params` as a T5X checkpoint (an InferenceState: no optimizer slots).

  Every parameter is a gzip zarr array `target.<name with dots>/`; the msgpack
  file `checkpoint` = {'version': 3, 'optimizer': {'target': specs, 'state':
  {'step': int32}}} is written last.

  Args:
    path: the checkpoint directory to create (e.g. .../checkpoint_1000), local
      or gs://; it must not exist or be empty.
    params: the parameter tree (numpy or jax arrays).
    step: the training step recorded in `state/step`.
    dtype: dtype to store the parameters in (e.g. 'bfloat16'); None keeps theirs.
  """
  path = os.fspath(path).rstrip('/')
  if _entries(path):
    raise FileExistsError(f'{path} exists and is not empty')
  kvstore = _kvstore(path)
  # T5X records gs:// arrays under a dummy bucket, set again on reading.
  recorded = ({'driver': 'gcs', 'bucket': 't5x-dummy-bucket'} if kvstore['driver'] == 'gcs'
              else {'driver': 'file'})
  specs, writes = {}, []
  for name, x in _flatten(params).items():
    x = _cast(x, dtype)
    relative = f'target.{name.replace("/", ".")}'
    metadata = {'compressor': {'id': 'gzip'}, 'shape': list(x.shape),
                'chunks': _chunk_shape(x.shape, x.dtype.itemsize)}
    spec = {'driver': 'zarr', 'dtype': x.dtype.name, 'metadata': metadata}
    specs[name] = ts.Spec({**spec, 'kvstore': {**recorded, 'path': relative}}).to_json()
    store = ts.open({**spec, 'kvstore': _child(kvstore, relative)}, create=True).result()
    writes.append(store.write(x))
  for future in writes:
    future.result()
  contents = {'version': T5X_VERSION,
              'optimizer': {'target': _unflatten(specs), 'state': {'step': np.int32(step)}}}
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
  return jax.tree_util.tree_map(lambda x: _cast(x, dtype), params)


# ---------------------------------------------------------------------------
# Hugging Face: safetensors with T5ForConditionalGeneration names.

# Per block, in HF's `layer.{j}` order: (our sublayer, its norm, HF sublayer).
_ENCODER_BLOCK = (('attention', 'pre_attention_layer_norm', 'SelfAttention'),
                  ('mlp', 'pre_mlp_layer_norm', 'DenseReluDense'))
_DECODER_BLOCK = (
    ('self_attention', 'pre_self_attention_layer_norm', 'SelfAttention'),
    ('encoder_decoder_attention', 'pre_cross_attention_layer_norm', 'EncDecAttention'),
    ('mlp', 'pre_mlp_layer_norm', 'DenseReluDense'))
_ATTENTION = (('query', 'q'), ('key', 'k'), ('value', 'v'), ('out', 'o'))
_MLP = (('wi_0', 'wi_0'), ('wi_1', 'wi_1'), ('wo', 'wo'))
# Copies of shared.weight that some exports carry; tied, so ignored.
_HF_TIED = ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight')


def hf_names(num_encoder_layers: int, num_decoder_layers: int) -> dict[str, str]:
  """Our array names -> Hugging Face T5ForConditionalGeneration tensor names."""
  relpos = 'block.0.layer.0.SelfAttention.relative_attention_bias.weight'
  names = {
      'token_embedder/embedding': 'shared.weight',
      'encoder/relpos_bias/rel_embedding': f'encoder.{relpos}',
      'encoder/encoder_norm/scale': 'encoder.final_layer_norm.weight',
      'decoder/relpos_bias/rel_embedding': f'decoder.{relpos}',
      'decoder/decoder_norm/scale': 'decoder.final_layer_norm.weight',
      'decoder/logits_dense/kernel': 'lm_head.weight',
  }
  for stack, count, block in (('encoder', num_encoder_layers, _ENCODER_BLOCK),
                              ('decoder', num_decoder_layers, _DECODER_BLOCK)):
    for i in range(count):
      for j, (ours, norm, theirs) in enumerate(block):
        prefix, hf_prefix = f'{stack}/layers_{i}', f'{stack}.block.{i}.layer.{j}'
        names[f'{prefix}/{norm}/scale'] = f'{hf_prefix}.layer_norm.weight'
        for a, b in _MLP if theirs == 'DenseReluDense' else _ATTENTION:
          names[f'{prefix}/{ours}/{a}/kernel'] = f'{hf_prefix}.{theirs}.{b}.weight'
  return names


def _hf_transposed(name: str) -> bool:
  """Whether HF stores our array transposed: Linear [out, in]; relative bias [32, H]."""
  return name.endswith(('/kernel', '/rel_embedding'))


def hf_config(config: T5Config, dtype=None) -> dict[str, Any]:
  """The Hugging Face `config.json` of a T5 1.1 model with this config.

  Args:
    config: our T5Config.
    dtype: the dtype the weights are stored in; default config.param_dtype.

  Returns:
    A dict that transformers.T5Config(**d) and from_pretrained take.
  """
  return {
      'architectures': ['T5ForConditionalGeneration'],
      'model_type': 't5',
      'vocab_size': config.vocab_size,
      'd_model': config.emb_dim,
      'd_kv': config.head_dim,
      'd_ff': config.mlp_dim,
      'num_layers': config.num_encoder_layers,
      'num_decoder_layers': config.num_decoder_layers,
      'num_heads': config.num_heads,
      'relative_attention_num_buckets': config.num_buckets,
      'relative_attention_max_distance': config.max_distance,
      'dropout_rate': config.dropout_rate,
      'layer_norm_epsilon': 1e-6,
      'initializer_factor': 1.0,
      'feed_forward_proj': 'gated-gelu',  # tanh GELU ('gelu_new'), as nn.gelu.
      'tie_word_embeddings': False,  # T5 1.1: own lm_head, no d_model**-0.5 rescaling.
      'is_encoder_decoder': True,
      'use_cache': True,
      'pad_token_id': 0,
      'eos_token_id': 1,
      'decoder_start_token_id': 0,
      'dtype': jnp.dtype(config.param_dtype if dtype is None else dtype).name,
  }


def _hf_files(path: str) -> dict[str, str]:
  """A safetensors file, an index or a directory -> {tensor name: file}."""
  path = os.fspath(path)
  if '://' in path:
    raise ValueError(f'{path}: Hugging Face checkpoints are read from local paths only')
  if os.path.isdir(path):
    for name in (_HF_INDEX, _HF_FILE):
      if os.path.isfile(os.path.join(path, name)):
        return _hf_files(os.path.join(path, name))
    raise FileNotFoundError(f'no {_HF_FILE} or {_HF_INDEX} in {path}')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no Hugging Face checkpoint file {path}')
  if path.endswith('.json'):
    try:
      with open(path) as f:
        weight_map = json.load(f)['weight_map']
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f'{path} is not a safetensors index: {e!r}') from e
    directory = os.path.dirname(path)
    return {name: os.path.join(directory, file) for name, file in weight_map.items()}
  with _safe_open(path) as f:
    return dict.fromkeys(f.keys(), path)


def _safe_open(file: str):
  """safe_open, with the names of truncated arrays in its error."""
  if not os.path.isfile(file):
    raise FileNotFoundError(f'no safetensors file {file}')
  # Imported here: only Hugging Face checkpoints need it, and accelerator images may lack it.
  import safetensors  # pylint: disable=g-import-not-at-top
  try:
    return safetensors.safe_open(file, framework='numpy')
  except safetensors.SafetensorError as e:
    raise ValueError(f'{file} is corrupted or truncated ({e}){_past_end(file)}') from e


def _past_end(file: str) -> str:
  """The arrays of a damaged safetensors file whose bytes lie beyond its end."""
  try:
    with open(file, 'rb') as f:
      header_len = int.from_bytes(f.read(8), 'little')
      header = json.loads(f.read(header_len))
    header.pop('__metadata__', None)
    ends = {name: 8 + header_len + entry['data_offsets'][1] for name, entry in header.items()}
  except Exception:  # The header itself is damaged: nothing more to say.
    return ''
  size = os.path.getsize(file)
  cut = sorted((end, name) for name, end in ends.items() if end > size)
  more = f' and {len(cut) - 3} more' if len(cut) > 3 else ''
  return (f'; {size} of {max(ends.values())} bytes, arrays past the end: '
          + ', '.join(name for _, name in cut[:3]) + more)


def read_hf(path: str, dtype=None) -> Params:
  """Reads a Hugging Face T5 1.1 checkpoint (T5ForConditionalGeneration names).

  Args:
    path: a directory with `model.safetensors` or `model.safetensors.index.json`,
      or one of those files; local.
    dtype: dtype to cast every array to; None keeps the stored dtypes.

  Returns:
    Our parameter tree, numpy arrays; layer counts come from the block names.

  Raises:
    FileNotFoundError: no checkpoint file, or a shard the index names is absent.
    ValueError: a missing or unexpected tensor or a damaged file; the message
      names the tensor.
  """
  files = _hf_files(path)
  counts = {stack: 1 + max((int(m[1]) for name in files
                            if (m := re.match(rf'{stack}\.block\.(\d+)\.', name))), default=-1)
            for stack in ('encoder', 'decoder')}
  ours = {hf: name for name, hf in hf_names(counts['encoder'], counts['decoder']).items()}
  unexpected = sorted(set(files) - set(ours) - set(_HF_TIED))
  missing = sorted(set(ours) - set(files))
  if unexpected or missing:
    raise ValueError(f'{path} is not a T5 1.1 checkpoint of {counts["encoder"]} + '
                     f'{counts["decoder"]} layers:\n  ' + '\n  '.join(
                         [f'missing array {n} (our {ours[n]})' for n in missing]
                         + [f'unexpected array {n}' for n in unexpected]))
  flat = {}
  for file in sorted(set(files.values())):
    with _safe_open(file) as f:
      in_file = set(f.keys())
      for hf in sorted(n for n in ours if files[n] == file):
        if hf not in in_file:
          raise ValueError(f'missing array {hf}: the index puts it in {file}, which lacks it')
        x = f.get_tensor(hf)
        name = ours[hf]
        flat[name] = np.ascontiguousarray(_cast(x.T if _hf_transposed(name) else x, dtype))
  return _unflatten(flat)


def _check_hf_json(path: str, config: T5Config) -> None:
  """Checks a config.json next to the weights, if any, for what no shape shows."""
  directory = path if os.path.isdir(path) else os.path.dirname(path)
  file = os.path.join(directory, 'config.json')
  if not os.path.isfile(file):
    return
  with open(file) as f:
    stored = json.load(f)
  # T5 1.0 scales the decoder output by d_model**-0.5: transformers 4 says so with
  # tie_word_embeddings (default true), transformers 5 with scale_decoder_outputs.
  scaled = stored.get('scale_decoder_outputs', stored.get('tie_word_embeddings', True) is not False)
  found_needed = {
      'feed_forward_proj': (stored.get('feed_forward_proj', 'relu'), 'gated-gelu'),
      'scale_decoder_outputs': (scaled, False),
      'relative_attention_max_distance': (stored.get('relative_attention_max_distance', 128),
                                          config.max_distance),
      'layer_norm_epsilon': (stored.get('layer_norm_epsilon', 1e-6), 1e-6),
  }
  wrong = [f'{key} is {found!r}, the config needs {needed!r}'
           for key, (found, needed) in found_needed.items() if found != needed]
  if wrong:
    raise ValueError(f'{file} describes another model: ' + '; '.join(wrong))


def write_hf(path: str, params: Params, config: T5Config, dtype=None) -> None:
  """Exports `params` for transformers.T5ForConditionalGeneration.from_pretrained.

  Writes `model.safetensors` (one file) and `config.json` (see `hf_config`).

  Args:
    path: the directory to write to (created if needed).
    params: our parameter tree; checked against `config`.
    config: its T5Config.
    dtype: dtype to store the weights in; default config.param_dtype.
  """
  check_params(params, config, source='params')
  dtype = config.param_dtype if dtype is None else dtype
  names = hf_names(config.num_encoder_layers, config.num_decoder_layers)
  tensors = {}
  for name, x in _flatten(params).items():
    x = _cast(x, dtype)
    tensors[names[name]] = np.ascontiguousarray(x.T if _hf_transposed(name) else x)
  os.makedirs(path, exist_ok=True)
  import safetensors.numpy  # pylint: disable=g-import-not-at-top (see _safe_open)
  safetensors.numpy.save_file(tensors, os.path.join(path, _HF_FILE), metadata={'format': 'pt'})
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf_config(config, dtype), f, indent=2)


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
  if _HF_FILE in entries or _HF_INDEX in entries:
    return 'hf'
  raise FileNotFoundError(
      f'no checkpoint in {path}: no T5X `{_T5X_FILE}` file, no {_HF_FILE} or {_HF_INDEX}, no '
      f'orbax metadata; it holds {", ".join(sorted(entries)[:8])}')


def load_params(path: str, config: T5Config, dtype=None, shardings: Any = None) -> Params:
  """Reads a T5X, orbax or Hugging Face checkpoint and checks it against `config`.

  Args:
    path: a checkpoint directory or file (see `checkpoint_format`).
    config: the T5Config the parameters must fit.
    dtype: dtype of the returned arrays; default config.param_dtype.
    shardings: optional tree of jax.sharding.Sharding, one per parameter (e.g.
      `spec_decode.sharding.param_shardings`): the arrays are then placed on
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
  dtype = config.param_dtype if dtype is None else dtype
  source = f'{kind} checkpoint {path}'
  if kind == 't5x':  # Shapes are checked before any array is read.
    directory, arrays = _open_t5x(path)
    check_params(_unflatten(arrays), config, source)
    if shardings is not None:
      return _read_t5x_sharded(directory, arrays, dtype, _flatten(shardings))
    return _read_t5x(directory, arrays, dtype)
  if kind == 'orbax':
    params = read_orbax(path, dtype)
    check_params(params, config, source)
  else:
    params = read_hf(path, dtype)
    names = hf_names(*(sum(key.startswith('layers_') for key in params[stack])
                       for stack in ('encoder', 'decoder')))
    check_params(params, config, source, lambda name: f'{name} ({names[name]})')
    _check_hf_json(path, config)
  return params if shardings is None else jax.device_put(params, shardings)
