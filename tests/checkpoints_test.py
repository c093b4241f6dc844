"""Tests for spec_decode.checkpoints: T5X, orbax and Hugging Face checkpoints.

The fixtures write each format by hand (tensorstore, flax msgpack, safetensors),
independently of the module's writers; every read must give the source's
logits exactly, and every damaged or mismatched checkpoint an error naming the
array.
"""

import dataclasses
import json
import os

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy
import tensorstore as ts
from flax import traverse_util

from spec_decode import checkpoints
from spec_decode import data
from spec_decode import models
from spec_decode import text
from spec_decode.t5 import config as config_lib
from spec_decode.t5 import network
from tests import tolerances

CONFIG = config_lib.t5_1_1('tiny', vocab_size=100)
BATCH, ENCODER_LEN, DECODER_LEN = 2, 9, 7
WO = 'decoder/layers_1/mlp/wo/kernel'
HF_WO = 'decoder.block.1.layer.2.DenseReluDense.wo.weight'


@pytest.fixture(scope='module')
def params():
  """Random parameters of the network's shapes, every array different."""
  rng = np.random.default_rng(0)
  flat = {}
  for name, shape in checkpoints.expected_shapes(CONFIG).items():
    x = rng.standard_normal(shape)
    if name.endswith('/scale'):
      x = 1.0 + 0.1 * x
    elif name.endswith('/kernel'):
      x = x / np.sqrt(shape[0])
    flat[name] = x.astype(np.float32)
  return traverse_util.unflatten_dict(flat, sep='/')


@jax.jit
def _logits(params):
  rng = np.random.default_rng(0)
  inputs = rng.integers(1, CONFIG.vocab_size, (BATCH, ENCODER_LEN))
  targets = rng.integers(1, CONFIG.vocab_size, (BATCH, DECODER_LEN))
  return network.Transformer(CONFIG).apply({'params': params}, inputs, targets)


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep='/')


def _assert_same_logits(loaded, params):
  np.testing.assert_array_equal(_logits(loaded), _logits(params))


# --- T5X -------------------------------------------------------------------


def _zarr(directory, relative, x, chunks=None, driver='file'):
  """Writes one gzip zarr array as T5X does; returns the spec dict it records."""
  spec = {'driver': 'zarr', 'dtype': x.dtype.name,
          'metadata': {'compressor': {'id': 'gzip'}, 'shape': list(x.shape),
                       'chunks': list(chunks or x.shape)}}
  kvstore = {'driver': 'file', 'path': os.path.join(directory, relative)}
  store = ts.open({**spec, 'kvstore': kvstore}, create=True).result()
  store.write(x).result()
  recorded = ts.Spec({**spec, 'kvstore': {'driver': 'file', 'path': relative}}).to_json()
  recorded['kvstore']['driver'] = driver  # 'gfile' is Google-internal tensorstore.
  if driver == 'gcs':  # Written to gs:// and copied here.
    recorded['kvstore']['bucket'] = 't5x-dummy-bucket'
  return recorded


def _t5x_by_hand(directory, params, drop=(), extra=None):
  """A T5X training checkpoint: zarr target arrays, one inline, Adafactor slots."""
  os.makedirs(directory)
  target = {}
  for name, x in _flat(params).items():
    if name in drop:
      continue
    relative = 'target.' + name.replace('/', '.')
    if name == 'encoder/relpos_bias/rel_embedding':
      target[name] = x  # Inline in the msgpack file.
    elif name == 'token_embedder/embedding':
      target[name] = _zarr(directory, relative, x, chunks=(25, 32))  # 4 x 2 chunks.
    else:
      # Older T5X recorded 'gfile', on gs:// 'gcs'; the path is relative to the directory.
      driver = 'gfile' if 'mlp' in name else 'gcs' if '/out/' in name else 'file'
      target[name] = _zarr(directory, relative, x, driver=driver)
  target.update(extra or {})
  slots = {'decoder/decoder_norm/scale/v': _zarr(
      directory, 'state.param_states.decoder.decoder_norm.scale.v', np.ones(CONFIG.emb_dim)),
           'decoder/decoder_norm/scale/m': np.zeros(1, np.float32)}
  contents = {'version': 3, 'optimizer': {
      'target': traverse_util.unflatten_dict(target, sep='/'),
      'state': {'step': np.int32(7), 'param_states': traverse_util.unflatten_dict(slots, sep='/')}}}
  with open(os.path.join(directory, 'checkpoint'), 'wb') as f:
    f.write(flax.serialization.msgpack_serialize(contents))
  return directory


