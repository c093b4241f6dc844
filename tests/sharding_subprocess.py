"""The checks of tests/sharding_test.py that need 8 devices, in their own process.

XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before jax
starts, so tests/sharding_test.py runs this script once and reads the JSON
summary it prints as its last line:

  python tests/sharding_subprocess.py /tmp/workdir  # -> {"meshes": {...}, ...}

For each mesh (data, model) in (1, 8) and (2, 4) (rows and heads both split;
a pure data-parallel (8, 1) mesh added a minute to CI and nothing (2, 4) does not
check), a tiny random target
(STANDARD_RULES) and draft (DATA_PARALLEL_RULES) decode, speculatively and
autoregressively, greedily and by sampling with the same per-row keys, and the
tokens are compared with the one-device ones; the compiled HLO of the verify
step (and of the whole loop on (1, 8)) is searched for collectives. A Llama
pair decodes over (2, 4) as on one device. Then a T5X checkpoint loads onto
its shards and infer.infer runs with model_parallel 4.
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '')
                           + ' --xla_force_host_platform_device_count=8')
os.environ['JAX_PLATFORMS'] = 'cpu'

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import pathlib
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checkpoints
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.cli import infer
from spec_decode.llama import LlamaConfig
from spec_decode.models import LlamaModel
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.models import sharding
from spec_decode.options import Knobs, LoopOptions
from spec_decode.t5.config import T5Config, t5_1_1
from spec_decode.t5.network import Transformer

# Widths all distinct (E 40, H * Dh 64, F 96, V 256) so that a gathered weight
# is recognisable by its shape; heads, H * Dh, F and V divide by 8.
TARGET = T5Config(vocab_size=256, emb_dim=40, num_heads=8, num_encoder_layers=1,
                  num_decoder_layers=2, head_dim=8, mlp_dim=96)
DRAFT = t5_1_1('nano', vocab_size=256)  # 2 heads: its parameters are replicated.
MESHES = ((1, 8), (2, 4))
LLAMA = LlamaConfig(vocab_size=256, hidden_size=40, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=4, head_dim=8)
LLAMA_DRAFT = LlamaConfig(vocab_size=256, hidden_size=24, intermediate_size=48,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=8)
BATCH, INPUT_LEN, MAX_DECODE_LEN, GAMMA = 8, 12, 16, 3
COLLECTIVES = ('all-reduce', 'reduce-scatter', 'all-gather', 'all-to-all', 'collective-permute')


def _inputs() -> np.ndarray:
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, TARGET.vocab_size, (BATCH, INPUT_LEN)).astype(np.int32)
  for b, length in enumerate(rng.integers(4, INPUT_LEN + 1, BATCH)):
    tokens[b, length:] = 0  # some padding, different per row
  return tokens


TOKENS = _inputs()  # [B, S]
KEYS = jax.random.split(jax.random.key(3), BATCH)  # one stream per row
ONE_KEY = jax.random.key(4)
KNOBS = {'greedy': sampling_lib.SamplingParams.create(),
         'sampled': sampling_lib.SamplingParams.create(temperature=1.0)}


def _outputs(out) -> dict:
  return {'tokens': np.asarray(out.tokens), 'lengths': np.asarray(out.lengths)}


def _same(a: dict, b: dict) -> bool:
  return all(np.array_equal(a[k], b[k]) for k in a)


def _collectives(hlo: str, weight_shapes: set[tuple[int, ...]]) -> dict:
  """Counts of each collective in compiled HLO text, and all-gathers of a whole weight."""
  counts = {name: len(re.findall(rf'\s{name}(?:-start)?\(', hlo)) for name in COLLECTIVES}
  gathered = []
  for line in hlo.splitlines():
    if re.search(r'\sall-gather(?:-start)?\(', line):
      result = line.split('all-gather')[0]
      shapes = {tuple(int(d) for d in dims.split(',')) for dims in re.findall(r'\[([\d,]+)\]',
                                                                            result)}
      gathered += [list(s) for s in shapes & weight_shapes]
  return {'counts': counts, 'weight_all_gathers': gathered}


def _verify_step_hlo(target: sharding.ShardedT5Model) -> str:
  """Compiled HLO of one target call over K = gamma + 1 positions, as in the loop."""
  capacity = MAX_DECODE_LEN + GAMMA + 1
  cache = jax.eval_shape(lambda m, x: m.start(protocol.Batch(x), capacity)[1], target, TOKENS)
  cache_shardings = sharding.cache_shardings(cache, target.mesh, target.rules)

  def verify(model, step_tokens, cache):
    return Transformer(model.config).apply({'params': model.params}, step_tokens, cache,
                                           method=Transformer.decode)

  step_tokens = jax.ShapeDtypeStruct((BATCH, GAMMA + 1), jnp.int32)
  jitted = jax.jit(verify, in_shardings=(
      target.shardings(), sharding.batch_sharding(target.mesh, target.rules, step_tokens.shape),
      cache_shardings), out_shardings=(None, cache_shardings))
  return jitted.lower(target, step_tokens, cache).compile().as_text()


def _decode_all(generate, speculative, target, draft) -> dict:
  """Speculative and baseline tokens, greedy and sampled: one compile each (knobs are traced)."""
  outputs = {}
  for name, knobs in KNOBS.items():
    outputs[name] = _outputs(speculative(target, draft, TOKENS, KEYS, knobs))
    outputs[f'baseline_{name}'] = _outputs(generate(target, TOKENS, KEYS, sampling=knobs,
                                                    max_decode_len=MAX_DECODE_LEN))
  return outputs


def _speculative(generate_fn, verification='token', confidence_threshold=None):
  """(target, draft, tokens, rng, sampling) -> DecodeOutput of `generate_fn`, sharded or not."""
  return lambda t, d, x, k, s: generate_fn(t, d, x, k, gamma=GAMMA, sampling=s,
                                           max_decode_len=MAX_DECODE_LEN,
                                           verification=verification,
                                           confidence_threshold=confidence_threshold)


def _check_mesh(model_parallel: int, target: models.T5Model, draft: models.T5Model,
                reference: dict) -> dict:
  """Decodes over a (8 / model_parallel, model_parallel) mesh; what differs from `reference`."""
  mesh = sharding.make_mesh(model_parallel)
  target = sharding.shard_model(target, mesh, sharding.STANDARD_RULES)
  draft = sharding.shard_model(draft, mesh, sharding.DATA_PARALLEL_RULES)
  speculative = _speculative(models.speculative_generate)  # the models carry their mesh
  weight_shapes = {tuple(x.shape) for x in jax.tree.leaves(target.params)}
  result = {'mesh_shape': dict(mesh.shape)}
  if model_parallel == 8:  # Inside an outer jit (as infer.py calls it): the loop's HLO too.
    speculative = jax.jit(speculative).lower(target, draft, TOKENS, KEYS,
                                             KNOBS['sampled']).compile()
    result['loop'] = _collectives(speculative.as_text(), weight_shapes)
  outputs = _decode_all(models.generate, speculative, target, draft)
  if model_parallel == 4:  # One key for all rows: replicated, split per row inside.
    out = speculative(target, draft, TOKENS, ONE_KEY, KNOBS['sampled'])
    outputs['one_key_sampled'] = _outputs(out)
    outputs['block_adaptive_sampled'] = _outputs(_speculative(
        models.speculative_generate, 'block', 0.4)(target, draft, TOKENS, KEYS,
                                                   KNOBS['sampled']))
    result['output_specs'] = [str(out.tokens.sharding.spec), str(out.lengths.sharding.spec)]
  if model_parallel > 1:
    result['verify_step'] = _collectives(_verify_step_hlo(target), weight_shapes)
  params = target.params
  result.update(
      identical={name: _same(outputs[name], reference[name]) for name in outputs},
      param_specs={name: str(x.sharding.spec) for name, x in (
          ('embedding', params['token_embedder']['embedding']),
          ('wo', params['decoder']['layers_0']['mlp']['wo']['kernel']),
          ('query', params['decoder']['layers_0']['self_attention']['query']['kernel']))},
      device0_param_bytes=sum(s.data.nbytes for x in jax.tree.leaves(params)
                              for s in x.addressable_shards if s.device == mesh.devices.flat[0]),
      per_device_param_bytes=sharding.per_device_param_bytes(
          TARGET, mesh.shape, sharding.STANDARD_RULES))
  return result


def _check_t5x_load(workdir: pathlib.Path, target: models.T5Model) -> dict:
  """A T5X checkpoint read onto a (2, 4) mesh."""
  mesh = sharding.make_mesh(4)
  loaded = sharding.load_model(str(workdir / 'target'), TARGET, mesh, sharding.STANDARD_RULES)
  expected = sharding.param_shardings(loaded.params, mesh, sharding.STANDARD_RULES)
  return {
      'values_equal': all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
          jax.tree.leaves(loaded.params), jax.tree.leaves(target.params))),
      'shardings_equal': all(a.sharding == b for a, b in zip(
          jax.tree.leaves(loaded.params), jax.tree.leaves(expected))),
  }


def _check_llama() -> dict:
  """A Llama pair (GQA: 8 query, 4 key/value heads) over the (2, 4) mesh against one device.

  Greedy and sampled speculative decoding with ragged prompts; the target's
  heads split 4 ways, the draft replicated.
  """
  mesh = sharding.make_mesh(4)
  target, draft = (LlamaModel.random(config, jax.random.key(seed))
                   for config, seed in ((LLAMA, 0), (LLAMA_DRAFT, 1)))
  prompts, lengths = TOKENS[:, :6], np.array([6, 1, 3, 5, 2, 6, 4, 1], np.int32)
  options = LoopOptions(MAX_DECODE_LEN, gamma=GAMMA, eos_id=-1)
  sharded = (sharding.shard_model(target, mesh, sharding.STANDARD_RULES),
             sharding.shard_model(draft, mesh, sharding.DATA_PARALLEL_RULES))
  batch = protocol.Batch(prompts, lengths, reads=target.reads)
  identical = {}
  for name, knobs in KNOBS.items():
    one = front_ends.run(target, draft, batch, KEYS, options, Knobs.create(knobs))  # one device
    split = front_ends.run(*sharded, batch, KEYS, options, Knobs.create(knobs))  # over the mesh
    identical[name] = _same(_outputs(split), _outputs(one))
  kernel = sharded[0].params['layers_0']['self_attn']['k_proj']['kernel']
  return {'identical': identical, 'k_proj_spec': str(kernel.sharding.spec)}


def main(workdir: pathlib.Path) -> dict:
  start = time.perf_counter()
  assert jax.device_count() == 8, jax.devices()
  target = models.T5Model.random(TARGET, jax.random.key(0))
  draft = models.T5Model.random(DRAFT, jax.random.key(1))
  reference = _decode_all(models.generate, _speculative(models.speculative_generate), target,
                          draft)
  one_key = _speculative(models.speculative_generate)(target, draft, TOKENS, ONE_KEY,
                                                      KNOBS['sampled'])
  reference['one_key_sampled'] = _outputs(one_key)
  reference['block_adaptive_sampled'] = _outputs(_speculative(
      models.speculative_generate, 'block', 0.4)(target, draft, TOKENS, KEYS, KNOBS['sampled']))
  summary = {'greedy_speculative_equals_baseline': _same(reference['greedy'],
                                                         reference['baseline_greedy']),
             'sampled_accept_histogram': np.asarray(one_key.accept_histogram).tolist(),
             'seconds': {'reference': time.perf_counter() - start}, 'meshes': {}}
  for data, model_parallel in MESHES:
    mesh_start = time.perf_counter()
    summary['meshes'][f'{data}x{model_parallel}'] = _check_mesh(model_parallel, target, draft,
                                                                reference)
    summary['seconds'][f'{data}x{model_parallel}'] = time.perf_counter() - mesh_start

  llama_start = time.perf_counter()
  summary['llama'] = _check_llama()
  summary['seconds']['llama'] = time.perf_counter() - llama_start
  load_start = time.perf_counter()
  for name, model in (('target', target), ('draft', draft)):
    checkpoints.write_t5x(str(workdir / name), model.params)
  summary['t5x_load'] = _check_t5x_load(workdir, target)
  records = {mp: _infer(workdir, mp) for mp in (0, 4)}
  summary['infer'] = {'identical': records[0] == records[4], 'records': len(records[4])}
  summary['seconds'].update(load_and_infer=time.perf_counter() - load_start,
                            total=time.perf_counter() - start)
  return summary


class _ByteVocabulary:
  """A stand-in for a seqio.Vocabulary: one id per byte."""

  vocab_size = TARGET.vocab_size

  def encode(self, text: str) -> list[int]:
    return [2 + b % (self.vocab_size - 2) for b in text.encode()]

  def decode(self, ids: list[int]) -> str:
    return ' '.join(map(str, ids))


def _infer(workdir: pathlib.Path, model_parallel: int) -> list[list[int]]:
  """infer.infer's output ids on the checkpoints in workdir, sampled, over a mesh or not."""
  inputs, outputs = workdir / 'inputs.txt', workdir / f'outputs_{model_parallel}.jsonl'
  inputs.write_text('\n'.join(['A man rides a bicycle.', 'Two dogs play.', 'Hello.'] * 4))
  infer.infer(target_config=TARGET, target_checkpoint=str(workdir / 'target'),
              draft_config=DRAFT, draft_checkpoint=str(workdir / 'draft'),
              vocabulary=_ByteVocabulary(), input_file=str(inputs), output_file=str(outputs),
              gamma=GAMMA, temperature=1.0, max_input_len=32, max_decode_len=MAX_DECODE_LEN,
              batch_size=BATCH, model_parallel=model_parallel)
  return [json.loads(line)['output_ids'] for line in outputs.read_text().splitlines()]


if __name__ == '__main__':
  print(json.dumps(main(pathlib.Path(sys.argv[1])), default=str))
