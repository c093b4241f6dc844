"""Decoder-only pairs (spec_decode.lm, spec_decode.llama) over a device mesh, as T5's.

The same logical axis rules as spec_decode.sharding: a decoder-only model's
parameters carry T5X's names (`decoder/layers_0/mlp/wo/kernel` -> ('mlp',
'embed')) or Llama's (`layers_0/mlp/down_proj/kernel`, the same axes), and
its cache behind the prompts (`cache.PromptState`) holds [B, H, T, Dh]
buffers (Hkv heads for Llama) and [B] rows, which `sharding.cache_shardings`
lays out by rank. Over several processes the prompts, lengths and keys are
global arrays (spec_decode.multihost).

  mesh = sharding.make_mesh(model_parallel=8)
  target = lm_sharding.load_model(path, config, mesh, sharding.STANDARD_RULES)
  draft = lm_sharding.shard_model(lm.load_bundled('lm_draft'), mesh, sharding.DATA_PARALLEL_RULES)
  out = lm_sharding.decode(target, draft, prompts, lengths, keys, options)

  llama = lm_sharding.shard_model(LlamaModel.load('/ckpt/llama'), mesh, sharding.STANDARD_RULES)
"""

import functools
from typing import Any

import flax.struct
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode import lm
from spec_decode import sampling as sampling_lib
from spec_decode import sharding
from spec_decode.llama import LlamaConfig, LlamaModel
from spec_decode.t5.decoder_only import DecoderOnlyConfig


class _OnMesh:
  """What a decoder-only model laid out over a mesh adds: its shardings and a constrained cache.

  Mixed into a model dataclass with `mesh` and `rules` fields.
  """

  def shardings(self):
    """The model with its parameters' NamedShardings as leaves (jit's in_shardings)."""
    return self.replace(params=sharding.param_shardings(self.params, self.mesh, self.rules))

  def start(self, prompt_tokens: jax.Array, capacity: int, lengths: jax.Array | None = None):
    """The model's start, with the cache held to its shardings by every step."""
    return sharding.constrained(*super().start(prompt_tokens, capacity, lengths), self.mesh,
                                self.rules)


@flax.struct.dataclass
class ShardedDecoderOnlyModel(_OnMesh, lm.DecoderOnlyModel):
  """A DecoderOnlyModel laid out over a mesh by logical axis rules.

  Attributes:
    config, params: as DecoderOnlyModel; params placed by their rules.
    mesh: the device mesh; static.
    rules: this model's rules (`sharding.check_rules`); static.
  """

  mesh: Mesh = flax.struct.field(pytree_node=False)
  rules: sharding.Rules = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class ShardedLlamaModel(_OnMesh, LlamaModel):
  """A LlamaModel laid out over a mesh by logical axis rules (attributes as above)."""

  mesh: Mesh = flax.struct.field(pytree_node=False, kw_only=True)
  rules: sharding.Rules = flax.struct.field(pytree_node=False, kw_only=True)


Sharded = ShardedDecoderOnlyModel | ShardedLlamaModel


def shard_model(model: lm.DecoderOnlyModel | LlamaModel, mesh: Mesh,
                rules: sharding.Rules) -> Sharded:
  """A decoder-only model's parameters placed over `mesh` by `rules`."""
  rules = sharding.check_rules(rules)
  params = sharding.shard_params(model.params, mesh, rules)
  if isinstance(model, LlamaModel):
    return ShardedLlamaModel(model.config, params, model.tokenizer, mesh=mesh, rules=rules)
  return ShardedDecoderOnlyModel(model.config, params, mesh, rules)


def load_model(path: str, config: DecoderOnlyConfig | LlamaConfig, mesh: Mesh,
               rules: sharding.Rules, dtype=None) -> Sharded:
  """A decoder-only model's checkpoint over `mesh`, laid out by `rules`.

  A T5X checkpoint is read straight onto its shards (each host its own
  slices); orbax and Hugging Face (Llama) checkpoints are read whole on the
  host, then placed. `dtype` overrides a DecoderOnlyConfig's param_dtype; a
  LlamaConfig's dtype is its own.
  """
  if isinstance(config, LlamaConfig):
    return shard_model(LlamaModel.load(path, config=config), mesh, rules)
  rules = sharding.check_rules(rules)
  abstract = jax.eval_shape(functools.partial(lm.DecoderOnlyModel.random, config),
                            jax.random.key(0)).params
  params = checkpoints.load_params(path, config, dtype,
                                   shardings=sharding.param_shardings(abstract, mesh, rules))
  return ShardedDecoderOnlyModel(config, params, mesh, rules)


def decode(target: Sharded, draft: Sharded | None,
           prompt_tokens: jax.Array, lengths: jax.Array, rng: jax.Array,
           options: decoding.LoopOptions, *,
           sampling: sampling_lib.SamplingParams | None = None,
           draft_sampling: sampling_lib.SamplingParams | None = None,
           lenience: float | jax.Array = 1.0,
           confidence_threshold: float | jax.Array | None = None) -> decoding.DecodeOutput:
  """`lm.decode` over the target's mesh, compiled with each model's shardings.

  Args:
    target, draft: laid out by `shard_model` or `load_model` on one mesh
      (draft None: the baseline).
    prompt_tokens: [B, P] int32; lengths [B] int32; rng [B] keys or one key:
      rows split over `data` by the target's rules.
    options, sampling, draft_sampling, lenience, confidence_threshold: as `lm.decode`.

  Returns:
    decoding.DecodeOutput, rows split over `data`.
  """
  if draft is not None and draft.mesh != target.mesh:
    raise ValueError(f'the draft is on {draft.mesh}, the target on {target.mesh}: one mesh')
  mesh, rules = target.mesh, target.rules
  replicated = NamedSharding(mesh, PartitionSpec())
  rows = lambda x, what: sharding.batch_sharding(mesh, rules, jax.numpy.shape(x), what)
  in_shardings = (target.shardings(), None if draft is None else draft.shardings(),
                  rows(prompt_tokens, 'prompt_tokens'), rows(lengths, 'lengths'),
                  sharding.row_sharding(mesh, rules, rng), replicated, replicated, replicated,
                  None if confidence_threshold is None else replicated)
  jitted = jax.jit(_decode, static_argnums=0, in_shardings=in_shardings,
                   out_shardings=sharding.output_shardings(
                       target, jax.numpy.shape(prompt_tokens)[0], options))
  return jitted(options, target, draft, prompt_tokens, lengths, rng, sampling, draft_sampling,
                lenience, confidence_threshold)


def _decode(options, target, draft, prompt_tokens, lengths, rng, sampling, draft_sampling,
            lenience, confidence_threshold) -> Any:
  """lm.decode with its arguments in the order of `decode`'s in_shardings."""
  return lm.decode(target, draft, prompt_tokens, lengths, rng, options, sampling=sampling,
                   draft_sampling=draft_sampling, lenience=lenience,
                   confidence_threshold=confidence_threshold)
