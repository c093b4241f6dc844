"""The real pair's recipe and demo on a tiny random Llama: teacher data, training, the draft
folder, `python -m spec_decode.demo --pair smollm2` (no download: the target is a tiny GGUF
file written here and converted as the real one is)."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from spec_decode import demo
from spec_decode import kernels
from spec_decode.harness import smollm2_demo as demo_module
from spec_decode.llama import LlamaConfig
from spec_decode.llama import convert
from spec_decode.llama import draft as draft_lib
from spec_decode.llama import hf
from spec_decode.llama import prompts as prompts_lib
from spec_decode.models import LlamaModel, generate, protocol, speculative_generate
from spec_decode.training import feature_draft
from spec_decode.training import llama_draft
from spec_decode.training import teacher
from tests import script_runner
from tests import tolerances

pytest.importorskip('gguf')
pytest.importorskip('transformers')
from tests.llama_convert_test import write_gguf  # pylint: disable=g-import-not-at-top

STEPS = 8


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
  """{'target': folder, 'draft': folder, 'data': teacher folder} after a short recipe."""
  path = tmp_path_factory.mktemp('smollm2_pair')
  target = convert.prepare(write_gguf(path / 'tiny.gguf'), path / 'target', progress=False)
  llama_draft.teacher_data(str(target), str(path / 'teacher'), num_prompts=8, steps=STEPS,
                           top_k=4, batch=4, seed=1)
  record = llama_draft.train(str(target), str(path / 'teacher'), str(path / 'draft'),
                             num_layers=1, head_size=64, steps=4, batch_rows=2,
                             learning_rate=1e-3, val_rows=2, eval_every=2, seed=0)
  return {'target': str(target), 'draft': path / 'draft', 'data': path / 'teacher',
          'record': record}


def test_prompts_are_chat_turns_and_the_demo_split_is_held_out():
  train, test = prompts_lib.prompts('train', 30), prompts_lib.prompts('test', 30)
  assert len(set(test)) == 30 and not set(train) & set(test)
  assert all(p.startswith('<|im_start|>system\n') and p.endswith('<|im_start|>assistant\n')
             for p in test)
  assert prompts_lib.prompts('test', 6, seed=3) == prompts_lib.prompts('test', 6, seed=3)
  with pytest.raises(ValueError, match='split'):
    prompts_lib.prompts('validation', 3)


def test_teacher_rows_are_the_targets_greedy_or_sampled_continuations(pair):
  chunk = teacher.load_chunks(pair['data'])
  model = LlamaModel.load(pair['target'])
  assert chunk.tokens.shape == (8, STEPS) and chunk.top_ids.shape == (8, STEPS, 4)
  assert list(chunk.temperature) == [0, 1] * 4
  for row in (0, 2):  # greedy rows: our front end's greedy decode, token for token
    prompt = chunk.prompt[row:row + 1, :chunk.prompt_length[row]]
    out = generate(model, prompt, 0, max_decode_len=STEPS, eos_id=-1)
    np.testing.assert_array_equal(chunk.tokens[row], np.asarray(out.tokens[0]))
    np.testing.assert_array_equal(chunk.top_ids[row, :, 0], chunk.tokens[row])
  assert np.all(np.diff(chunk.top_logp.astype(np.float32), axis=-1) <= 0)
  ended = chunk.tokens == model.eos_id
  np.testing.assert_array_equal(chunk.length, np.where(ended.any(1), ended.argmax(1) + 1, STEPS))


def test_head_ids_take_the_targets_mass_keep_eos_and_fill_lowest_first():
  chunk = teacher.Chunk(np.zeros((1, 2), np.int32), np.array([2]), np.zeros(1, np.float32),
                        np.array([[7, 9]]), np.array([1]),
                        np.array([[[7, 5], [9, 3]]]), np.log(np.array([[[.6, .4], [.9, .1]]])))
  # Position 1 is past the length: 9 and 3 have no mass.
  np.testing.assert_array_equal(llama_draft.head_ids(chunk, 4, 20, eos_id=11), [0, 5, 7, 11])
  np.testing.assert_array_equal(llama_draft.head_ids(chunk, 30, 20, eos_id=11), np.arange(20))


def test_the_draft_folder_holds_its_own_weights_in_bfloat16_and_decodes_exactly(pair):
  log = [json.loads(line) for line in (pair['draft'] / 'log.jsonl').read_text().splitlines()]
  assert [entry['step'] for entry in log] == [0, 2, 4]
  assert all(0 <= entry['alpha_t0'] <= 1 and 0 <= entry['alpha_t1_lower'] <= 1 for entry in log)
  target = LlamaModel.load(pair['target'])
  draft = draft_lib.load(pair['draft'], target)
  assert draft.model.params['embed_tokens'] is target.params['embed_tokens']
  kernel = np.asarray(draft.model.params['layers_0']['mlp']['up_proj']['kernel'])
  np.testing.assert_array_equal(kernel, kernel.astype(ml_dtypes.bfloat16).astype(np.float32))
  assert target.eos_id in np.asarray(draft.ids).tolist() and draft.ids.shape == (64,)
  prompts = np.asarray(teacher.load_chunks(pair['data']).prompt[:2, :40])
  base = generate(target, prompts, 0, max_decode_len=12)
  spec = speculative_generate(target, draft, prompts, jax.random.key(1), gamma=3,
                              max_decode_len=12)
  np.testing.assert_array_equal(base.tokens, spec.tokens)


def test_a_draft_folder_for_another_target_or_incomplete_is_refused(pair, tmp_path):
  target = LlamaModel.load(pair['target'])
  stored = json.loads((pair['draft'] / 'config.json').read_text())
  other = tmp_path / 'other'
  other.mkdir()
  for name in ('model.safetensors', 'head_ids.json'):
    (other / name).write_bytes((pair['draft'] / name).read_bytes())
  (other / 'config.json').write_text(json.dumps({**stored, 'rms_norm_eps': 0.5}))
  with pytest.raises(ValueError, match='another target: rms_norm_eps'):
    draft_lib.load(other, target)
  (other / 'head_ids.json').unlink()
  with pytest.raises(FileNotFoundError, match='no head_ids.json'):
    draft_lib.load(other, target)


def test_the_demo_times_ours_and_transformers_and_writes_its_report(pair, tmp_path, capsys):
  out = tmp_path / 'out'
  assert demo.main(['--pair', 'smollm2', '--target', pair['target'], '--draft', str(pair['draft']),
                    '--n', '2', '--max_new_tokens', '6', '--gamma_max', '2',
                    '--out_dir', str(out)]) == 0
  printed = capsys.readouterr().out
  assert '| T | gamma | alpha |' in printed and '| hf_assisted_1t |' in printed
  results = json.loads((out / 'results.json').read_text())
  greedy, sampled = results['rows']
  assert (greedy['temperature'], sampled['temperature']) == (0, 1)
  assert greedy['greedy_identical'] == 2 and sampled['greedy_identical'] is None
  for name in ('hf_greedy_1t', 'hf_assisted_1t', 'hf_greedy_2t', 'hf_assisted_2t'):
    assert greedy[f'{name}_identical'] == 2 and greedy[f'{name}_token_ms'] > 0
  assert 1 <= greedy['tokens_per_call'] <= greedy['gamma'] + 1
  loops = results['costs']['loops'][str(greedy['gamma'])]
  assert loops['baseline']['iteration_ms'] > 0 and loops['speculative']['iteration_ms'] > 0
  assert greedy['predicted_loops'] > 0 and greedy['predicted_whole'] > 0
  assert {(r['draft'], r['temperature']) for r in results['table3']} == {
      (d, t) for d in ('draft, copying', 'draft', 'unigram', 'bigram') for t in (0, 1)}
  assert (out / 'report.md').read_text().startswith('# SmolLM2')


def test_the_demo_runs_a_draft_over_the_targets_features_beside_prompt_lookup(pair, tmp_path,
                                                                             capsys):
  """The features recipe (teacher data with features, distillation) and the demo with its draft."""
  llama_draft.teacher_data(pair['target'], str(tmp_path / 'teacher'), num_prompts=8, steps=STEPS,
                           top_k=4, batch=4, seed=1, features=True)
  feature_draft.train(pair['target'], str(tmp_path / 'teacher'), str(tmp_path / 'draft'),
                      num_layers=1, head_size=64, steps=4, batch_rows=2, learning_rate=1e-3,
                      val_rows=2, eval_every=2, seed=0)
  out = tmp_path / 'out'
  assert demo.main(['--pair', 'smollm2', '--target', pair['target'], '--draft',
                    str(tmp_path / 'draft'), '--n', '2', '--max_new_tokens', '6', '--gamma', '2',
                    '--copies', '0', '--peer_threads', '1', '--no_table3',
                    '--out_dir', str(out)]) == 0
  assert '| hf_prompt_lookup_1t |' in capsys.readouterr().out
  greedy, _ = json.loads((out / 'results.json').read_text())['rows']
  assert greedy['greedy_identical'] == 2 and greedy['hf_prompt_lookup_1t_identical'] == 2
  assert 0 <= greedy['alpha'] <= 1 and greedy['c'] > 0


def test_the_draft_cost_study_times_each_draft_against_the_target(pair, capsys):
  study = script_runner.load('studies/llama_draft_cost.py')
  assert study.main(['--target', pair['target'], '--layers', '1', '--heads', '16', '0']) == 0
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert len(result['target_ms']) == 6 and all(t > 0 for t in result['target_ms'])
  assert [(d['layers'], d['head']) for d in result['drafts']] == [(1, 16), (1, 269)]  # 269: the tiny vocabulary
  assert all(d['c'] > 0 for d in result['drafts'])


def test_the_copy_study_splits_agreement_by_whether_an_ngram_repeats(pair, capsys):
  """At T = 0 the copying draft is right where its copy is (a match) or its draft is (none)."""
  study = script_runner.load('studies/copy_agreement.py')
  assert study.main(['--target', pair['target'], '--draft', str(pair['draft']), '--n', '3',
                     '--max_new_tokens', '12', '--min_ngram', '1']) == 0
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert 0 < result['match_share'] < 1, result  # both kinds of positions occur
  mixed = (result['match_share'] * result['copy_right_where_match']
           + (1 - result['match_share']) * result['draft_right_elsewhere'])
  np.testing.assert_allclose(result['alpha_t0_copying'], mixed, rtol=1e-6)


def test_the_variant_study_times_each_way_of_drafting_against_the_baseline(pair, capsys):
  """Adaptive draft length and block verification on the copying draft, greedy: exact."""
  study = script_runner.load('studies/smollm2_variants.py')
  assert study.main(['--target', pair['target'], '--draft', str(pair['draft']), '--n', '2',
                     '--max_new_tokens', '10', '--variants', 'gamma=2',
                     'gamma=4,threshold=0.5', 'gamma=3,verification=block']) == 0
  rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])['rows']
  assert [r['decoder'] for r in rows] == ['baseline', 'gamma=2', 'gamma=4,threshold=0.5',
                                          'gamma=3,verification=block']
  assert all(r['identical'] == 2 and r['ms_per_token'] > 0 for r in rows)
  assert rows[0]['speedup'] == 1.0 and rows[0]['tokens_per_call'] == 1.0
  assert all(1.0 <= r['tokens_per_call'] <= g + 1 for r, g in zip(rows[1:], (2, 4, 3)))
  assert study.main(['--target', pair['target'], '--draft', str(pair['draft']), '--n', '1',
                     '--max_new_tokens', '6', '--temperature', '1', '--variants', 'gamma=2']) == 0
  out = capsys.readouterr().out
  assert all(r['identical'] is None for r in json.loads(out.strip().splitlines()[-1])['rows'])
  assert '| gamma=2 |' in out and out.count(' - |') == 2  # no identity claimed for draws
  for bad, named in (('gamma=2,lenience=0.5', "got 'lenience=0.5'"),
                     ('threshold=0.5', 'gamma=G is required'),
                     ('gamma=two', "gamma must be an integer, got 'two'"),
                     ('gamma=2,verification=tree', 'verification must be one of token')):
    with pytest.raises(SystemExit):
      study.main(['--target', pair['target'], '--variants', bad])
    assert named in capsys.readouterr().err


def test_teacher_forcing_along_a_continuation_gives_the_distributions_decoding_saw(pair):
  chunk = teacher.load_chunks(pair['data'])
  target = LlamaModel.load(pair['target'])
  scored = teacher.score_chunk(target, chunk.prompt, chunk.prompt_length, chunk.tokens,
                               chunk.length, top_k=4)
  np.testing.assert_array_equal(scored.top_ids[::2], chunk.top_ids[::2])  # greedy rows
  np.testing.assert_allclose(scored.top_logp.astype(np.float32),
                             chunk.top_logp.astype(np.float32), rtol=1e-2, atol=1e-2)
  assert list(scored.temperature) == [1] * 8


def test_training_goes_on_from_a_draft_with_human_answers_that_only_train(pair, tmp_path):
  llama_draft.text_data(pair['target'], str(tmp_path / 'text'), num_texts=4, steps=STEPS,
                        top_k=4, batch=2, seed=2)
  text = teacher.load_chunks(tmp_path / 'text')
  assert text.tokens.shape == (4, STEPS) and np.all(text.length <= STEPS)
  llama_draft.train(pair['target'], str(pair['data']), str(tmp_path / 'more'), num_layers=3,
                    head_size=8, steps=2, batch_rows=2, learning_rate=1e-3, val_rows=2,
                    eval_every=2, seed=0, extra_data=[str(tmp_path / 'text')],
                    init=str(pair['draft']))
  target = LlamaModel.load(pair['target'])
  before, after = (draft_lib.load(d, target) for d in (pair['draft'], tmp_path / 'more'))
  np.testing.assert_array_equal(before.ids, after.ids)  # the draft's own, not a new head
  assert after.model.config.num_hidden_layers == 1


def test_packed_panels_read_the_drafts_bfloat16_weights_and_give_the_same_logits(pair):
  if not kernels.in_use():
    pytest.fail('the CPU kernels are not in use: run `python -m spec_decode.kernels`')
  target = LlamaModel.load(pair['target'])
  draft = draft_lib.load(pair['draft'], target).model
  assert draft.with_panels().panels['layers_0']['mlp']['up_proj']['kernel'].dtype == jnp.bfloat16
  packed_target = target.with_panels()
  assert packed_target.panels['layers_0']['mlp']['up_proj']['kernel'].dtype == jnp.float32
  # The target's tied output layer packed too; the draft's model leaves it to the draft's head.
  assert set(packed_target.panels) == {f'layers_{i}' for i in range(2)} | {'head'}
  pruned = draft_lib.load(pair['draft'], target)
  assert set(pruned.model.panels) == {'layers_0'}  # one layer
  # Prompts of 8 and 5 tokens: the prefill's 14 rows take the CPU kernel unpacked too (from
  # 17 rows on XLA's product, equal to rounding), so every layer's product is the same
  # kernel's; the output layer unpacked is XLA's product, equal to rounding.
  batch = protocol.Batch.of(target, jnp.asarray(teacher.load_chunks(pair['data']).prompt[:2, :8]),
                            jnp.array([8, 5]))
  tokens = jnp.array([[0, 5, 9], [0, 7, 7]], jnp.int32)
  def logits(m):
    return np.asarray(m.start(batch, 8)[0](tokens, m.start(batch, 8)[1])[0])

  for unpacked, packed in ((draft, draft.with_panels()),
                           (target, target.with_panels(output_layer=False))):
    np.testing.assert_array_equal(logits(unpacked), logits(packed))
  tolerances.assert_close(logits(packed_target), logits(target), ulps=64)


def test_the_bundled_draft_fits_smollm2_and_stays_small():
  folder = demo_module.DRAFT_DIR
  config = LlamaConfig.from_hf(str(folder))
  assert (config.hidden_size, config.vocab_size, config.num_hidden_layers) == (576, 49152, 2)
  assert config.tie_word_embeddings and config.eos_token_ids == (2,)
  tensors = safetensors.numpy.load_file(str(folder / draft_lib.WEIGHTS_FILE))
  names = hf.hf_names(config)
  shapes = hf.expected_shapes(config)
  assert set(tensors) == {names[k] for k in shapes if k != draft_lib.EMBEDDING}
  for name, shape in shapes.items():
    if name != draft_lib.EMBEDDING:
      stored = tensors[names[name]].shape
      assert (stored[::-1] if name.endswith('/kernel') else stored) == shape, name
  ids = json.loads((folder / draft_lib.IDS_FILE).read_text())
  assert len(ids) == 8192 and ids == sorted(set(ids)) and 2 in ids and ids[-1] < 49152
  size = sum(f.stat().st_size for f in folder.iterdir())
  assert size < 20e6, f'{size / 1e6:.1f} MB'
