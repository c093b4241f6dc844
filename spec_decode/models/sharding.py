"""Decoding over a device mesh: T5X's logical axes, jit with in/out shardings.

The devices form a `Mesh` with a `data` and a `model` axis (T5X's names). Each
array gets logical axis names from its place in the parameter tree or the cache
(`embed`, `mlp`, `heads`, `vocab`, `batch`, ...), and rules map each logical
axis to a mesh axis or to None (replicated), as T5X's partitioner does:

  STANDARD_RULES       batch -> data; vocab, mlp, heads, joined_kv -> model:
                       Megatron-style model parallelism, for the target.
  DATA_PARALLEL_RULES  batch -> data, parameters replicated: for a small draft.

A sharded model (`ShardedT5Model`, `ShardedDecoderOnlyModel`,
`ShardedLlamaModel`) is a model that carries its mesh and rules: its
parameters lie on their shards and its caches are constrained to theirs
inside the loops. The front ends (spec_decode.models.front_ends) compile such
a target with in/out shardings (`input_shardings`, `output_shardings`):
parameters per their rules; inputs, PRNG keys and outputs split by row over
`data`. XLA's SPMD partitioner adds the collectives: an all-reduce after each
contraction over a sharded axis, never a gather of a weight. Decoder-only
parameters carry T5X's names (`decoder/layers_0/mlp/wo/kernel`) or Llama's
(`layers_0/mlp/down_proj/kernel`, the same axes); their caches behind the
prompts (`cache.PromptState`) are laid out by rank as T5's. Over several
processes the inputs and keys are global arrays (spec_decode.multihost).

  mesh = make_mesh(model_parallel=8)
  target = load_model(xxl_path, t5_1_1('xxl'), mesh, STANDARD_RULES)
  draft = load_model(small_path, t5_1_1('small'), mesh, DATA_PARALLEL_RULES)
  out = spec_decode.speculative_generate(target, draft, inputs, jax.random.key(0), gamma=4,
                                         max_decode_len=128)  # rows over data
"""

import functools
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode.llama.config import LlamaConfig
from spec_decode.models import protocol
from spec_decode.models.decoder_only import DecoderOnlyModel
from spec_decode.models.llama import LlamaModel
from spec_decode.models.t5 import T5Model
from spec_decode.t5.config import T5Config
from spec_decode.t5.decoder_only import DecoderOnlyConfig

DATA, MODEL = 'data', 'model'
Rules = tuple[tuple[str, str | None], ...]

# t5x.partitioning.standard_logical_axis_rules() for a (data, model) mesh.
STANDARD_RULES: Rules = (
    ('batch', DATA), ('vocab', MODEL), ('embed', None), ('mlp', MODEL), ('heads', MODEL),
    ('kv', None), ('joined_kv', MODEL), ('relpos_buckets', None), ('length', None))
LOGICAL_AXES = tuple(name for name, _ in STANDARD_RULES)
DATA_PARALLEL_RULES: Rules = tuple((name, DATA if name == 'batch' else None)
                                   for name in LOGICAL_AXES)

# Parameters by the last two names of their path (plus `*/scale`, every norm: ('embed',)).
_PARAM_AXES = {
    'query/kernel': ('embed', 'joined_kv'),  # [E, H * Dh]
    'key/kernel': ('embed', 'joined_kv'),
    'value/kernel': ('embed', 'joined_kv'),
    'out/kernel': ('joined_kv', 'embed'),  # [H * Dh, E]
    'wi_0/kernel': ('embed', 'mlp'),  # [E, F]
    'wi_1/kernel': ('embed', 'mlp'),
    'wo/kernel': ('mlp', 'embed'),  # [F, E]
    'token_embedder/embedding': ('vocab', 'embed'),  # [V, E]
    'logits_dense/kernel': ('embed', 'vocab'),  # [E, V]
    'relpos_bias/rel_embedding': ('heads', 'relpos_buckets'),  # [H, 32]
    # Llama's names (spec_decode.llama.network) for the same roles.
    'q_proj/kernel': ('embed', 'joined_kv'),  # [E, H * Dh]
    'k_proj/kernel': ('embed', 'joined_kv'),  # [E, Hkv * Dh]
    'v_proj/kernel': ('embed', 'joined_kv'),
    'o_proj/kernel': ('joined_kv', 'embed'),  # [H * Dh, E]
    'gate_proj/kernel': ('embed', 'mlp'),  # [E, F]
    'up_proj/kernel': ('embed', 'mlp'),
    'down_proj/kernel': ('mlp', 'embed'),  # [F, E]
    'embed_tokens/embedding': ('vocab', 'embed'),  # [V, E]
    'lm_head/kernel': ('embed', 'vocab'),  # [E, V]
}
# Cache arrays by rank: index [B], encoder_mask [B, S], keys/values [B, H, T, Dh].
_CACHE_AXES = {1: ('batch',), 2: ('batch', 'length'), 4: ('batch', 'heads', 'length', 'kv')}


