"""The command line with a decoder-only pair: inputs are prompts it continues."""

import json

import jax
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode import data
from spec_decode import models
from spec_decode.cli import infer
from spec_decode.models import decoder_only
from spec_decode.cli.gin_utils import ConfigError
from spec_decode.t5 import t5_1_1
from spec_decode.t5.decoder_only import DecoderOnlyConfig

TARGET = DecoderOnlyConfig(vocab_size=data.VOCAB_SIZE, emb_dim=32, num_heads=2, num_layers=2,
                           head_dim=16, mlp_dim=64)
DRAFT = DecoderOnlyConfig(vocab_size=data.VOCAB_SIZE, emb_dim=16, num_heads=2, num_layers=1,
                          head_dim=8, mlp_dim=32)
PROMPTS = ['A man rides', 'Two dogs', 'The package provides']


@pytest.fixture(scope='module')
def files(tmp_path_factory):
  path = tmp_path_factory.mktemp('lm_cli')
  for name, config, seed in (('target', TARGET, 0), ('draft', DRAFT, 1)):
    model = decoder_only.DecoderOnlyModel.random(config, jax.random.key(seed))
    checkpoints.write_t5x(str(path / name), model.params, vocabulary=data.vocabulary())
  (path / 'prompts.txt').write_text('\n'.join(PROMPTS) + '\n')
  return path


def run(files, name: str, **settings) -> list[dict]:
  out = files / f'{name}.jsonl'
  infer.infer(target_config=TARGET, target_checkpoint=str(files / 'target'),
              vocabulary=data.vocabulary(), input_file=str(files / 'prompts.txt'),
              output_file=str(out), max_decode_len=12, batch_size=2, **settings)
  return [json.loads(line) for line in out.read_text().splitlines()]


def test_greedy_outputs_continue_the_prompts_as_the_library_does(files):
  baseline = run(files, 'baseline')
  speculative = run(files, 'speculative', draft_config=DRAFT,
                    draft_checkpoint=str(files / 'draft'), gamma=3)
  target = decoder_only.DecoderOnlyModel.load(str(files / 'target'), TARGET)
  vocabulary = data.vocabulary()
  for prompt, base, spec in zip(PROMPTS, baseline, speculative):
    ids = vocabulary.encode(prompt)  # no EOS: a prompt is continued
    expected = models.generate(target, np.asarray([ids]), 0, max_decode_len=12, eos_id=1)
    assert base['output_ids'] == np.asarray(expected.tokens[0, :expected.lengths[0]]).tolist()
    assert spec['output_ids'] == base['output_ids'] and spec['inputs'] == prompt
    assert spec['output'] == vocabulary.decode(spec['output_ids'])
  assert sum(r['draft_calls'] for r in speculative) > 0


def test_beam_search_and_sampling_run(files):
  beams = run(files, 'beam', decode='beam', beam_size=2, draft_config=DRAFT,
              draft_checkpoint=str(files / 'draft'), gamma=2, draft_width=2)
  assert all(len(r['beams']) == 2 for r in beams)
  sampled = run(files, 'sampled', temperature=1.0, draft_config=DRAFT,
                draft_checkpoint=str(files / 'draft'))
  assert len(sampled) == 3


def test_a_mixed_pair_is_refused(files):
  with pytest.raises(ConfigError, match='a pair is of one kind, encoder-decoder'):
    run(files, 'mixed', draft_config=t5_1_1('nano', vocab_size=data.VOCAB_SIZE),
        draft_checkpoint=str(files / 'draft'))


def test_over_a_mesh_as_on_one_device(files):
  """MODEL_PARALLEL goes through spec_decode.models.sharding (a 1 x 1 mesh here;
  tests/multihost_test decodes a decoder-only pair over 8 devices and 2 processes)."""
  kwargs = dict(draft_config=DRAFT, draft_checkpoint=str(files / 'draft'), temperature=1.0)
  one = run(files, 'one_device', **kwargs)
  mesh = run(files, 'mesh', model_parallel=1, **kwargs)
  assert [r['output_ids'] for r in mesh] == [r['output_ids'] for r in one]
