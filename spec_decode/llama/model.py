"""Llama models in the decoding loops: the model, its step function, the front ends.

A `LlamaModel` is a config (static) and a parameter tree (traced), like
`spec_decode.models.T5Model`: it passes through `jax.jit` whole, and it is a
decoder-only model of spec_decode.lm (`start(prompt_tokens, capacity,
lengths)` prefills the prompts; spec_decode.llama.network explains how loop
positions map onto them). `generate` and `speculative_generate` are
spec_decode.lm's with the Llama defaults: the EOS id from the config, and a
draft checked for the target's tokenizer. `spec_decode.lm.beam_generate`
takes Llama models as they are.

  target = LlamaModel.load('/ckpt/llama-7b')
  draft = LlamaModel.load('/ckpt/llama-160m')
  out = speculative_generate(target, draft, prompts, lengths, jax.random.key(0),
                             gamma=4, max_decode_len=128)
  out.tokens  # [B, 128], the generated tokens of each row
"""

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode import lm
from spec_decode import sampling as sampling_lib
from spec_decode.llama import hf
from spec_decode.llama.config import LlamaConfig
from spec_decode.llama.network import LlamaNetwork


@flax.struct.dataclass
class LlamaModel:
  """A Llama network's config and parameters.

  Attributes:
    config: the LlamaConfig; static.
    params: the parameter tree (see spec_decode.llama.network).
    tokenizer: static ((file, sha256), ...) of the checkpoint's tokenizer
      files (hf.tokenizer_fingerprint); empty when unknown.
  """

  config: LlamaConfig = flax.struct.field(pytree_node=False)
  params: Any
  tokenizer: tuple[tuple[str, str], ...] = flax.struct.field(pytree_node=False, default=())
  min_prompt_length = 1  # loop position 0 stands for the prompt's last token

  @property
  def network(self) -> LlamaNetwork:
    return LlamaNetwork(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @classmethod
  def random(cls, config: LlamaConfig, rng: jax.Array) -> 'LlamaModel':
    """Freshly initialised parameters (normal, stddev 0.02, as HF's Llama)."""
    return cls(config, _init_params(config, rng))

  @classmethod
  def load(cls, path: str, dtype: str = 'float32',
           config: LlamaConfig | None = None) -> 'LlamaModel':
    """A Hugging Face Llama checkpoint folder on the default device.

    Args:
      path: a local folder with config.json and model.safetensors (or
        model.safetensors.index.json and its shards); its tokenizer.json or
        tokenizer.model, if any, is fingerprinted.
      dtype: the parameters' and activations' dtype, 'float32' (default) or
        'bfloat16'.
      config: the config the arrays must fit (its dtype then wins over
        `dtype`); None reads the folder's config.json.

    Raises:
      FileNotFoundError: no config or weights.
      ValueError: a config that is not plain Llama, or arrays missing,
        unexpected, of the wrong shape or of an integer dtype (named).
    """
    config = LlamaConfig.from_hf(path, dtype) if config is None else config
    return cls(config, jax.device_put(hf.read_hf(path, config)), hf.tokenizer_fingerprint(path))

  def start(self, prompt_tokens: jax.Array, capacity: int,
            lengths: jax.Array | None = None) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """Prefills the prompts and returns a step function and its cache.

    Args:
      prompt_tokens: [B, P] int32, row b's prompt left-aligned in its first
        lengths[b] entries (whatever follows is ignored).
      capacity: static loop positions, e.g. `decoding.cache_length(max_decode_len,
        gamma)`; the buffers hold P - 1 more.
      lengths: [B] int32 prompt lengths in 1..P; None: every row is P long.

    Returns:
      `step_fn(tokens [B, K], cache) -> (logits [B, K, V] float32, cache)`
      and the cache at loop index 0, whose logits there are those after the
      whole prompt (the loop's token at position 0 is not read).
    """
    network, variables = self.network, {'params': self.params}
    if lengths is None:
      lengths = jnp.full(prompt_tokens.shape[:1], prompt_tokens.shape[1], jnp.int32)
    cache = network.apply(variables, prompt_tokens, lengths, capacity,
                          method=LlamaNetwork.prefill)

    def step_fn(tokens: jax.Array, cache: cache_lib.Cache):
      return network.apply(variables, tokens, cache, method=LlamaNetwork.decode)

    return step_fn, cache


@functools.partial(jax.jit, static_argnums=0)
def _init_params(config: LlamaConfig, rng: jax.Array) -> Any:
  return LlamaNetwork(config).init(rng, jnp.ones((1, 1), jnp.int32))['params']


def check_shared_vocabulary(target: LlamaModel, draft: LlamaModel, *,
                            allow_tokenizer_mismatch: bool = False) -> None:
  """Raises ValueError unless the draft can propose the target's tokens.

  Their vocabulary sizes must be equal (spec_decode.lm.check_pair: the loops
  compare p and q token by token). Where both checkpoints carry the same tokenizer file
  (tokenizer.json or tokenizer.model), its sha256 must match: the same ids
  must mean the same text. `allow_tokenizer_mismatch` skips the second check
  (e.g. for a tokenizer file re-serialised without changing the vocabulary).
  """
  lm.check_pair(target, draft)
  if allow_tokenizer_mismatch:
    return
  differ = hf.differing_tokenizers(target.tokenizer, draft.tokenizer)
  if differ:
    raise ValueError(f'the target and the draft have different {" and ".join(sorted(differ))} '
                     '(sha256): their token ids may mean different text; pass '
                     'allow_tokenizer_mismatch=True if they share the vocabulary all the same')


def _eos_id(config: LlamaConfig, eos_id: int | None) -> int:
  """eos_id, or the config's one EOS id (-1, none, when it has none)."""
  if eos_id is not None:
    return eos_id
  if len(config.eos_token_ids) > 1:
    raise ValueError(f'the config lists several EOS ids {config.eos_token_ids}: the loops stop '
                     'at one, pass eos_id')
  return config.eos_token_ids[0] if config.eos_token_ids else -1


def generate(model: LlamaModel, prompt_tokens: jax.Array, lengths: jax.Array | None,
             rng: jax.Array, *, max_decode_len: int,
             sampling: sampling_lib.SamplingParams | None = None, eos_id: int | None = None,
             check_finite: bool = True) -> decoding.DecodeOutput:
  """Baseline decoding after each row's prompt: one model call per token, compiled.

  Args:
    model: the model M_p.
    prompt_tokens: [B, P] int32 prompts, left-aligned (see LlamaModel.start).
    lengths: [B] int32 prompt lengths in 1..P, or None (every row P long).
    rng: one PRNG key, [B] keys (one stream per row), or an int seed.
    max_decode_len: static maximum number of generated tokens per row.
    sampling: traced temperature/top-k/top-p; greedy when None.
    eos_id: static id that ends a row; None: the config's EOS id (-1,
      never, if it has none).
    check_finite: static; see spec_decode.models.generate.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len]: the generated tokens
    alone (EOS included), 0 after `lengths`.

  Raises:
    ValueError: prompts or lengths of the wrong shape or out of range, a bad
      max_decode_len, or no eos_id for a config with several.
  """
  return lm.generate(model, prompt_tokens, lengths, rng, max_decode_len=max_decode_len,
                     eos_id=_eos_id(model.config, eos_id), sampling=sampling,
                     check_finite=check_finite)


def speculative_generate(target: LlamaModel, draft: LlamaModel, prompt_tokens: jax.Array,
                         lengths: jax.Array | None, rng: jax.Array, *, gamma: int,
                         max_decode_len: int, sampling: sampling_lib.SamplingParams | None = None,
                         draft_sampling: sampling_lib.SamplingParams | None = None,
                         lenience: float = 1.0, verification: str = 'token',
                         confidence_threshold: float | None = None,
                         verify_lengths: tuple[int, ...] | None = None,
                         eos_id: int | None = None, check_finite: bool = True,
                         allow_tokenizer_mismatch: bool = False) -> decoding.DecodeOutput:
  """Speculative decoding of target M_p with draft M_q after each row's prompt, compiled.

  Both models read the same prompts. The arguments past `gamma` are those of
  spec_decode.models.speculative_generate; the others are `generate`'s.

  Args:
    target: the model M_p whose distribution is sampled.
    draft: the approximation M_q, sharing the target's vocabulary
      (check_shared_vocabulary).
    prompt_tokens, lengths, rng, max_decode_len, sampling, eos_id,
      check_finite: as `generate` (eos_id from the target's config).
    gamma: static number of drafted tokens per iteration.
    draft_sampling, lenience, verification, confidence_threshold,
      verify_lengths: as spec_decode.models.speculative_generate.
    allow_tokenizer_mismatch: decode even if the checkpoints' tokenizer
      files differ.

  Returns:
    decoding.DecodeOutput, tokens [B, max_decode_len]: the generated tokens.

  Raises:
    ValueError: as `generate`, and for a draft of another vocabulary or
      tokenizer, a bad gamma, lenience, verification or confidence_threshold.
  """
  check_shared_vocabulary(target, draft, allow_tokenizer_mismatch=allow_tokenizer_mismatch)
  return lm.speculative_generate(
      target, draft, prompt_tokens, lengths, rng, gamma=gamma, max_decode_len=max_decode_len,
      eos_id=_eos_id(target.config, eos_id), sampling=sampling, draft_sampling=draft_sampling,
      lenience=lenience, verification=verification, confidence_threshold=confidence_threshold,
      verify_lengths=verify_lengths, check_finite=check_finite)
