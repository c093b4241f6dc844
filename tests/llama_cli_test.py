"""The command line with Llama folders (runs/llama.gin) and their tokenizers.

Random Llama weights are written as Hugging Face folders here, with a word-level
tokenizer.json in which id 0 is a real word ('the'), BOS is 1 and the EOS is an
id the target emits greedily: the prompts' lengths, the BOS and the EOS must all
come from the folder, not from T5's conventions (0 padding, EOS 1).
"""

import json
import os
import re
import shutil

import gin
import numpy as np
import pytest

from spec_decode import data
from spec_decode.cli import infer
from spec_decode.llama import LlamaConfig
from spec_decode.llama.tokenizer import Tokenizer
from spec_decode.models import LlamaModel, beam_generate, generate
from tests import stubs

tokenizers = pytest.importorskip('tokenizers')

CONFIG = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)
DRAFT = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16)
BOS = 1
# 'the' is id 0: a prompt length counted from non-zero ids would drop it.
PROMPTS = ['the w5 w9 the', 'w7', 'w20 the w33 w40 w41 w42']
MAX_DECODE_LEN = 10


def _write_tokenizer(folder, size: int = 128) -> None:
  """A word-level tokenizer.json: the 0, <s> 1, </s> 2, <unk> 3, then w4 .. w{size-1}."""
  vocab = {'the': 0, '<s>': 1, '</s>': 2, '<unk>': 3, **{f'w{i}': i for i in range(4, size)}}
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tokenizer.add_special_tokens(['<s>', '</s>'])
  tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
      single='<s> $A', special_tokens=[('<s>', BOS)])
  tokenizer.save(os.path.join(folder, 'tokenizer.json'))