def test_read_t5x_written_by_hand(params, tmp_path):
  directory = _t5x_by_hand(str(tmp_path / 'checkpoint_7'), params)
  assert checkpoints.checkpoint_format(directory) == 't5x'
  loaded = checkpoints.load_params(directory, CONFIG)
  _assert_same_logits(loaded, params)
  from_file = checkpoints.load_params(os.path.join(directory, 'checkpoint'), CONFIG)
  _assert_same_logits(from_file, params)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_write_t5x_round_trip(params, tmp_path, dtype):
  directory = str(tmp_path / 'checkpoint_3')
  checkpoints.write_t5x(directory, params, step=3, dtype=dtype)
  with open(os.path.join(directory, 'checkpoint'), 'rb') as f:
    contents = flax.serialization.msgpack_restore(f.read())
  assert contents['version'] == 3 and contents['optimizer']['state']['step'] == 3
  spec = contents['optimizer']['target']['decoder']['layers_1']['mlp']['wo']['kernel']
  assert spec['kvstore'] == {'driver': 'file', 'path': 'target.decoder.layers_1.mlp.wo.kernel/'}
  assert spec['dtype'] == dtype and spec['metadata']['compressor']['id'] == 'gzip'
  with open(os.path.join(directory, 'target.decoder.layers_1.mlp.wo.kernel', '.zarray')) as f:
    assert json.load(f)['compressor']['id'] == 'gzip'

  stored = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
  loaded = checkpoints.load_params(directory, CONFIG, dtype=dtype)
  assert _flat(loaded)[WO].dtype == jnp.dtype(dtype)
  _assert_same_logits(loaded, stored)
  as_float32 = checkpoints.read_t5x(directory, dtype='float32')
  _assert_same_logits(as_float32, jax.tree_util.tree_map(lambda x: x.astype(np.float32), stored))
  with pytest.raises(FileExistsError):
    checkpoints.write_t5x(directory, params)


def test_write_t5x_chunks(params, tmp_path, monkeypatch):
  monkeypatch.setattr(checkpoints, '_CHUNK_BYTES', 1000)
  directory = str(tmp_path / 'checkpoint_0')
  checkpoints.write_t5x(directory, params)
  chunks = os.listdir(os.path.join(directory, 'target.token_embedder.embedding'))
  assert len(chunks) > 2, chunks  # [100, 64] float32 in chunks of at most 1000 bytes.
  _assert_same_logits(checkpoints.load_params(directory, CONFIG), params)
  monkeypatch.undo()
  embedding = (32128, 4096)  # T5 1.1 XXL, float32: 526 MB.
  chunks = checkpoints._chunk_shape(embedding, 4)
  assert np.prod(chunks) * 4 <= 64 * 2**20 and not np.any(np.mod(embedding, chunks)), chunks


def test_gcs_location():
  kvstore = checkpoints._kvstore('gs://bucket/models/checkpoint_5')
  assert kvstore == {'driver': 'gcs', 'bucket': 'bucket', 'path': 'models/checkpoint_5/'}
  assert checkpoints._child(kvstore, 'target.a.kernel/') == {
      'driver': 'gcs', 'bucket': 'bucket', 'path': 'models/checkpoint_5/target.a.kernel/'}


