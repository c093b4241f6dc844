"""Decoding over a device mesh: T5X's logical axes, jit with in/out shardings.

The devices form a `Mesh` with a `data` and a `model` axis (T5X's names). Each
array gets logical axis names from its place in the parameter tree or the cache
(`embed`, `mlp`, `heads`, `vocab`, `batch`, ...), and rules map each logical
axis to a mesh axis or to None (replicated), as T5X's partitioner does:

  STANDARD_RULES       batch -> data; vocab, mlp, heads, joined_kv -> model:
                       Megatron-style model parallelism, for the target.
  DATA_PARALLEL_RULES  batch -> data, parameters replicated: for a small draft.

A `ShardedT5Model` is a T5Model that knows its mesh and rules: its parameters lie
on their shards and its caches are constrained to theirs inside the loops.
`generate` and `speculative_generate` are those of `spec_decode.models`
jit-compiled with in/out shardings: parameters per their rules; inputs, PRNG keys
and outputs split by row over `data`. XLA's SPMD partitioner adds the
collectives: an all-reduce after each contraction over a sharded axis, never a
gather of a weight.

  mesh = make_mesh(model_parallel=8)
  target = load_model(xxl_path, t5_1_1('xxl'), mesh, STANDARD_RULES)
  draft = load_model(small_path, t5_1_1('small'), mesh, DATA_PARALLEL_RULES)
  out = speculative_generate(target, draft, inputs, jax.random.key(0), gamma=4,
                             max_decode_len=128)  # out.tokens [B, 128], rows over data
"""

import functools
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spec_decode import api_checks
from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import decoding
from spec_decode import drafting
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode.t5.config import T5Config

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


@flax.struct.dataclass
class ShardedT5Model(models.T5Model):
  """A T5Model laid out over a mesh by logical axis rules.

  Attributes:
    config: as T5Model.
    params: as T5Model, placed by `param_shardings(params, mesh, rules)`.
    mesh: the device mesh; static.
    rules: this model's rules (`check_rules`), for parameters and caches; static.
  """

  mesh: Mesh = flax.struct.field(pytree_node=False)
  rules: Rules = flax.struct.field(pytree_node=False)

  def with_panels(self) -> 'ShardedT5Model':
    """Itself: a mesh keeps XLA's products (see spec_decode.kernels)."""
    return self

  def shardings(self) -> 'ShardedT5Model':
    """The model with its parameters' NamedShardings as leaves (jit's in_shardings)."""
    return self.replace(params=param_shardings(self.params, self.mesh, self.rules))

  def start(self, encoder_input_tokens: jax.Array,
            capacity: int) -> tuple[decoding.StepFn, cache_lib.Cache]:
    """T5Model.start, with the cache held to its shardings by every step."""
    return constrained(*super().start(encoder_input_tokens, capacity), self.mesh, self.rules)


def constrained(step_fn: decoding.StepFn, cache: cache_lib.Cache, mesh: Mesh,
                rules: Rules) -> tuple[decoding.StepFn, cache_lib.Cache]:
  """A step function and its cache, the cache held to its shardings (`cache_shardings`)."""
  constrain = lambda c: jax.lax.with_sharding_constraint(c, cache_shardings(c, mesh, rules))

  def sharded_step_fn(tokens: jax.Array, cache: cache_lib.Cache):
    logits, cache = step_fn(tokens, cache)
    return logits, constrain(cache)

  return sharded_step_fn, constrain(cache)


def shard_model(model: models.T5Model, mesh: Mesh, rules: Rules) -> ShardedT5Model:
  """A T5Model's parameters placed over `mesh` by `rules`."""
  rules = check_rules(rules)
  return ShardedT5Model(model.config, shard_params(model.params, mesh, rules), mesh, rules)


def _abstract_params(config: T5Config) -> Any:
  """The parameter tree's ShapeDtypeStructs, without memory."""
  return jax.eval_shape(functools.partial(models.T5Model.random, config), jax.random.key(0)).params


def load_model(path: str, config: T5Config, mesh: Mesh, rules: Rules,
               dtype=None) -> ShardedT5Model:
  """Reads a checkpoint straight onto the shards `rules` give its arrays.

  A T5X checkpoint is read slice by slice: each host reads only what its own
  devices hold (`checkpoints.load_params` with shardings). Orbax and Hugging
  Face checkpoints are read whole on the host, then placed.

  Args:
    path: a T5X, orbax or Hugging Face checkpoint (see `checkpoints.load_params`).
    config: the model's T5Config.
    mesh: the device mesh.
    rules: the model's logical axis rules.
    dtype: parameter dtype; default config.param_dtype.
  """
  rules = check_rules(rules)
  shardings = param_shardings(_abstract_params(config), mesh, rules)
  params = checkpoints.load_params(path, config, dtype, shardings=shardings)
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


def _input_shardings(model: ShardedT5Model, encoder_input_tokens, rng) -> tuple:
  """in_shardings of (encoder_input_tokens, rng, sampling, prompt): knobs replicated."""
  mesh, rules = model.mesh, model.rules
  rows = batch_sharding(mesh, rules, jnp.shape(encoder_input_tokens), 'encoder_input_tokens')
  return rows, row_sharding(mesh, rules, rng), NamedSharding(mesh, PartitionSpec()), rows


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


