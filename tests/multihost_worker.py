"""One process of tests/multihost_test.py: decodes over a mesh of one or several processes.

  python tests/multihost_worker.py WORKDIR NUM_PROCESSES PROCESS_ID PORT [MODE]

Each process gets 8 / NUM_PROCESSES CPU devices, so every run has one mesh of
8 devices, whatever the process count. With one process this is the
reference run: it first writes into WORKDIR the models as T5X checkpoints,
and those of the command line's test (runs/sharded/tiny_cpu.gin's sizes).
Every run loads them onto their shards (each host reading its slices),
decodes over a (1, 8) mesh, the target split across the hosts:
speculatively, autoregressively and by speculative beam search, greedily and
by sampling, and a decoder-only pair (spec_decode.models.sharding) behind ragged
prompts; process 0 writes the gathered tokens to
WORKDIR/decoded_<NUM_PROCESSES>.json. MODE 'die' makes process 1 exit once
every process has joined, while the others go on decoding.
"""

import os
import sys

WORKDIR, COUNT, INDEX, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
MODE = sys.argv[5] if len(sys.argv) > 5 else 'decode'
os.environ['JAX_PLATFORMS'] = 'cpu'
os.environ['JAX_NUM_CPU_DEVICES'] = str(8 // COUNT)

import json  # pylint: disable=g-import-not-at-top,wrong-import-position
import pathlib

import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode import models
from spec_decode import multihost
from spec_decode import sampling as sampling_lib
from spec_decode.models import decoder_only
from spec_decode.models import front_ends
from spec_decode.models import protocol
from spec_decode.models import sharding
from spec_decode.options import Knobs, LoopOptions
from spec_decode.t5.config import T5Config, t5_1_1
from spec_decode.t5.decoder_only import DecoderOnlyConfig

TARGET = T5Config(vocab_size=256, emb_dim=40, num_heads=8, num_encoder_layers=1,
                  num_decoder_layers=2, head_dim=8, mlp_dim=96)
DRAFT = t5_1_1('nano', vocab_size=256)
LM_TARGET = DecoderOnlyConfig(vocab_size=256, emb_dim=40, num_heads=8, num_layers=2, head_dim=8,
                              mlp_dim=96)
LM_DRAFT = DecoderOnlyConfig(vocab_size=256, emb_dim=16, num_heads=2, num_layers=1, head_dim=8,
                             mlp_dim=32)
BATCH, INPUT_LEN, MAX_DECODE_LEN, GAMMA = 8, 12, 16, 3
KNOBS = {'greedy': sampling_lib.SamplingParams.create,
         'sampled': lambda: sampling_lib.SamplingParams.create(temperature=1.0)}


def _inputs() -> np.ndarray:
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, TARGET.vocab_size, (BATCH, INPUT_LEN)).astype(np.int32)
  for b, length in enumerate(rng.integers(4, INPUT_LEN + 1, BATCH)):
    tokens[b, length:] = 0
  return tokens


def _decode(mesh: jax.sharding.Mesh, workdir: pathlib.Path) -> dict:
  target = sharding.load_model(str(workdir / 'target'), TARGET, mesh, sharding.STANDARD_RULES)
  draft = sharding.load_model(str(workdir / 'draft'), DRAFT, mesh, sharding.DATA_PARALLEL_RULES)
  tokens, keys = _inputs(), np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3),
                                                                             BATCH)))
  rows = lambda x: multihost.global_array(
      lambda r: x[r], x.shape, sharding.batch_sharding(mesh, sharding.STANDARD_RULES, x.shape))
  tokens, keys = rows(tokens), rows(keys)
  outputs = {}
  for name, knobs in KNOBS.items():
    out = models.speculative_generate(target, draft, tokens, keys, gamma=GAMMA,
                                      sampling=knobs(), max_decode_len=MAX_DECODE_LEN)
    outputs[f'speculative_{name}'] = multihost.gather(out.tokens).tolist()
    out = models.generate(target, tokens, keys, sampling=knobs(), max_decode_len=MAX_DECODE_LEN)
    outputs[f'baseline_{name}'] = multihost.gather(out.tokens).tolist()
  out = models.beam_generate(target, tokens, beam_size=2, max_decode_len=MAX_DECODE_LEN,
                             draft=draft, gamma=GAMMA, draft_width=2)
  outputs['speculative_beam'] = multihost.gather(out.tokens).tolist()
  return {**outputs, **_decode_lm(mesh, workdir, rows, keys)}


def _decode_lm(mesh: jax.sharding.Mesh, workdir: pathlib.Path, rows, keys) -> dict:
  """A decoder-only pair over the mesh behind ragged prompts (and on one device, alone)."""
  prompts = _inputs()[:, :6]
  lengths = np.asarray([6, 1, 3, 0, 5, 2, 6, 4], np.int32)
  target = sharding.load_model(str(workdir / 'lm_target'), LM_TARGET, mesh,
                               sharding.STANDARD_RULES)
  draft = sharding.load_model(str(workdir / 'lm_draft'), LM_DRAFT, mesh,
                              sharding.DATA_PARALLEL_RULES)
  options = LoopOptions(MAX_DECODE_LEN, GAMMA, eos_id=1)
  outputs = {}
  for name, knobs in KNOBS.items():
    batch = protocol.Batch(rows(prompts), rows(lengths), reads=target.reads)
    out = front_ends.run(target, draft, batch, keys, options, Knobs.create(knobs()))  # on the mesh
    outputs[f'lm_speculative_{name}'] = multihost.gather(out.tokens).tolist()
    if COUNT == 1:  # the reference's own reference: one device, no mesh
      one = front_ends.run(
          decoder_only.DecoderOnlyModel.load(str(workdir / 'lm_target'), LM_TARGET),
          decoder_only.DecoderOnlyModel.load(str(workdir / 'lm_draft'), LM_DRAFT),
          protocol.Batch(prompts, lengths, reads=target.reads), multihost.gather(keys), options,
          Knobs.create(knobs()))
      outputs[f'lm_one_device_{name}'] = np.asarray(one.tokens).tolist()
  return outputs


def main() -> None:
  workdir = pathlib.Path(WORKDIR)
  if COUNT > 1:
    multihost.initialize(multihost.Cluster(f'localhost:{PORT}', COUNT, INDEX), timeout_s=60,
                         heartbeat_timeout_s=10)
  else:
    for name, config, seed in (('target', TARGET, 0), ('draft', DRAFT, 1),
                               ('tiny', t5_1_1('tiny', vocab_size=8192), 2),
                               ('nano', t5_1_1('nano', vocab_size=8192), 3)):
      checkpoints.write_t5x(str(workdir / name),
                            models.T5Model.random(config, jax.random.key(seed)).params)
    for name, config, seed in (('lm_target', LM_TARGET, 4), ('lm_draft', LM_DRAFT, 5)):
      model = decoder_only.DecoderOnlyModel.random(config, jax.random.key(seed))
      checkpoints.write_t5x(str(workdir / name), model.params)
  assert jax.device_count() == 8, jax.devices()
  if MODE == 'die' and INDEX == 1:
    os._exit(9)  # pylint: disable=protected-access
  decoded = _decode(sharding.make_mesh(8), workdir)
  if jax.process_index() == 0:
    (workdir / f'decoded_{COUNT}.json').write_text(json.dumps(decoded))


if __name__ == '__main__':
  main()
