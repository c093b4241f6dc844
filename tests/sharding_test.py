"""Tests of spec_decode.models.sharding: rules and sizes here, 8-device decoding in a subprocess.

The 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8) exist only
in tests/sharding_subprocess.py, run once (~1-2 min on 2 cores): the flag must be
set before jax starts and must not reach the other tests.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode.cli import gin_utils
from spec_decode.cli import infer
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.models import protocol
from spec_decode.models import drafts
from spec_decode.models import sharding
from spec_decode.t5 import t5_1_1

SCRIPT = pathlib.Path(__file__).with_name('sharding_subprocess.py')
MESHES = ('1x8', '2x4')


@pytest.fixture(scope='module')
def summary(tmp_path_factory):
  """The JSON summary of tests/sharding_subprocess.py."""
  result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path_factory.mktemp('sharding'))],
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# Over 8 devices (the subprocess).


@pytest.mark.parametrize('mesh', MESHES)
def test_sharded_decoding_equals_one_device(summary, mesh):
  """Greedy and sampled (same keys), speculative and baseline: token for token."""
  identical = summary['meshes'][mesh]['identical']
  assert {'greedy', 'sampled', 'baseline_greedy', 'baseline_sampled'} <= set(identical)
  assert all(identical.values()), identical


def test_reference_is_exact_and_drafts_are_partly_accepted(summary):
  assert summary['greedy_speculative_equals_baseline']
  histogram = summary['sampled_accept_histogram']
  assert histogram[0] > 0 and sum(histogram[1:]) > 0  # rejections and rewinds both happen


def test_one_key_and_outputs_split_by_row(summary):
  result = summary['meshes']['2x4']
  assert result['identical']['one_key_sampled']
  # Block verification with an adaptive draft length, split by row too.
  assert result['identical']['block_adaptive_sampled']
  assert result['output_specs'] == ["P('data', None)", "P('data',)"]


@pytest.mark.parametrize('mesh', MESHES)
def test_parameters_lie_on_their_shards(summary, mesh):
  result = summary['meshes'][mesh]
  assert result['param_specs'] == {'embedding': "P('model', None)", 'wo': "P('model', None)",
                                   'query': "P(None, 'model')"}
  assert result['device0_param_bytes'] == result['per_device_param_bytes']


@pytest.mark.parametrize('mesh', ['1x8', '2x4'])
def test_verify_step_all_reduces_and_gathers_no_weight(summary, mesh):
  """One target call over gamma + 1 positions: partial sums reduced, weights stay put."""
  step = summary['meshes'][mesh]['verify_step']
  assert step['counts']['all-reduce'] + step['counts']['reduce-scatter'] > 0
  assert step['counts']['all-gather'] == 0
  assert step['weight_all_gathers'] == []


def test_whole_loop_gathers_no_weight(summary):
  """The compiled speculative loop (draft, verify, sampling) on the (1, 8) mesh."""
  loop = summary['meshes']['1x8']['loop']
  assert loop['counts']['all-reduce'] > 0
  assert loop['weight_all_gathers'] == []


def test_llama_pair_over_a_mesh_equals_one_device(summary):
  """Greedy and sampled, ragged prompts; key/value projections split by head over `model`."""
  assert summary['llama']['identical'] == {'greedy': True, 'sampled': True}
  assert summary['llama']['k_proj_spec'] == "P(None, 'model')"


def test_t5x_checkpoint_loads_onto_its_shards(summary):
  assert summary['t5x_load']['values_equal'] and summary['t5x_load']['shardings_equal']


def test_infer_with_model_parallel_equals_one_device(summary):
  assert summary['infer']['identical'] and summary['infer']['records'] == 12


# ---------------------------------------------------------------------------
# Rules and sizes (one device).


def test_xxl_per_device_param_bytes_by_hand():
  """bfloat16 XXL over model_parallel 8: every matrix split 8 ways, norms replicated."""
  e, h, dh, f, v, layers = 4096, 64, 64, 10240, 32128, 24
  split = (layers * (4 * e * h * dh + 3 * e * f)  # encoder: attention, gated MLP
           + layers * (8 * e * h * dh + 3 * e * f)  # decoder: self + cross attention, MLP
           + 2 * v * e + 2 * h * 32)  # embedding, logits, relative position biases
  replicated = layers * 2 * e + layers * 3 * e + 2 * e  # norms
  config = t5_1_1('xxl', param_dtype='bfloat16')
  for data, model in ((1, 8), (2, 8), (2, 4)):
    mesh_shape = {'data': data, 'model': model}
    expected = 2 * (split // model + replicated)
    assert sharding.per_device_param_bytes(config, mesh_shape, sharding.STANDARD_RULES) == expected
  assert sharding.per_device_param_bytes(
      config, {'data': 1, 'model': 8}, sharding.STANDARD_RULES) == 2_784_707_584


def test_replicated_rules_hold_every_parameter():
  config = t5_1_1('small')
  total = sum(4 * math.prod(shape) for shape in checkpoints.expected_shapes(config).values())
  assert sharding.per_device_param_bytes(
      config, {'data': 8, 'model': 1}, sharding.DATA_PARALLEL_RULES) == total


def test_every_parameter_has_logical_axes_of_its_rank():
  shapes = checkpoints.expected_shapes(t5_1_1('tiny'))
  for name, shape in shapes.items():
    assert len(sharding.param_axes(name)) == len(shape), name
  assert sharding.param_axes('decoder/layers_1/encoder_decoder_attention/out/kernel') == (
      'joined_kv', 'embed')
  assert sharding.param_axes('encoder/relpos_bias/rel_embedding') == ('heads', 'relpos_buckets')
  with pytest.raises(ValueError, match='no logical axes'):
    sharding.param_axes('decoder/adapter/kernel')


def test_indivisible_dimension_names_the_array():
  """T5 1.1 Small has 6 heads: it cannot split 8 ways (replicate it instead)."""
  with pytest.raises(ValueError, match=r'rel_embedding \(6, 32\).*heads -> model.*8 ways'):
    sharding.per_device_param_bytes(t5_1_1('small'), {'data': 1, 'model': 8},
                                    sharding.STANDARD_RULES)


def test_bad_rules_and_meshes_are_errors():
  with pytest.raises(ValueError, match='bad rule'):
    sharding.check_rules([('heads', 'tensor')])
  with pytest.raises(ValueError, match='bad rule'):
    sharding.check_rules([('head', 'model')])
  for model_parallel in (0, jax.device_count() + 1):
    with pytest.raises(ValueError, match='model_parallel'):
      sharding.make_mesh(model_parallel)
  assert dict(sharding.make_mesh(1).shape) == {'data': jax.device_count(), 'model': 1}


def test_cache_shardings_by_rules():
  config = t5_1_1('nano', vocab_size=64)
  model = models.T5Model.random(config, jax.random.key(0))
  cache = jax.eval_shape(lambda m: m.start(protocol.Batch(np.ones((2, 5), np.int32)), 9)[1],
                         model)
  mesh = sharding.make_mesh(1, jax.devices()[:1])
  specs = lambda rules: jax.tree.map(lambda s: tuple(s.spec),
                                     sharding.cache_shardings(cache, mesh, rules))
  standard = specs(sharding.STANDARD_RULES)
  assert standard.index == ('data',)
  assert standard.layers.encoder_mask == ('data', None)
  assert standard.layers.self_attention[0].key == ('data', 'model', None, None)  # [B, H, T, Dh]
  assert standard.layers.cross_attention[0].value == ('data', 'model', None, None)
  assert specs(sharding.DATA_PARALLEL_RULES).layers.self_attention[0].key == (
      'data', None, None, None)


def test_draft_sampling_reaches_the_sharded_loop():
  """On a 1-device mesh the sharded loop equals models.speculative_generate, with
  q's own knobs; those knobs change the output, so dropping them would show."""
  config = t5_1_1('nano', vocab_size=64)
  target = models.T5Model.random(config, jax.random.key(0))
  draft = models.T5Model.random(config, jax.random.key(1))
  mesh = sharding.make_mesh(1, jax.devices()[:1])
  shard = lambda m: sharding.shard_model(m, mesh, sharding.STANDARD_RULES)
  inputs = np.random.default_rng(0).integers(2, 64, (2, 5)).astype(np.int32)
  kwargs = dict(gamma=2, max_decode_len=8, sampling=sampling_lib.SamplingParams.create(1.0))
  draft_sampling = sampling_lib.SamplingParams.create(0.3, top_k=2)
  keys = jax.random.split(jax.random.key(2), 2)
  sharded = models.speculative_generate(shard(target), shard(draft), inputs, keys,
                                        draft_sampling=draft_sampling, **kwargs)
  expected = models.speculative_generate(target, draft, inputs, keys,
                                         draft_sampling=draft_sampling, **kwargs)
  without = models.speculative_generate(target, draft, inputs, keys, **kwargs)
  np.testing.assert_array_equal(sharded.tokens, expected.tokens)
  np.testing.assert_array_equal(sharded.accept_histogram, expected.accept_histogram)
  assert not np.array_equal(expected.accept_histogram, without.accept_histogram)