def generate(model: ShardedT5Model, encoder_input_tokens: jax.Array, rng: jax.Array, *,
             max_decode_len: int, sampling: sampling_lib.SamplingParams | None = None,
             prompt: jax.Array | None = None, eos_id: int = 1,
             check_finite: bool = True) -> decoding.DecodeOutput:
  """`models.generate` over the model's mesh.

  Args:
    model: the model M_p, laid out by `shard_model` or `load_model`.
    encoder_input_tokens: [B, S] int32, 0 = padding; B splits over `data`.
    rng, max_decode_len, sampling, prompt, eos_id, check_finite: as
      `models.generate`.

  Returns:
    decoding.DecodeOutput, rows split over `data`.
  """
  encoder_input_tokens, prompt = api_checks.check_inputs(encoder_input_tokens, prompt,
                                                         model.vocab_size)
  options = decoding.LoopOptions(max_decode_len, eos_id=eos_id, check_finite=check_finite)
  return decode(model, None, encoder_input_tokens, api_checks.check_rng(rng), options,
                sampling=sampling, prompt=prompt)


def speculative_generate(target: ShardedT5Model, draft: ShardedT5Model,
                         encoder_input_tokens: jax.Array, rng: jax.Array, *, gamma: int,
                         max_decode_len: int, sampling: sampling_lib.SamplingParams | None = None,
                         draft_sampling: sampling_lib.SamplingParams | None = None,
                         lenience: float = 1.0, verification: str = 'token',
                         confidence_threshold: float | None = None,
                         verify_lengths: tuple[int, ...] | None = None,
                         prompt: jax.Array | None = None, eos_id: int = 1,
                         check_finite: bool = True) -> decoding.DecodeOutput:
  """`models.speculative_generate` over the models' mesh, each model by its rules.

  Args:
    target: the model M_p, laid out by `shard_model` or `load_model`.
    draft: the model M_q on the same mesh, usually by DATA_PARALLEL_RULES.
    encoder_input_tokens: [B, S] int32, 0 = padding; B splits over `data`
      (by the target's rules).
    rng, gamma, max_decode_len, sampling, draft_sampling, lenience, verification,
      confidence_threshold, verify_lengths, prompt, eos_id, check_finite: as
      `models.speculative_generate`.

  Returns:
    decoding.DecodeOutput, rows split over `data`.
  """
  if draft.mesh != target.mesh:
    raise ValueError(f'the draft is on {draft.mesh}, the target on {target.mesh}: one mesh')
  encoder_input_tokens, prompt = api_checks.check_inputs(encoder_input_tokens, prompt,
                                                         target.vocab_size)
  speculative.check_lenience(lenience)
  drafting.check_threshold(confidence_threshold)
  options = decoding.LoopOptions(max_decode_len, decoding.check_size('gamma', gamma),
                                 verification, verify_lengths, eos_id, check_finite)
  return decode(target, draft, encoder_input_tokens, api_checks.check_rng(rng), options,
                sampling=sampling, draft_sampling=draft_sampling, lenience=lenience,
                confidence_threshold=confidence_threshold, prompt=prompt)


def decode(target: ShardedT5Model, draft: ShardedT5Model | None, encoder_input_tokens: jax.Array,
           rng: jax.Array, options: decoding.LoopOptions, *,
           sampling: sampling_lib.SamplingParams | None = None,
           draft_sampling: sampling_lib.SamplingParams | None = None,
           lenience: float | jax.Array = 1.0,
           confidence_threshold: float | jax.Array | None = None,
           prompt: jax.Array | None = None) -> decoding.DecodeOutput:
  """`models.decode` over the target's mesh, compiled with each model's shardings.

  Args:
    target, draft, encoder_input_tokens, rng, options, sampling,
      draft_sampling, lenience, confidence_threshold, prompt: as
      `models.decode` (draft None: the baseline); rows split over `data`.

  Returns:
    decoding.DecodeOutput, rows split over `data`.
  """
  replicated = NamedSharding(target.mesh, PartitionSpec())
  in_shardings = (target.shardings(), None if draft is None else draft.shardings(),
                  *_input_shardings(target, encoder_input_tokens, rng), replicated, replicated,
                  None if confidence_threshold is None else replicated)
  jitted = jax.jit(_decode, static_argnums=0, in_shardings=in_shardings,
                   out_shardings=output_shardings(target, jnp.shape(encoder_input_tokens)[0],
                                                   options))
  return jitted(options, target, draft, encoder_input_tokens, rng, sampling, prompt,
                draft_sampling, lenience, confidence_threshold)


def _decode(options, target, draft, encoder_input_tokens, rng, sampling, prompt, draft_sampling,
            lenience, confidence_threshold):
  """models.decode with its arguments in the order of `decode`'s in_shardings."""
  return models.decode(target, draft, encoder_input_tokens, rng, options, sampling=sampling,
                       draft_sampling=draft_sampling, lenience=lenience,
                       confidence_threshold=confidence_threshold, prompt=prompt)