def make_mesh(model_parallel: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """The (data, model) mesh: `model_parallel` devices per model replica.

  Args:
    model_parallel: size of the `model` axis; it must divide the device count.
    devices: the devices, default all (`jax.devices()`, every host's).

  Returns:
    A Mesh of shape (len(devices) // model_parallel, model_parallel), laid out
    along the physical topology (TPU ICI rings) by `jax.make_mesh`.
  """
  devices = list(jax.devices() if devices is None else devices)
  if not isinstance(model_parallel, int) or model_parallel < 1 or len(devices) % model_parallel:
    raise ValueError(f'model_parallel must be a positive divisor of the {len(devices)} devices, '
                     f'got {model_parallel!r}')
  return jax.make_mesh((len(devices) // model_parallel, model_parallel), (DATA, MODEL),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)


def check_rules(rules: Sequence[Sequence[str | None]]) -> Rules:
  """Rules as a hashable tuple; ValueError for an unknown logical or mesh axis name.

  A logical axis without a rule is replicated (flax's semantics).
  """
  rules = tuple((logical, mesh_axis) for logical, mesh_axis in rules)
  for logical, mesh_axis in rules:
    if logical not in LOGICAL_AXES or mesh_axis not in (DATA, MODEL, None):
      raise ValueError(f'bad rule ({logical!r}, {mesh_axis!r}): logical axes are {LOGICAL_AXES}, '
                       f'mesh axes {DATA!r}, {MODEL!r} or None')
  return rules


def param_axes(name: str) -> tuple[str, ...]:
  """Logical axes of a parameter, e.g. 'decoder/layers_0/mlp/wo/kernel' -> ('mlp', 'embed')."""
  if name.endswith('/scale'):
    return ('embed',)
  axes = _PARAM_AXES.get('/'.join(name.split('/')[-2:]))
  if axes is None:
    raise ValueError(f'no logical axes for parameter {name}')
  return axes


def _spec(axes: tuple[str, ...], shape: tuple[int, ...], mesh_shape: Mapping[str, int],
          rules: Rules, what: str) -> PartitionSpec:
  """Logical axes -> PartitionSpec; ValueError naming `what` if a dimension does not split."""
  spec = nn.logical_to_mesh_axes(axes, rules)
  for dim, axis, entry in zip(shape, axes, spec):
    if dim % _ways(entry, mesh_shape):
      raise ValueError(f'{what} {tuple(shape)}: dimension {dim} ({axis} -> {entry}) does not '
                       f'split {_ways(entry, mesh_shape)} ways')
  return spec


def _ways(entry: str | None, mesh_shape: Mapping[str, int]) -> int:
  """Shards of one dimension whose PartitionSpec entry is `entry` (a mesh axis or None)."""
  return 1 if entry is None else mesh_shape[entry]


def _param_spec(path, x, mesh_shape: Mapping[str, int], rules: Rules) -> PartitionSpec:
  name = jax.tree_util.keystr(path, simple=True, separator='/')
  return _spec(param_axes(name), x.shape, mesh_shape, rules, f'parameter {name}')


def param_shardings(params: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings of a parameter tree in T5X layout (arrays or ShapeDtypeStructs)."""
  rules = check_rules(rules)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, _param_spec(path, x, mesh.shape, rules)), params)


def shard_params(params: Any, mesh: Mesh, rules: Rules) -> Any:
  """The parameters placed on their shards (`jax.device_put`)."""
  return jax.device_put(params, param_shardings(params, mesh, rules))


def cache_shardings(cache: cache_lib.Cache, mesh: Mesh, rules: Rules) -> cache_lib.Cache:
  """NamedShardings of a T5 decoder cache (arrays or ShapeDtypeStructs).

  Self- and cross-attention buffers [B, H, T, Dh] are (batch, heads, length,
  kv); the encoder mask [B, S] is (batch, length); the index [B] is (batch,).
  """
  return jax.tree.map(
      lambda x: NamedSharding(mesh, _spec(_CACHE_AXES[x.ndim], x.shape, mesh.shape, rules,
                                          'cache array')), cache)


def batch_sharding(mesh: Mesh, rules: Rules, shape: tuple[int, ...],
                   what: str = 'input') -> NamedSharding:
  """Rows (axis 0) split as `batch`, other axes replicated, e.g. tokens [B, S]."""
  return NamedSharding(mesh, _spec(('batch',) + (None,) * (len(shape) - 1), shape, mesh.shape,
                                   rules, what))


class _OnMesh:
  """What a model laid out over a mesh adds: its shardings and a constrained cache.

  Mixed into a model dataclass with `mesh` and `rules` fields.
  """

  def with_panels(self, output_layer: bool = True):  # pylint: disable=unused-argument
    """Itself: a mesh keeps XLA's products (see spec_decode.kernels)."""
    return self

  def shardings(self):
    """The model with its parameters' NamedShardings as leaves (jit's in_shardings)."""
    return self.replace(params=param_shardings(self.params, self.mesh, self.rules))

  def start(self, batch: protocol.Batch, capacity: int):
    """The model's start, with the cache held to its shardings by every step."""
    return constrained(*super().start(batch, capacity), self.mesh, self.rules)


@flax.struct.dataclass
class ShardedT5Model(_OnMesh, T5Model):
  """A T5Model laid out over a mesh by logical axis rules.

  Attributes:
    config: as T5Model.
    params: as T5Model, placed by `param_shardings(params, mesh, rules)`.
    mesh: the device mesh; static.
    rules: this model's rules (`check_rules`), for parameters and caches; static.
  """

  mesh: Mesh = flax.struct.field(pytree_node=False)
  rules: Rules = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class ShardedDecoderOnlyModel(_OnMesh, DecoderOnlyModel):
  """A DecoderOnlyModel laid out over a mesh by logical axis rules (attributes as above)."""

  mesh: Mesh = flax.struct.field(pytree_node=False)
  rules: Rules = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class ShardedLlamaModel(_OnMesh, LlamaModel):
  """A LlamaModel laid out over a mesh by logical axis rules (attributes as above)."""

  mesh: Mesh = flax.struct.field(pytree_node=False, kw_only=True)
  rules: Rules = flax.struct.field(pytree_node=False, kw_only=True)


def constrained(step_fn: decoding.StepFn, cache: cache_lib.Cache, mesh: Mesh,
                rules: Rules) -> tuple[decoding.StepFn, cache_lib.Cache]:
  """A step function and its cache, the cache held to its shardings (`cache_shardings`)."""
  constrain = lambda c: jax.lax.with_sharding_constraint(c, cache_shardings(c, mesh, rules))

  def sharded_step_fn(tokens: jax.Array, cache: cache_lib.Cache):
    logits, cache = step_fn(tokens, cache)
    return logits, constrain(cache)

  return sharded_step_fn, constrain(cache)


def shard_model(model: T5Model | DecoderOnlyModel | LlamaModel, mesh: Mesh, rules: Rules):
  """A model's parameters placed over `mesh` by `rules`: its sharded class."""
  rules = check_rules(rules)
  params = shard_params(model.params, mesh, rules)
  if isinstance(model, LlamaModel):
    return ShardedLlamaModel(model.config, params, model.tokenizer, mesh=mesh, rules=rules)
  if isinstance(model, DecoderOnlyModel):
    return ShardedDecoderOnlyModel(model.config, params, mesh, rules)
  return ShardedT5Model(model.config, params, mesh, rules)


def _abstract_params(config: T5Config | DecoderOnlyConfig) -> Any:
  """The parameter tree's ShapeDtypeStructs, without memory."""
  family = DecoderOnlyModel if isinstance(config, DecoderOnlyConfig) else T5Model
  return jax.eval_shape(functools.partial(family.random, config), jax.random.key(0)).params


def load_model(path: str, config: T5Config | DecoderOnlyConfig | LlamaConfig, mesh: Mesh,
               rules: Rules, dtype=None):
  """Reads a checkpoint straight onto the shards `rules` give its arrays.

  A T5X checkpoint is read slice by slice: each host reads only what its own
  devices hold (`checkpoints.load_params` with shardings). Orbax and Hugging
  Face checkpoints (Llama's too) are read whole on the host, then placed.

  Args:
    path: a T5X, orbax or Hugging Face checkpoint (see `checkpoints.load_params`).
    config: the model's T5Config, DecoderOnlyConfig or LlamaConfig.
    mesh: the device mesh.
    rules: the model's logical axis rules.
    dtype: parameter dtype; default config.param_dtype (a LlamaConfig's
      dtype is its own).
  """
  if isinstance(config, LlamaConfig):
    return shard_model(LlamaModel.load(path, config=config), mesh, rules)
  rules = check_rules(rules)
  shardings = param_shardings(_abstract_params(config), mesh, rules)
  params = checkpoints.load_params(path, config, dtype, shardings=shardings)
  if isinstance(config, DecoderOnlyConfig):
    return ShardedDecoderOnlyModel(config, params, mesh, rules)
  return ShardedT5Model(config, params, mesh, rules)


def per_device_param_bytes(config: T5Config, mesh_shape: Mapping[str, int],
                           rules: Rules) -> int:
  """Parameter bytes each device holds (`jax.eval_shape`: nothing is allocated).

  Args:
    config: the model; parameters in config.param_dtype.
    mesh_shape: mesh axis sizes, e.g. {'data': 1, 'model': 8} (or `mesh.shape`).
    rules: logical axis rules.
  """
  rules = check_rules(rules)

  def shard_bytes(path, x):
    spec = _param_spec(path, x, mesh_shape, rules)
    ways = math.prod(_ways(entry, mesh_shape) for entry in spec)
    return math.prod(x.shape) // ways * x.dtype.itemsize

  return sum(jax.tree.leaves(jax.tree_util.tree_map_with_path(
      shard_bytes, _abstract_params(config))))


def row_sharding(mesh: Mesh, rules: Rules, rng: jax.Array) -> NamedSharding:
  """One PRNG key is replicated; [B] keys (or [B, 2] raw key data) split by row."""
  one_key_ndim = 0 if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else 1
  if rng.ndim == one_key_ndim:
    return NamedSharding(mesh, PartitionSpec())
  return batch_sharding(mesh, rules, rng.shape, 'rng')


def input_shardings(model: Any, batch: protocol.Batch, rng: jax.Array) -> tuple:
  """in_shardings of (batch, rng): every array of the batch and [B] keys split by row."""
  mesh, rules = model.mesh, model.rules
  rows = lambda x, what: None if x is None else batch_sharding(mesh, rules, jnp.shape(x), what)
  return (batch.replace(tokens=rows(batch.tokens, 'inputs'), lengths=rows(batch.lengths, 'lengths'),
                        prompt=rows(batch.prompt, 'prompt')),
          row_sharding(mesh, rules, rng))


def output_shardings(model: Any, batch: int,
                     options: decoding.LoopOptions) -> decoding.DecodeOutput:
  """out_shardings of a DecodeOutput: per-row fields split, loop totals replicated.

  Args:
    model: a sharded model (its `mesh` and `rules`).
    batch: B.
    options: the loop's static options.
  """
  rows = batch_sharding(model.mesh, model.rules, (batch,))
  replicated = NamedSharding(model.mesh, PartitionSpec())
  return decoding.DecodeOutput(
      tokens=batch_sharding(model.mesh, model.rules, (batch, options.max_decode_len)),
      lengths=rows, generated=rows, target_calls=rows, draft_calls=rows,
      accept_histogram=replicated, loop_target_calls=replicated, loop_draft_calls=replicated,
      nonfinite=rows if options.check_finite else None, draft_histogram=replicated)