def test_a_sharded_target_takes_drafts_without_a_mesh():
  """Tables, prompt lookup and an unsharded draft model are replicated on the target's mesh."""
  config = t5_1_1('nano', vocab_size=64)
  target = models.T5Model.random(config, jax.random.key(0))
  mesh = sharding.make_mesh(1, jax.devices()[:1])
  sharded = sharding.shard_model(target, mesh, sharding.STANDARD_RULES)
  inputs = np.random.default_rng(0).integers(2, 64, (2, 5)).astype(np.int32)
  baseline = models.generate(target, inputs, 0, max_decode_len=8)
  stream = np.asarray(baseline.tokens).ravel()
  for draft in (drafts.TableDraft.estimate(stream, 64, order=2, top_k=4),
                drafts.PromptLookupDraft(64), models.T5Model.random(config, jax.random.key(1))):
    out = models.speculative_generate(sharded, draft, inputs, 1, gamma=2, max_decode_len=8)
    np.testing.assert_array_equal(out.tokens, baseline.tokens)


@pytest.mark.parametrize('kind', ['t5x', 'hf'])
def test_load_params_with_shardings(tmp_path, kind):
  config = t5_1_1('nano', vocab_size=64)
  params = models.T5Model.random(config, jax.random.key(0)).params
  path = str(tmp_path / kind)
  if kind == 't5x':
    checkpoints.write_t5x(path, params)
  else:
    checkpoints.write_hf(path, params, config)
  mesh = sharding.make_mesh(1, jax.devices()[:1])
  model = sharding.load_model(path, config, mesh, sharding.STANDARD_RULES, dtype='bfloat16')
  shardings = sharding.param_shardings(params, mesh, sharding.STANDARD_RULES)
  for loaded, expected, placed in zip(*map(jax.tree.leaves, (model.params, params, shardings))):
    assert isinstance(loaded, jax.Array) and loaded.sharding == placed
    np.testing.assert_array_equal(np.asarray(loaded), np.asarray(expected, loaded.dtype))


@pytest.mark.parametrize('run, model_parallel', [
    ('t5_1_1_xxl_small_mp8', 8), ('t5_1_1_xxl_small_mp4', 4), ('t5_1_1_xxl_small_mp1', 1),
    ('tiny_cpu', 4)])
def test_gin_run_files_bind_model_parallel(run, model_parallel, monkeypatch):
  # gin's system-path reader takes `include 'runs/...'` for a Python package and
  # fails on the namespace package a ./runs/ folder (training workdirs) makes.
  monkeypatch.setattr(sys, 'path', [p for p in sys.path if not os.path.isdir(
      os.path.join(p or '.', 'runs'))])
  gin.clear_config()
  gin.add_config_file_search_path(str(gin_utils.GIN_DIR))
  bindings = ["TARGET_CHECKPOINT = '/t'", "DRAFT_CHECKPOINT = '/d'"] if run == 'tiny_cpu' else []
  try:
    gin_utils.parse_gin([f'runs/sharded/{run}.gin'], bindings, infer.infer)
    assert str(gin.query_parameter('infer.infer.model_parallel')) == '%MODEL_PARALLEL'
    assert gin.query_parameter('MODEL_PARALLEL/macro.value') == model_parallel
  finally:
    gin.clear_config()