def test_read_orbax(params, tmp_path):
  tree = {'target': params, 'state': {'step': np.int32(3), 'param_states': {'v': np.ones(3)}}}
  ocp.PyTreeCheckpointer().save(str(tmp_path / 'checkpoint_3' / 'state'), tree)
  assert checkpoints.checkpoint_format(str(tmp_path / 'checkpoint_3')) == 'orbax'
  _assert_same_logits(checkpoints.load_params(str(tmp_path / 'checkpoint_3'), CONFIG), params)


@pytest.mark.parametrize('relative', ['checkpoint_3', 'checkpoint_3/', './checkpoint_3/state',
                                      'sub/../checkpoint_3'])
def test_read_orbax_from_a_relative_path(params, tmp_path, monkeypatch, relative):
  ocp.PyTreeCheckpointer().save(str(tmp_path / 'checkpoint_3' / 'state'), {'target': params})
  (tmp_path / 'sub').mkdir()
  monkeypatch.chdir(tmp_path)
  assert checkpoints.checkpoint_format(relative) == 'orbax'
  _assert_same_logits(checkpoints.load_params(relative, CONFIG), params)


# --- Hugging Face ----------------------------------------------------------


def _hf_tensors(params):
  """T5ForConditionalGeneration tensors, names written out independently."""
  p = _flat(params)
  t = lambda name: np.ascontiguousarray(p[name].T)
  relpos = 'block.0.layer.0.SelfAttention.relative_attention_bias.weight'
  tensors = {
      'shared.weight': p['token_embedder/embedding'],
      'encoder.embed_tokens.weight': p['token_embedder/embedding'],  # Tied copies.
      'decoder.embed_tokens.weight': p['token_embedder/embedding'],
      f'encoder.{relpos}': t('encoder/relpos_bias/rel_embedding'),
      f'decoder.{relpos}': t('decoder/relpos_bias/rel_embedding'),
      'encoder.final_layer_norm.weight': p['encoder/encoder_norm/scale'],
      'decoder.final_layer_norm.weight': p['decoder/decoder_norm/scale'],
      'lm_head.weight': t('decoder/logits_dense/kernel'),
  }
  attention = (('q', 'query'), ('k', 'key'), ('v', 'value'), ('o', 'out'))
  for i in range(CONFIG.num_encoder_layers):
    hf, ours = f'encoder.block.{i}.layer', f'encoder/layers_{i}'
    for a, b in attention:
      tensors[f'{hf}.0.SelfAttention.{a}.weight'] = t(f'{ours}/attention/{b}/kernel')
    tensors[f'{hf}.0.layer_norm.weight'] = p[f'{ours}/pre_attention_layer_norm/scale']
    for w in ('wi_0', 'wi_1', 'wo'):
      tensors[f'{hf}.1.DenseReluDense.{w}.weight'] = t(f'{ours}/mlp/{w}/kernel')
    tensors[f'{hf}.1.layer_norm.weight'] = p[f'{ours}/pre_mlp_layer_norm/scale']
  for i in range(CONFIG.num_decoder_layers):
    hf, ours = f'decoder.block.{i}.layer', f'decoder/layers_{i}'
    for a, b in attention:
      tensors[f'{hf}.0.SelfAttention.{a}.weight'] = t(f'{ours}/self_attention/{b}/kernel')
      tensors[f'{hf}.1.EncDecAttention.{a}.weight'] = t(
          f'{ours}/encoder_decoder_attention/{b}/kernel')
    tensors[f'{hf}.0.layer_norm.weight'] = p[f'{ours}/pre_self_attention_layer_norm/scale']
    tensors[f'{hf}.1.layer_norm.weight'] = p[f'{ours}/pre_cross_attention_layer_norm/scale']
    for w in ('wi_0', 'wi_1', 'wo'):
      tensors[f'{hf}.2.DenseReluDense.{w}.weight'] = t(f'{ours}/mlp/{w}/kernel')
    tensors[f'{hf}.2.layer_norm.weight'] = p[f'{ours}/pre_mlp_layer_norm/scale']
  return tensors


