"""The one front end: every family and draft kind through generate / speculative_generate."""

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import models
from spec_decode.llama import LlamaConfig
from spec_decode.models import drafts
from spec_decode.t5 import t5_1_1

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'spec_decode'
FRONT_ENDS = ('generate', 'speculative_generate', 'beam_generate')


def test_each_front_end_is_defined_once_in_the_package():
  found = {name: [] for name in FRONT_ENDS}
  for path in PACKAGE.rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
      if isinstance(node, ast.FunctionDef) and node.name in found:
        found[node.name].append(str(path.relative_to(PACKAGE)))
  assert found == {name: ['models/front_ends.py'] for name in FRONT_ENDS}


def _llama(vocab_size: int, seed: int, layers: int = 2) -> models.LlamaModel:
  config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, eos_token_ids=(2,))
  return models.LlamaModel.random(config, jax.random.key(seed))


def test_a_sparse_bigram_is_add_k_where_stored_and_the_unigram_elsewhere():
  vocab, k, add_k = 8, 2, 0.5
  stream = np.array([5, 6, 3, 5, 7, 3, 5, 6, 3])  # three sequences ending in EOS 3
  table = drafts.TableDraft.estimate(stream, vocab, order=2, add_k=add_k, top_k=k, bos_id=4,
                                     eos_id=3)
  assert table.next_ids.shape == (vocab, k)
  q = np.exp(np.asarray(table.logits(jnp.arange(vocab)[None])[0]))  # row t: q(. | t)
  np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(q[4, 5], (3 + add_k) / (3 + vocab * add_k), rtol=1e-5)  # BOS -> 5
  np.testing.assert_allclose(q[5, 6], (2 + add_k) / (3 + vocab * add_k), rtol=1e-5)
  np.testing.assert_allclose(q[5, 7], (1 + add_k) / (3 + vocab * add_k), rtol=1e-5)
  unigram = np.exp(np.asarray(table.log_probs))
  rest = [x for x in range(vocab) if x not in (6, 7)]  # the others back off to the unigram
  np.testing.assert_allclose(q[5, rest] / unigram[rest], q[5, 0] / unigram[0], rtol=1e-5)
  np.testing.assert_allclose(q[1], unigram, rtol=1e-5)  # an unseen context
  dense = drafts.TableDraft.estimate(stream, vocab, order=2, add_k=add_k, top_k=vocab, bos_id=4,
                                     eos_id=3)
  q_dense = np.exp(np.asarray(dense.logits(jnp.arange(vocab)[None])[0]))
  np.testing.assert_allclose(q_dense[5, 6], q[5, 6], rtol=1e-5)
  np.testing.assert_allclose(q_dense[5, 0], add_k / (3 + vocab * add_k), rtol=1e-5)


@pytest.mark.parametrize('draft_kind', ['bigram', 'prompt_lookup', 'model'])
def test_every_draft_kind_decodes_a_llama_target_greedily_as_its_baseline(draft_kind):
  vocab = 96
  target = _llama(vocab, 0)
  prompts = np.array([[1, 5, 9, 5, 9, 5], [1, 7, 8, 0, 0, 0]], np.int32)
  lengths = np.array([6, 3], np.int32)
  baseline = models.generate(target, prompts, 0, lengths=lengths, max_decode_len=10)
  stream = np.asarray(baseline.tokens).ravel()
  draft = {'bigram': lambda: drafts.TableDraft.estimate(stream, vocab, 2, top_k=4, eos_id=2),
           'prompt_lookup': lambda: drafts.PromptLookupDraft(vocab),
           'model': lambda: _llama(vocab, 1, layers=1)}[draft_kind]()
  out = models.speculative_generate(target, draft, prompts, 1, lengths=lengths, gamma=3,
                                    max_decode_len=10)
  np.testing.assert_array_equal(out.tokens, baseline.tokens)
  beams = models.beam_generate(target, prompts, lengths=lengths, beam_size=2, max_decode_len=6)
  fast = models.beam_generate(target, prompts, lengths=lengths, beam_size=2, max_decode_len=6,
                              draft=draft, gamma=2)
  np.testing.assert_array_equal(fast.tokens, beams.tokens)


_LARGE_VOCABULARY = textwrap.dedent('''
    import json, re, sys
    import jax, numpy as np
    from spec_decode import models
    from spec_decode.llama import LlamaConfig
    from spec_decode.models import drafts
    V = 49152
    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         eos_token_ids=(2,))
    target = models.LlamaModel.random(config, jax.random.key(0))
    prompts = np.random.default_rng(0).integers(3, V, (2, 12)).astype(np.int32)
    prompts[:, 6:] = prompts[:, :6]  # a repeat for prompt lookup to find
    stream = np.random.default_rng(1).integers(0, V, 200_000)
    baseline = models.generate(target, prompts, 0, max_decode_len=16)
    bigram = drafts.TableDraft.estimate(stream, V, order=2, eos_id=2)
    result = {'bigram_bytes': sum(x.nbytes for x in jax.tree.leaves(bigram))}
    for name, draft in (('bigram', bigram), ('prompt_lookup', drafts.PromptLookupDraft(V))):
      out = models.speculative_generate(target, draft, prompts, 1, gamma=3, max_decode_len=16)
      result[name] = bool(np.array_equal(out.tokens, baseline.tokens))
    # The peak resident memory of this process (VmHWM; ru_maxrss keeps the parent's across exec).
    status = open('/proc/self/status').read()
    result['max_rss_bytes'] = int(re.search(r'VmHWM:\s+(\d+) kB', status).group(1)) * 1024
    print(json.dumps(result))
''')


@pytest.mark.slow
def test_zero_cost_drafts_decode_a_49152_token_llama_within_1_gb():
  run = subprocess.run([sys.executable, '-c', _LARGE_VOCABULARY], capture_output=True, text=True,
                       timeout=600, env={'JAX_PLATFORMS': 'cpu', 'PATH': '/usr/bin:/bin',
                                         'HOME': str(pathlib.Path.home())})
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(run.stdout.strip().splitlines()[-1])
  assert result['bigram'] and result['prompt_lookup'], result
  assert result['bigram_bytes'] < 30 * 2**20, result  # a dense [V, V] float32 table is 9 GiB
  assert result['max_rss_bytes'] < 2**30, result


def test_a_draft_of_another_family_or_inputs_of_another_kind_are_named():
  llama = _llama(64, 0)
  t5 = models.T5Model.random(t5_1_1('nano', vocab_size=64), jax.random.key(0))
  with pytest.raises(ValueError, match='reads its inputs as .* pair models of one family'):
    models.speculative_generate(llama, t5, [[1, 2]], 0, gamma=2, max_decode_len=4)
  with pytest.raises(ValueError, match='lengths are prompt lengths of a decoder-only model'):
    models.generate(t5, [[3, 1]], 0, lengths=[2], max_decode_len=4)
  with pytest.raises(ValueError, match='prompt .* is for an encoder-decoder'):
    models.generate(llama, [[1, 2]], 0, prompt=[[3]], max_decode_len=4)
  with pytest.raises(TypeError, match='is not a model of the front ends'):
    models.generate(drafts.UniformDraft(64), [[1, 2]], 0, max_decode_len=4)


@pytest.mark.parametrize('eos_id', [64, 9000, -5, 1.0])
def test_an_eos_id_no_row_can_produce_is_refused(eos_id):
  llama = _llama(64, 0)
  with pytest.raises(ValueError, match=r'eos_id must be -1 \(no end token\) or a token id in '
                                       r'0..63'):
    models.generate(llama, [[1, 2]], 0, max_decode_len=4, eos_id=eos_id)
