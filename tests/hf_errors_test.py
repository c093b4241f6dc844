"""Damaged Hugging Face checkpoints: errors naming the tensor or file, never garbage weights."""

import json

import jax
import numpy as np
import pytest
import safetensors.numpy

from spec_decode import checkpoints
from spec_decode import models
from spec_decode.checkpoints import hf
from spec_decode.t5 import config as config_lib

CONFIG = config_lib.t5_1_1('tiny', vocab_size=100)
HF_WO = 'decoder.block.1.layer.2.DenseReluDense.wo.weight'


@pytest.fixture(scope='module')
def tensors(tmp_path_factory):
  """A tiny model's Hugging Face tensors, written by write_hf and read back."""
  directory = tmp_path_factory.mktemp('hf')
  params = models.T5Model.random(CONFIG, jax.random.key(0)).params
  hf.write_hf(str(directory), params, CONFIG)
  return safetensors.numpy.load_file(str(directory / hf.HF_FILE))


def _write(directory, tensors, config_json=None):
  directory.mkdir()
  safetensors.numpy.save_file(tensors, str(directory / hf.HF_FILE))
  if config_json is not None:
    (directory / 'config.json').write_bytes(config_json)
  return str(directory)


@pytest.mark.parametrize('dtype', [np.int32, np.int64, np.uint8, np.bool_])
def test_integer_or_boolean_tensor_is_refused(tensors, tmp_path, dtype):
  tensors = dict(tensors, **{HF_WO: tensors[HF_WO].astype(dtype)})
  path = _write(tmp_path / 'hf', tensors)
  with pytest.raises(ValueError, match=f'tensor {HF_WO} has dtype {np.dtype(dtype).name}: T5 '
                                       'weights are floating point'):
    checkpoints.load_params(path, CONFIG)


@pytest.mark.parametrize('config_json, message', [
    (b'{"feed_forward_proj": "gated-gelu",', r'config.json is not valid JSON: Expecting '
                                             r'property name enclosed in double quotes at line 1'),
    (b'["gated-gelu"]', r'config.json must hold a JSON object \(a Hugging Face config\), got a '
                        r'list'),
    (b'{"d_model": "\xe9"}', r'config.json is not UTF-8 text'),
])
def test_malformed_config_json_names_the_file(tensors, tmp_path, config_json, message):
  path = _write(tmp_path / 'hf', tensors, config_json)
  with pytest.raises(ValueError, match=message):
    checkpoints.load_params(path, CONFIG)


def test_float_tensors_and_a_good_config_load(tensors, tmp_path):
  good = json.dumps(hf.hf_config(CONFIG)).encode()
  params = checkpoints.load_params(_write(tmp_path / 'hf', tensors, good), CONFIG)
  assert params['decoder']['layers_1']['mlp']['wo']['kernel'].dtype == np.float32