def _hf_single(directory, tensors):
  os.makedirs(directory, exist_ok=True)
  safetensors.numpy.save_file(tensors, os.path.join(directory, 'model.safetensors'))
  return directory


def _hf_sharded(directory, tensors):
  os.makedirs(directory, exist_ok=True)
  names = sorted(tensors)
  weight_map = {}
  for k, part in enumerate((names[::2], names[1::2])):
    file = f'model-{k + 1:05d}-of-00002.safetensors'
    safetensors.numpy.save_file({n: tensors[n] for n in part}, os.path.join(directory, file))
    weight_map.update(dict.fromkeys(part, file))
  with open(os.path.join(directory, 'model.safetensors.index.json'), 'w') as f:
    json.dump({'metadata': {}, 'weight_map': weight_map}, f)
  return directory


@pytest.mark.parametrize('write', [_hf_single, _hf_sharded])
def test_read_hf(params, tmp_path, write):
  directory = write(str(tmp_path / 'hf'), _hf_tensors(params))
  assert checkpoints.checkpoint_format(directory) == 'hf'
  _assert_same_logits(checkpoints.load_params(directory, CONFIG), params)


def test_write_hf_round_trip(params, tmp_path):
  directory = str(tmp_path / 'hf')
  checkpoints.write_hf(directory, params, CONFIG)
  _assert_same_logits(checkpoints.load_params(directory, CONFIG), params)
  _assert_same_logits(checkpoints.read_hf(os.path.join(directory, 'model.safetensors')), params)
  with open(os.path.join(directory, 'config.json')) as f:
    assert json.load(f) == checkpoints.hf_config(CONFIG)


def test_transformers_round_trip(params, tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  checkpoints.write_hf(str(tmp_path), params, CONFIG)
  model = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
  assert model.lm_head.weight.data_ptr() != model.shared.weight.data_ptr()
  rng = np.random.default_rng(0)  # The inputs of _logits.
  inputs = rng.integers(1, CONFIG.vocab_size, (BATCH, ENCODER_LEN))
  targets = rng.integers(1, CONFIG.vocab_size, (BATCH, DECODER_LEN))
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(inputs),
                   decoder_input_ids=torch.from_numpy(targets)).logits.numpy()
  # PyTorch against XLA: measured 8.6e-6 apart at a largest logit of 3.9 (19 ulps of it).
  tolerances.assert_close(theirs, _logits(params), ulps=256)
  # And what transformers itself writes reads back.
  model.save_pretrained(str(tmp_path / 'saved'))
  _assert_same_logits(checkpoints.load_params(str(tmp_path / 'saved'), CONFIG), params)


# --- Errors ----------------------------------------------------------------


def test_missing_checkpoint(tmp_path):
  with pytest.raises(FileNotFoundError, match='no checkpoint at .*nowhere'):
    checkpoints.load_params(str(tmp_path / 'nowhere'), CONFIG)
  (tmp_path / 'other').mkdir()
  (tmp_path / 'other' / 'notes.txt').write_text('hi')
  with pytest.raises(FileNotFoundError, match='no T5X `checkpoint` file.*notes.txt'):
    checkpoints.load_params(str(tmp_path / 'other'), CONFIG)
  with pytest.raises(FileNotFoundError, match='no Hugging Face checkpoint file'):
    checkpoints.load_params(str(tmp_path / 'model.safetensors'), CONFIG)