def _prompts(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
  ids = [tokenizer.encode(p) for p in PROMPTS]
  padded = np.zeros((len(ids), max(map(len, ids))), np.int32)
  for row, x in zip(padded, ids):
    row[:len(x)] = x
  return padded, np.array([len(x) for x in ids], np.int32)


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
  """{'target', 'draft', 'prompts', 'eos'}: the target's EOS is its 4th greedy token of prompt 0."""
  path = tmp_path_factory.mktemp('llama_cli')
  target = stubs.llama_model(CONFIG, 0)
  _write_tokenizer(path)
  prompts, lengths = _prompts(Tokenizer(path))
  free = generate(target, prompts[:1], 0, lengths=lengths[:1], max_decode_len=MAX_DECODE_LEN,
                  eos_id=-1)
  tokens = np.asarray(free.tokens[0]).tolist()
  eos = next(t for i, t in enumerate(tokens) if i >= 3 and t not in tokens[:i])
  draft = stubs.llama_model(DRAFT, 1)
  result = {'prompts': path / 'prompts.txt', 'eos': eos}
  for name, model in (('target', target), ('draft', draft)):
    result[name] = stubs.save_llama(model, path / name, eos_token_id=eos)
    shutil.copy(path / 'tokenizer.json', path / name / 'tokenizer.json')
  result['prompts'].write_text('\n'.join(PROMPTS) + '\n')
  return result


def run(folders, tmp_path, *bindings: str, gin_files=()) -> tuple[int, list[dict]]:
  """Runs scripts/decode.py's main on runs/llama.gin (and gin_files); (exit status, records)."""
  out = tmp_path / 'out.jsonl'
  gin.clear_config()
  status = infer.main([
      '--gin_file=runs/llama.gin', *[f'--gin_file={f}' for f in gin_files],
      f"--gin.TARGET_CHECKPOINT='{folders['target']}'",
      f"--gin.DRAFT_CHECKPOINT='{folders['draft']}'", f"--gin.INPUT_FILE='{folders['prompts']}'",
      f"--gin.OUTPUT_FILE='{out}'", f'--gin.MAX_DECODE_LEN={MAX_DECODE_LEN}',
      '--gin.BATCH_SIZE=2', *[f'--gin.{b}' for b in bindings]])
  gin.clear_config()
  records = [json.loads(line) for line in out.read_text().splitlines()] if status == 0 else []
  return status, records


def test_greedy_outputs_are_the_library_s_with_the_folder_s_lengths_and_eos(folders, tmp_path):
  target = LlamaModel.load(folders['target'])
  tokenizer = Tokenizer(folders['target'])
  prompts, lengths = _prompts(tokenizer)
  assert prompts[0].tolist()[:5] == [BOS, 0, 5, 9, 0] and lengths.tolist() == [5, 2, 7]
  expected = generate(target, prompts, 0, lengths=lengths, max_decode_len=MAX_DECODE_LEN)
  status, baseline = run(folders, tmp_path, 'DRAFT_CONFIG=None', 'DRAFT_CHECKPOINT=None')
  assert status == 0
  status, speculative = run(folders, tmp_path, 'GAMMA=3')
  assert status == 0
  for b, (base, spec) in enumerate(zip(baseline, speculative)):
    ids = np.asarray(expected.tokens[b, :expected.lengths[b]]).tolist()
    assert base['output_ids'] == ids and spec['output_ids'] == ids, b
    assert spec['output'] == tokenizer.decode(ids) and '</s>' not in spec['output']
  assert baseline[0]['output_ids'][-1] == folders['eos'] and len(baseline[0]['output_ids']) == 4
  assert sum(r['draft_calls'] for r in speculative) > 0


def test_sampling_over_a_mesh_and_beam_search(folders, tmp_path):
  """MODEL_PARALLEL goes through spec_decode.models.sharding (a 1 x 1 mesh here;
  tests/sharding_subprocess splits a Llama pair over 8 devices); beam search finds the
  library's beams."""
  status, one = run(folders, tmp_path, 'TEMPERATURE=1.0')
  assert status == 0
  status, mesh = run(folders, tmp_path, 'TEMPERATURE=1.0', 'MODEL_PARALLEL=1',
                     gin_files=['runs/sharded/mesh.gin'])
  assert status == 0
  assert [r['output_ids'] for r in mesh] == [r['output_ids'] for r in one]
  status, beams = run(folders, tmp_path, "DECODE='beam'", 'BEAM_SIZE=2', 'DRAFT_WIDTH=2',
                      'GAMMA=2')
  assert status == 0
  target = LlamaModel.load(folders['target'])
  prompts, lengths = _prompts(Tokenizer(folders['target']))
  expected = beam_generate(target, prompts, lengths=lengths, beam_size=2,
                           max_decode_len=MAX_DECODE_LEN, eos_id=folders['eos'])
  best = np.asarray(expected.tokens[:, -1])
  for b, record in enumerate(beams):
    assert record['output_ids'] == best[b, :len(record['output_ids'])].tolist()


def test_bad_folders_are_errors_naming_the_problem(folders, tmp_path, capsys):
  several = stubs.save_llama(stubs.llama_model(CONFIG, 0), tmp_path / 'several',
                             eos_token_id=[folders['eos'], 2])
  shutil.copy(os.path.join(folders['target'], 'tokenizer.json'), several)
  other = tmp_path / 'other'
  shutil.copytree(folders['draft'], other)
  _write_tokenizer(other, size=100)
  big = tmp_path / 'big'
  shutil.copytree(folders['target'], big)
  _write_tokenizer(big, size=200)
  quoted = tmp_path / 'quoted'  # config.json fields of the wrong JSON type or range
  shutil.copytree(folders['target'], quoted)
  stored = json.loads((quoted / 'config.json').read_text())
  (quoted / 'config.json').write_text(json.dumps({**stored, 'num_hidden_layers': '2'}))
  unknown_eos = tmp_path / 'unknown_eos'
  shutil.copytree(folders['target'], unknown_eos)
  (unknown_eos / 'config.json').write_text(json.dumps({**stored, 'eos_token_id': 500}))
  for bindings, message in (
      ([f"TARGET_CHECKPOINT='{several}'"], r'lists several EOS ids \[\d+, 2\].*--gin.EOS_ID'),
      ([f"DRAFT_CHECKPOINT='{other}'"], 'different tokenizer.json files'),
      ([f"TARGET_CHECKPOINT='{big}'"], "has 200 ids but the models' vocab_size is 128"),
      ([f"TARGET_CHECKPOINT='{tmp_path / 'absent'}'"], 'no Hugging Face config.json at'),
      ([f"TARGET_CHECKPOINT='{quoted}'"],
       rf"^error: ValueError: {quoted}/config.json: field num_hidden_layers must be a positive "
       r"integer, got '2' \(a JSON string: drop the quotes\) \(gin: target/from_hf\)$"),
      ([f"DRAFT_CHECKPOINT='{unknown_eos}'"],
       rf'^error: ValueError: {unknown_eos}/config.json: field eos_token_id must be a token id in '
       r'0..vocab_size - 1 = 127 or a list of them \(or null\), got 500 \(gin: draft/from_hf\)$'),
      (["DTYPE='float16'"], 'dtype must be one of')):
    status, _ = run(folders, tmp_path, *bindings)
    assert status == 1, bindings
    error = capsys.readouterr().err
    assert error.startswith('error: ') and re.search(message, error, re.M), error


def test_sentencepiece_tokenizers_add_bos_as_their_config_says(tmp_path):
  model_file = data.vocabulary().sentencepiece_model_file
  shutil.copy(model_file, tmp_path / 'tokenizer.model')
  with pytest.raises(ValueError, match='no BOS piece'):  # T5's model has none
    Tokenizer(tmp_path)
  (tmp_path / 'tokenizer_config.json').write_text('{"add_bos_token": false}')
  tokenizer = Tokenizer(tmp_path)
  ids = tokenizer.encode('A man rides a bicycle.')
  assert ids == data.vocabulary().encode('A man rides a bicycle.')
  assert tokenizer.decode(ids + [1, 10**6]) == 'A man rides a bicycle.'  # EOS, padding ids
  (tmp_path / 'tokenizer_config.json').write_text('{"add_bos_token": "yes"}')
  with pytest.raises(ValueError, match='add_bos_token must be true or false'):
    Tokenizer(tmp_path)
  os.remove(tmp_path / 'tokenizer.model')
  with pytest.raises(FileNotFoundError, match='no tokenizer.json or tokenizer.model'):
    Tokenizer(tmp_path)
