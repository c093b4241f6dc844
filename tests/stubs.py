"""Stub models, a goodness-of-fit test and random Llama folders shared by the tests."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from scipy import stats

from spec_decode import cache as cache_lib
from spec_decode.checkpoints.hf import HF_FILE, HF_INDEX
from spec_decode.checkpoints.param_trees import flatten
from spec_decode.llama import LlamaConfig
from spec_decode.models import LlamaModel
from spec_decode.llama import hf

# Compiler options of the jitted loops that run long (the statistical tests'
# 100k-row batches): conftest.py compiles everything else at XLA's backend
# optimisation level 0, where these ran 10x slower (20.5 s against 2.2 s for
# 120k rows of the gamma-3 stub loop).
OPTIMIZED = {'xla_backend_optimization_level': 2}


class TableModel:
  """A toy language model whose logits depend on the last two tokens.

  logits at position t = table[token_{t-1}, token_t], with token_{-1} = V (a
  start symbol). The history lives in the cache, so a wrong rewind or a stale
  entry changes the logits: the stub exercises the cache contract as a real
  decoder does. `calls` counts traces of the step function.
  """

  def __init__(self, table: np.ndarray):
    self.table = jnp.asarray(table, jnp.float32)  # [V + 1, V, V]
    self.vocab = table.shape[-1]
    self.traces = 0

  @classmethod
  def random(cls, seed: int, vocab: int, scale: float = 1.5, banned: float = 0.0) -> 'TableModel':
    """Random table; a fraction `banned` of logits is -inf (partial support)."""
    rng = np.random.default_rng(seed)
    table = scale * rng.standard_normal((vocab + 1, vocab, vocab))
    table[rng.random(table.shape) < banned] = -np.inf
    table[..., 2] = np.maximum(table[..., 2], -1.0)  # every context has some support
    return cls(table)

  def init_cache(self, batch: int, capacity: int) -> cache_lib.Cache:
    return cache_lib.Cache(index=jnp.zeros((batch,), jnp.int32),
                           layers=jnp.zeros((batch, capacity), jnp.int32), capacity=capacity)

  def step_fn(self, tokens: jax.Array, cache: cache_lib.Cache):
    """tokens [B, K] -> logits [B, K, V], cache advanced by K."""
    self.traces += 1
    history = cache_lib.write(cache.layers, tokens, cache.index)  # [B, T]
    positions = cache.index[:, None] + jnp.arange(tokens.shape[1])  # [B, K]
    prev = jnp.take_along_axis(history, jnp.maximum(positions - 1, 0), axis=1)
    prev = jnp.where(positions == 0, self.vocab, prev)
    logits = self.table[prev, tokens]  # [B, K, V]
    return logits, cache.replace(index=cache.index + tokens.shape[1], layers=history)

  def next_logits(self, prefix: tuple[int, ...]) -> np.ndarray:
    """[V] logits after BOS + prefix (host-side, for exact enumeration)."""
    seq = (0,) + tuple(prefix)
    prev = self.vocab if len(seq) == 1 else seq[-2]
    return np.asarray(self.table[prev, seq[-1]])


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
  """Pearson chi-square p-value of observed counts against probabilities.

  Outcomes with expected count below `min_expected` are pooled into one bin, so
  the asymptotic chi-square law holds. An observed count in an outcome of
  probability zero gives p-value 0.
  """
  counts = np.asarray(counts, np.float64).ravel()
  probs = np.asarray(probs, np.float64).ravel()
  if np.any(counts[probs <= 0] > 0):
    return 0.0
  expected = probs * counts.sum()
  big = expected >= min_expected
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  keep = exp > 0
  if keep.sum() < 2:
    return 1.0
  return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


class PrefixModel:
  """A toy language model whose logits depend on the whole prefix and the row.

  logits after tokens_0..t of batch row b = table[h_t], h_t = (h_{t-1} * 31 +
  token_t + 1) mod H with h_{-1} = 1009 * b mod H: rows decode differently, and
  any wrong cache row (a beam given another beam's or another row's history)
  changes the logits, as in a real decoder.
  """

  ROW_SEED = 1009

  def __init__(self, table: np.ndarray):
    self.table = jnp.asarray(table, jnp.float32)  # [H, V]
    self.vocab = table.shape[-1]
    self.buckets = table.shape[0]

  @classmethod
  def random(cls, seed: int, vocab: int, buckets: int = 4099, scale: float = 2.0,
             eos_bias: float = 0.0, eos_id: int = 1) -> 'PrefixModel':
    table = scale * np.random.default_rng(seed).standard_normal((buckets, vocab))
    table[:, eos_id] += eos_bias
    return cls(table)

  def init_cache(self, batch: int, capacity: int) -> cache_lib.Cache:
    """layers: (history [B, capacity] tokens, h_{-1} [B])."""
    start = (jnp.arange(batch, dtype=jnp.int32) * self.ROW_SEED) % self.buckets
    return cache_lib.Cache(index=jnp.zeros((batch,), jnp.int32),
                           layers=(jnp.zeros((batch, capacity), jnp.int32), start),
                           capacity=capacity)

  def hashes(self, history: jax.Array, start: jax.Array) -> jax.Array:
    """[B, T] tokens, [B] h_{-1} -> [B, T] prefix hashes h_0..h_{T-1}."""
    def scan(h, tok):
      h = (h * 31 + tok + 1) % self.buckets
      return h, h
    return jax.lax.scan(scan, start, history.T)[1].T

  def step_fn(self, tokens: jax.Array, cache: cache_lib.Cache):
    """tokens [B, K] -> logits [B, K, V], cache advanced by K."""
    history, start = cache.layers
    history = cache_lib.write(history, tokens, cache.index)  # [B, T]
    positions = cache.index[:, None] + jnp.arange(tokens.shape[1])  # [B, K]
    h = jnp.take_along_axis(self.hashes(history, start), positions, axis=1)
    return self.table[h], cache.replace(index=cache.index + tokens.shape[1],
                                        layers=(history, start))

  def next_logits(self, prefix: tuple[int, ...], row: int = 0) -> np.ndarray:
    """[V] logits after BOS + prefix in batch row `row` (host-side)."""
    h = row * self.ROW_SEED % self.buckets
    for tok in (0,) + tuple(prefix):
      h = (h * 31 + tok + 1) % self.buckets
    return np.asarray(self.table[h])


def first_three_law(forward, prefix: np.ndarray, vocab: int) -> np.ndarray:
  """[V, V, V] exact joint probabilities of the three tokens that follow `prefix`.

  Args:
    forward: [N, L] int32 sequences -> [N, L, V] logits, position j scoring the
      token after position j (teacher forcing).
    prefix: what the model reads before the first sampled token (a BOS the
      model adds, then the prompt).
    vocab: V.
  """
  pairs = np.stack(np.meshgrid(np.arange(vocab), np.arange(vocab), indexing='ij'), -1)
  sequences = np.concatenate([np.broadcast_to(prefix, (vocab * vocab, len(prefix))),
                              pairs.reshape(-1, 2)], axis=1)
  logits = forward(jnp.asarray(sequences, jnp.int32))
  probs = np.asarray(jax.nn.softmax(logits[:, len(prefix) - 1:], axis=-1), np.float64)
  probs = probs.reshape(vocab, vocab, 3, vocab)  # [t1, t2, position, token]
  return probs[0, 0, 0][:, None, None] * probs[:, 0, 1][:, :, None] * probs[:, :, 2]


def first_three_pvalue(tokens: np.ndarray, law: np.ndarray) -> float:
  """Chi-square p-value of sampled [N, >= 3] tokens' first three against `law` ([V, V, V])."""
  outcome = np.ravel_multi_index(np.asarray(tokens)[:, :3].T, law.shape)
  return chi_square_pvalue(np.bincount(outcome, minlength=law.size), law.ravel())