@pytest.mark.parametrize('config, message', [
    (dataclasses.replace(CONFIG, vocab_size=120), 'vocab size mismatch: token_embedder/embedding '
     r'\(100, 64\) has vocab 100, config.vocab_size is 120'),
    (dataclasses.replace(CONFIG, mlp_dim=96), r'shape mismatch for encoder/layers_0/mlp/wi_0/'
     r'kernel: expected \(64, 96\) \(from the config\), found \(64, 128\)'),
    (dataclasses.replace(CONFIG, num_decoder_layers=3),
     'missing array decoder/layers_2/mlp/wo/kernel'),
    (dataclasses.replace(CONFIG, num_encoder_layers=1), 'unexpected array encoder/layers_1/mlp/wo'),
])
def test_config_mismatch(params, tmp_path, config, message):
  directory = str(tmp_path / 't5x')
  checkpoints.write_t5x(directory, params)
  with pytest.raises(ValueError, match=message):
    checkpoints.load_params(directory, config)


def test_t5x_missing_and_unexpected_arrays(params, tmp_path):
  extra = {'encoder/extra/kernel': np.ones(3, np.float32)}
  directory = _t5x_by_hand(str(tmp_path / 'ckpt'), params, drop=[WO], extra=extra)
  with pytest.raises(ValueError) as error:
    checkpoints.load_params(directory, CONFIG)
  assert f'missing array {WO}, expected shape (128, 64)' in str(error.value)
  assert 'unexpected array encoder/extra/kernel (3,)' in str(error.value)