def llama_first_three_pvalues(target: LlamaModel, tokens: np.ndarray, prompts: np.ndarray,
                              lengths: np.ndarray) -> list[float]:
  """Chi-square p-value of each prompt's sampled rows (equal blocks of `tokens`) against p's."""
  forward = lambda x: target.network.apply({'params': target.params}, x)
  rows = len(tokens) // len(prompts)
  return [first_three_pvalue(tokens[i * rows:(i + 1) * rows],
                             first_three_law(forward, prompt[:length], target.vocab_size))
          for i, (prompt, length) in enumerate(zip(prompts, lengths))]


def llama_model(config: LlamaConfig, seed: int, scale: float = 5.0) -> LlamaModel:
  """Random weights `scale` times HF's initialisation: logits of order 1, few near-ties."""
  model = LlamaModel.random(config, jax.random.key(seed))
  return model.replace(params=jax.tree.map(lambda x: x * scale, model.params))


def save_llama(model: LlamaModel, directory, shards: int = 1, **config_overrides) -> str:
  """Writes `model` as a Hugging Face LlamaForCausalLM folder (sharded when shards > 1)."""
  os.makedirs(directory, exist_ok=True)
  cfg = model.config
  names = hf.hf_names(cfg)
  tensors = {names[n]: np.ascontiguousarray(np.asarray(x).T if n.endswith('/kernel') else x)
             for n, x in flatten(model.params).items()}
  groups = np.array_split(np.array(sorted(tensors)), shards)
  weight_map = {}
  for i, group in enumerate(groups):
    file = HF_FILE if shards == 1 else f'model-{i + 1:05d}-of-{shards:05d}.safetensors'
    safetensors.numpy.save_file({n: tensors[n] for n in group}, os.path.join(directory, file))
    weight_map.update(dict.fromkeys(group.tolist(), file))
  if shards > 1:
    with open(os.path.join(directory, HF_INDEX), 'w') as f:
      json.dump({'weight_map': weight_map}, f)
  config = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama',
            **{k: getattr(cfg, k) for k in ('vocab_size', 'hidden_size', 'intermediate_size',
                                            'num_hidden_layers', 'num_attention_heads',
                                            'num_key_value_heads', 'head_dim', 'rms_norm_eps',
                                            'tie_word_embeddings')},
            'rope_parameters': {'rope_type': 'default', 'rope_theta': cfg.rope_theta},
            'eos_token_id': list(cfg.eos_token_ids), **config_overrides}
  with open(os.path.join(directory, 'config.json'), 'w') as f:
    json.dump(config, f)
  return str(directory)