def _corrupt(file, how):
  with open(file, 'rb') as f:
    data = bytearray(f.read())
  if how == 'truncate':
    data = data[:len(data) // 2]
  else:
    data[len(data) // 2] ^= 0xFF
  with open(file, 'wb') as f:
    f.write(bytes(data))


def test_t5x_damaged_msgpack(params, tmp_path):
  directory = _t5x_by_hand(str(tmp_path / 'ckpt'), params)
  _corrupt(os.path.join(directory, 'checkpoint'), 'truncate')
  with pytest.raises(ValueError, match='checkpoint is corrupted or truncated'):
    checkpoints.load_params(directory, CONFIG)


@pytest.mark.parametrize('damage, message', [
    ('truncate', 'reading truncated'),
    ('flip', 'inflate'),
    ('remove_chunk', 'is missing'),
    ('remove_array', 'does not exist'),
])
def test_t5x_damaged_zarr(params, tmp_path, damage, message):
  directory = _t5x_by_hand(str(tmp_path / 'ckpt'), params)
  array = os.path.join(directory, 'target.' + WO.replace('/', '.'))
  if damage == 'remove_chunk':
    os.remove(os.path.join(array, '0.0'))
  elif damage == 'remove_array':
    os.remove(os.path.join(array, '.zarray'))
  else:
    _corrupt(os.path.join(array, '0.0'), damage)
  with pytest.raises(ValueError, match=f'T5X array {WO} in .*{message}'):
    checkpoints.load_params(directory, CONFIG)


def test_t5x_inconsistent_shape(params, tmp_path):
  directory = _t5x_by_hand(str(tmp_path / 'ckpt'), params)
  array = os.path.join(directory, 'target.' + WO.replace('/', '.'))
  ts.open({'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': array}, 'dtype': 'float32',
           'metadata': {'compressor': {'id': 'gzip'}, 'shape': [3, 64]}},
          create=True, delete_existing=True).result().write(np.zeros((3, 64), np.float32)).result()
  with pytest.raises(ValueError, match=rf'T5X array {WO}: the zarr array has shape \(3, 64\) '
                     r'but the msgpack file records \(128, 64\)'):
    checkpoints.load_params(directory, CONFIG)


def test_hf_missing_unexpected_and_mismatched(params, tmp_path):
  tensors = _hf_tensors(params)
  del tensors[HF_WO]
  tensors['decoder.block.0.layer.2.DenseReluDense.wi.weight'] = np.ones((2, 2), np.float32)
  with pytest.raises(ValueError) as error:
    checkpoints.load_params(_hf_single(str(tmp_path / 'a'), tensors), CONFIG)
  assert f'missing array {HF_WO} (our {WO})' in str(error.value)
  assert 'unexpected array decoder.block.0.layer.2.DenseReluDense.wi.weight' in str(error.value)

  tensors = _hf_tensors(params)
  tensors[HF_WO] = tensors[HF_WO][:, :100]
  with pytest.raises(ValueError, match=rf'shape mismatch for {WO} \({HF_WO}\): expected '
                     r'\(128, 64\) \(from the config\), found \(100, 64\)'):
    checkpoints.load_params(_hf_single(str(tmp_path / 'b'), tensors), CONFIG)


def test_hf_damaged_files(params, tmp_path):
  directory = _hf_sharded(str(tmp_path / 'hf'), _hf_tensors(params))
  os.remove(os.path.join(directory, 'model-00002-of-00002.safetensors'))
  with pytest.raises(FileNotFoundError, match='no safetensors file .*model-00002-of-00002'):
    checkpoints.load_params(directory, CONFIG)

  directory = _hf_single(str(tmp_path / 'single'), _hf_tensors(params))
  file = os.path.join(directory, 'model.safetensors')
  _corrupt(file, 'truncate')
  with pytest.raises(ValueError, match='model.safetensors is corrupted or truncated.*arrays past '
                     r'the end: [\w.]+weight, '):
    checkpoints.load_params(directory, CONFIG)
  with open(file, 'wb') as f:
    f.write(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": nonsense}')
  with pytest.raises(ValueError, match='model.safetensors is corrupted or truncated'):
    checkpoints.load_params(directory, CONFIG)


@pytest.mark.parametrize('changes, message', [
    ({'feed_forward_proj': 'gated-relu'}, "feed_forward_proj is 'gated-relu', the config needs "
     "'gated-gelu'"),
    ({'tie_word_embeddings': True}, 'scale_decoder_outputs is True, the config needs False'),
    ({'relative_attention_max_distance': 64}, 'relative_attention_max_distance is 64'),
    # As transformers 5 saves T5 1.1: always "tied", outputs not scaled.
    ({'tie_word_embeddings': True, 'scale_decoder_outputs': False}, None),
])
def test_hf_config_json(params, tmp_path, changes, message):
  directory = str(tmp_path / 'hf')
  checkpoints.write_hf(directory, params, CONFIG)
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump({**checkpoints.hf_config(CONFIG), **changes}, f)
  if message is None:
    checkpoints.load_params(directory, CONFIG)
  else:
    with pytest.raises(ValueError, match=f'config.json describes another model: {message}'):
      checkpoints.load_params(directory, CONFIG)


def test_t5model_load_reads_each_format_onto_the_device(params, tmp_path):
  directory = str(tmp_path / 'checkpoint_1')
  checkpoints.write_t5x(directory, params)
  model = models.T5Model.load(directory, CONFIG, dtype='bfloat16')
  assert model.config == CONFIG
  loaded = _flat(model.params)
  assert all(isinstance(x, jax.Array) and x.dtype == jnp.bfloat16 for x in loaded.values())
  np.testing.assert_array_equal(np.asarray(loaded[WO], np.float32),
                                np.asarray(jnp.asarray(_flat(params)[WO], jnp.bfloat16),
                                           np.float32))
  with pytest.raises(ValueError, match='vocab'):
    models.T5Model.load(directory, config_lib.t5_1_1('tiny', vocab_size=101))


# --- The vocabulary record -----------------------------------------------------


def test_write_t5x_records_the_vocabulary_and_check_vocabulary_compares_it(
    params, tmp_path, other_vocabulary):
  path = str(tmp_path / 'ckpt')
  checkpoints.write_t5x(path, params, vocabulary=data.VOCAB_PATH)
  record = json.loads((tmp_path / 'ckpt' / checkpoints.SIDECAR).read_text())
  assert record == {'sha256': text.fingerprint(data.VOCAB_PATH), 'vocab_size': 8192,
                    'file': 'spm_8k.model'}
  _assert_same_logits(checkpoints.load_params(path, CONFIG), params)
  for where in (path, path + '/checkpoint'):
    assert checkpoints.check_vocabulary(where, data.VOCAB_PATH)['sha256'] == record['sha256']
  with pytest.raises(ValueError) as error:
    checkpoints.check_vocabulary(path, other_vocabulary, override='--allow_vocabulary_mismatch')
  for name in (other_vocabulary, path, 'spm_8k.model', record['sha256'],
               text.fingerprint(other_vocabulary), '--allow_vocabulary_mismatch'):
    assert name in str(error.value)
  with pytest.warns(UserWarning, match='vocabulary mismatch'):
    assert checkpoints.check_vocabulary(path, other_vocabulary, allow_mismatch=True)
  # Without a record (T5X's own checkpoints, Hugging Face's) there is nothing to check.
  checkpoints.write_t5x(str(tmp_path / 'plain'), params)
  assert not (tmp_path / 'plain' / checkpoints.SIDECAR).exists()
  assert checkpoints.check_vocabulary(str(tmp_path / 'plain'), other_vocabulary) is None


def test_write_t5x_checks_the_vocabulary_before_writing(params, tmp_path):
  with pytest.raises(FileNotFoundError, match='/nonexistent/spm.model'):
    checkpoints.write_t5x(str(tmp_path / 'ckpt'), params, vocabulary='/nonexistent/spm.model')
  assert not (tmp_path / 'ckpt').exists()


def test_an_orbax_step_takes_its_runs_record_and_a_damaged_record_is_named(tmp_path):
  step = tmp_path / 'checkpoints' / '1200'
  step.mkdir(parents=True)
  checkpoints.write_vocabulary(tmp_path / 'checkpoints', data.VOCAB_PATH)
  assert checkpoints.read_vocabulary(step)['path'] == str(tmp_path / 'checkpoints' /
                                                         checkpoints.SIDECAR)
  (step / checkpoints.SIDECAR).write_text('{"sha256": 3}')
  with pytest.raises(ValueError, match=f'{step / checkpoints.SIDECAR} needs string "sha256"'):
    checkpoints.read_vocabulary(step)
  (step / checkpoints.SIDECAR).write_text('{')
  with pytest.raises(ValueError, match='is not JSON'):
    checkpoints.check_vocabulary(step, data.VOCAB_PATH)


def test_check_vocabulary_pair(tmp_path, other_vocabulary):
  for name, vocabulary in (('target', data.VOCAB_PATH), ('draft', data.VOCAB_PATH),
                           ('other', other_vocabulary)):
    checkpoints.write_vocabulary(tmp_path / name, vocabulary)
  (tmp_path / 'unrecorded').mkdir()
  checkpoints.check_vocabulary_pair(tmp_path / 'target', tmp_path / 'draft')
  checkpoints.check_vocabulary_pair(tmp_path / 'target', tmp_path / 'unrecorded')
  with pytest.raises(ValueError) as error:
    checkpoints.check_vocabulary_pair(tmp_path / 'target', tmp_path / 'other')
  for name in (tmp_path / 'target', tmp_path / 'other', 'spm_8k.model', 'other.model',
               text.fingerprint(other_vocabulary), text.fingerprint(data.VOCAB_PATH)):
    assert str(name) in str(error.value)
  with pytest.warns(UserWarning, match='vocabulary mismatch'):
    checkpoints.check_vocabulary_pair(tmp_path / 'target', tmp_path / 'other', allow_mismatch=True)


@pytest.mark.parametrize('name', ['target', 'draft_large', 'draft_small'])
def test_the_bundled_models_record_the_bundled_vocabulary(name, other_vocabulary):
  path = data.DATA_DIR / 'models' / name
  assert checkpoints.check_vocabulary(path, data.VOCAB_PATH)['file'] == 'spm_8k.model'
  with pytest.raises(ValueError, match='vocabulary mismatch'):
    checkpoints.check_vocabulary(path, other_vocabulary)
