"""CPU kernels for the products of a few rows: a verify pass priced closer to one step.

The paper's speedup rests on scoring gamma + 1 positions in about the time of
one, because a decoding step is bound by reading the weights. XLA:CPU
multiplies one row by a weight matrix as a GEMV, but 2-16 rows as a GEMM that
packs the weights on every call (on the EPYC machines measured, 4 rows of the
demo target cost 2.2 single steps). `dense` multiplies 1..16 rows in one pass
over the weights (dense.cc, compiled on first use by spec_decode.kernels.build
and registered through the XLA FFI).

`dense_panels` is the same product from weights packed once into contiguous
64-column panels (`pack`), for 1..256 rows: a T5 model's kernels are packed
when it is made or first decodes (`models.T5Model.with_panels`), so a step
reads each matrix as one stream, about twice as fast as rows read 128 bytes
at a time, and bitwise the same result; an encoder over up to 256 tokens
takes it too (faster than XLA's GEMM on the machines measured, in groups of 6
rows per pass over weights held in L2).

`attention` computes a decoding step's attention over the cache for 1..16
query positions in one call (dot products, bias, softmax, weighted sum;
attention.cc): XLA:CPU runs the batched products of 2..16 positions as small
GEMMs, most of what a demo-size verify call cost beyond one position.

`dot_general` is `lax.dot_general` with that kernel where it applies, and the
T5 layers' `Dense` (t5.layers) takes it, or `dense_panels` where the variables
hold panels: float32 operands, 1..16 rows (1..256 from panels), the default backend a CPU and a
single device (a mesh keeps XLA's products, which its partitioner can split).
Everything else, accelerators and training batches included, is XLA's as
before; `t5.layers.MultiHeadAttention` takes
`attention` where `attention_applies` (float32, head width a multiple of 16,
no dropout). The baseline's one-row steps run the same kernels as the verify
pass, and a row's (a query's) result does not depend on how many share the
call.

  SPEC_DECODE_CPU_KERNELS=0   XLA's products and attention everywhere (read when a function
                              is traced: set it before the process starts); 1 (or unset):
                              the kernels. Any other value is an error naming the variable
                              (also false/off/no and true/on/yes are accepted).

`embed` looks up embedding rows as float32 (t5.layers.Embed computing in
float32), a float32 or bfloat16 table, without XLA's threaded gather or its
widening of a whole bfloat16 table.

`kernels.distributions` holds sampling's row kernels: softmax, argmax, and
top-k's and top-p's truncation thresholds (distributions.cc), which
`spec_decode.sampling` takes under the same switch.

Where no compiler, no library or no writable cache folder is available (see
`build`) the first product to want the kernel warns once and XLA's products
are used.
"""

import functools
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from spec_decode.kernels import build

MAX_ROWS = 16
PANEL_MAX_ROWS = 256  # products from panels: a step's rows, or an encoder's tokens
SWITCH = 'SPEC_DECODE_CPU_KERNELS'


_OFF, _ON = ('0', 'false', 'off', 'no'), ('1', 'true', 'on', 'yes', '')


def enabled() -> bool:
  """False when the environment turns the kernels off (SPEC_DECODE_CPU_KERNELS=0).

  Raises:
    ValueError: SPEC_DECODE_CPU_KERNELS holds another value than 0 or 1 (or
      false/off/no, true/on/yes), which would otherwise read as one of them.
  """
  value = os.environ.get(SWITCH, '1')
  if value.strip().lower() in _OFF:
    return False
  if value.strip().lower() in _ON:
    return True
  raise ValueError(f'{SWITCH}={value!r}: set it to 0 (XLA\'s products and attention) or 1 (the '
                   'CPU kernels, the default), or unset it')


@functools.cache
def available() -> bool:
  """Whether the kernels are built and registered; warns once (and says why) if not."""
  try:
    build.load()
  except build.BuildError as e:
    warnings.warn(f'spec_decode CPU kernels unavailable, XLA\'s products are used instead: {e}',
                  RuntimeWarning, stacklevel=2)
    return False
  return True


def in_use() -> bool:
  """Whether the kernels run here: switched on, a single CPU device, built (warns once if not)."""
  return (enabled() and jax.default_backend() == 'cpu' and jax.device_count() == 1
          and available())


def applies(x: jax.Array, w: jax.Array, max_rows: int = MAX_ROWS) -> bool:
  """Whether `dense(x, w)` runs the kernel (`dense_panels` up to PANEL_MAX_ROWS rows)."""
  rows = math.prod(x.shape[:-1])
  return (x.dtype == w.dtype == jnp.float32 and w.ndim == 2 and x.shape[-1] == w.shape[0]
          and 1 <= rows <= max_rows and in_use())


@jax.custom_vjp
def dense(x: jax.Array, w: jax.Array) -> jax.Array:
  """x @ w by the kernel: x [..., in] with 1..16 rows in all, w [in, out], float32 -> [..., out].

  Differentiable (the gradients are XLA's products); under vmap each mapped
  slice is a call of its own.
  """
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (w.shape[1],), jnp.float32)
  return jax.ffi.ffi_call('spec_decode_dense', out, vmap_method='sequential')(x, w)


def _dense_forward(x, w):
  return dense(x, w), (x, w)


def _dense_backward(residuals, dy):
  x, w = residuals
  dx = jnp.einsum('...o,io->...i', dy, w)
  dw = jnp.einsum('...i,...o->io', x, dy)
  return dx, dw


dense.defvjp(_dense_forward, _dense_backward)


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
                preferred_element_type=None) -> jax.Array:
  """`lax.dot_general`, by `dense` for nn.Dense's product where the kernel applies."""
  (lhs_contract, rhs_contract), batch = dimension_numbers
  if (tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
      and not any(batch) and preferred_element_type in (None, jnp.float32)
      and applies(lhs, rhs)):
    return dense(lhs, rhs)
  return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                         preferred_element_type=preferred_element_type)



PANEL = 64
PANELS = 'panels'  # the flax collection that holds packed copies of kernels


def pack(w: jax.Array, dtype=jnp.float32) -> jax.Array:
  """w [in, out] -> panels [ceil(out / 64), in, 64] in `dtype`, zero columns past out.

  A bfloat16 panel row holds its columns interleaved by 32 (see below).

  The layout `dense_panels` streams: each 64-column panel is contiguous, so a
  product reads the weights in one stream instead of 128-byte pieces of every
  row (about twice as fast on the machines measured). Packed once per model
  (`models.T5Model.with_panels`), never per step. bfloat16 panels halve what
  a step reads; they give the float32 product bitwise only for weights that
  bfloat16 holds exactly (`exact_in_bfloat16`), e.g. a bfloat16 checkpoint's.
  A numpy `w` is packed by numpy (no XLA program to compile per shape), into
  a numpy array.
  """
  xp = np if isinstance(w, np.ndarray) else jnp
  width, out = w.shape
  count = -(-out // PANEL)
  padded = xp.pad(w, ((0, 0), (0, count * PANEL - out))).astype(dtype)
  if jnp.dtype(dtype) == jnp.bfloat16:
    # Each 32 columns interleaved, [0, 16, 1, 17, ..., 15, 31]: a 32-bit lane holds two
    # weights, the kernel widens each half with one operation (dense.cc, LoadRow).
    return xp.transpose(padded.reshape(width, count, 2, 2, 16), (1, 0, 2, 4, 3)).reshape(
        count, width, PANEL)
  return xp.transpose(padded.reshape(width, count, PANEL), (1, 0, 2))


def exact_in_bfloat16(w: jax.Array | np.ndarray) -> bool:
  """Whether every element of float32 `w` is a bfloat16 value (a concrete array)."""
  w = np.asarray(w)
  return bool(np.array_equal(w.astype(jnp.bfloat16).astype(w.dtype), w))


def variables(params: Any, panels: Any) -> dict:
  """A flax module's variables: {'params': params}, and PANELS where `panels` is not None."""
  return {'params': params} if panels is None else {'params': params, PANELS: panels}


def pack_weights(w: jax.Array | np.ndarray) -> jax.Array:
  """`pack` of concrete weights [in, out], on the host, onto the default device.

  In bfloat16 where bfloat16 holds every weight exactly (the same products
  from half the bytes), else in float32.
  """
  w = np.asarray(w)
  dtype = jnp.bfloat16 if exact_in_bfloat16(w) else jnp.float32
  return jax.device_put(np.ascontiguousarray(pack(w, dtype)))


def pack_tree(params: Any, select: Callable[[tuple[str, ...]], bool],
              fused: Callable[[tuple[str, ...]], dict[str, tuple[str, ...]]] | None = None
              ) -> dict:
  """`pack_weights` of each 2-D leaf of a nested-dict tree whose key path `select` takes.

  Kernels of sibling modules that multiply the same input can be packed side
  by side, as one product: `fused(path)` maps names to sibling names for the
  node at `path` (e.g. {'qkv': ('query', 'key', 'value')}); where the node
  holds all of those modules and `select` takes their kernels, its panels
  hold `pack_weights(concatenate(kernels, axis=1))` under that name instead
  of the parts (each output column is the same sum either way).

  Returns:
    The nested dict of those panels alone, under the same keys (a flax
    collection beside 'params').
  """
  packed = {}

  def put(names, w):
    node = packed
    for name in names[:-1]:
      node = node.setdefault(name, {})
    node[names[-1]] = pack_weights(w)

  def walk(node, names):
    done = set()
    for name, parts in (fused(names) if fused else {}).items():
      paths = [names + (part, 'kernel') for part in parts]
      if all(isinstance(node.get(part), Mapping) and jnp.ndim(node[part].get('kernel')) == 2
             and select(path) for part, path in zip(parts, paths)):
        put(names + (name,), np.concatenate([np.asarray(node[part]['kernel'])
                                             for part in parts], axis=1))
        done.update(parts)
    for key, child in node.items():
      if key in done:
        continue
      if isinstance(child, Mapping):
        walk(child, names + (key,))
      elif jnp.ndim(child) == 2 and select(names + (key,)):
        put(names + (key,), np.asarray(child))

  walk(params, ())
  return packed


def packing_pays(params: Any) -> bool:
  """Whether packed copies of `params` would be used: kernels on, one CPU device, float32 arrays.

  Or bfloat16 arrays (a model with bfloat16 weights that computes in float32):
  their panels are bfloat16 (`pack_weights`), and a product reads them
  instead of casting its weights to float32. jax.Arrays only: they cannot
  change after packing (a numpy array could).
  """
  leaves = jax.tree_util.tree_leaves(params)
  return (bool(leaves) and all(isinstance(leaf, jax.Array)
                               and not isinstance(leaf, jax.core.Tracer)
                               and leaf.dtype in (jnp.float32, jnp.bfloat16) for leaf in leaves)
          and in_use())


def panels_apply(x: jax.Array, panels: jax.Array, w: jax.Array) -> bool:
  """Whether `dense_panels(x, panels, w)` runs the kernel: as `applies`, up to 256 rows."""
  return (panels.dtype in (jnp.float32, jnp.bfloat16)
          and panels.shape == (-(-w.shape[1] // PANEL), w.shape[0], PANEL)
          and applies(x, w, PANEL_MAX_ROWS))


@jax.custom_vjp
def dense_panels(x: jax.Array, panels: jax.Array, w: jax.Array) -> jax.Array:
  """x @ w by the kernel from `panels = pack(w, dtype)`; bitwise `dense(x, w)` if they hold w.

  Args:
    x: [..., in], 1..256 rows in all, float32.
    panels: pack(w, dtype), [ceil(out / 64), in, 64] float32 or bfloat16.
    w: [in, out] float32, for the gradients (XLA's products) and the shape.

  Returns:
    [..., out] float32.
  """
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (w.shape[1],), jnp.float32)
  target = 'spec_decode_dense_panels' + ('_bf16' if panels.dtype == jnp.bfloat16 else '')
  return jax.ffi.ffi_call(target, out, vmap_method='sequential')(x, panels)


def _dense_panels_forward(x, panels, w):
  return dense_panels(x, panels, w), (x, panels, w)


def _dense_panels_backward(residuals, dy):
  x, panels, w = residuals
  dx, dw = _dense_backward((x, w), dy)
  return dx, jnp.zeros_like(panels), dw


dense_panels.defvjp(_dense_panels_forward, _dense_panels_backward)


def embed_applies(table: jax.Array, ids: jax.Array) -> bool:
  """Whether `embed(table, ids)` runs the kernel: a float32 or bfloat16 table [V, E], integer ids."""
  return (table.ndim == 2 and table.dtype in (jnp.float32, jnp.bfloat16)
          and jnp.issubdtype(ids.dtype, jnp.integer) and in_use())


def _embed_reference(table, ids):
  """`embed` in XLA: negative ids are outside too (jnp.take would wrap them)."""
  return jnp.take(table, jnp.where(ids < 0, table.shape[0], ids), axis=0,
                  mode='fill').astype(jnp.float32)


@jax.custom_vjp
def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
  """Rows `ids` of a table as float32, by the kernel (dense.cc).

  jnp.take(table, ids, axis=0).astype(float32), bitwise: a row of NaNs for an
  id outside 0..V-1 (take's fill; negative ids are not wrapped here). XLA:CPU
  splits the gather of a decoding step's few rows across its threads, and
  widens a bfloat16 table whole before it on every call (a decoding loop's
  call included; T5 1.1 small's 32128 x 512: ~12 ms).

  Args:
    table: [V, E] float32 or bfloat16.
    ids: [...] integer.

  Returns:
    [..., E] float32. Differentiable in `table` (XLA's gradient).
  """
  out = jax.ShapeDtypeStruct(ids.shape + (table.shape[1],), jnp.float32)
  target = 'spec_decode_embed' + ('_bf16' if table.dtype == jnp.bfloat16 else '')
  return jax.ffi.ffi_call(target, out, vmap_method='sequential')(table, ids.astype(jnp.int32))


def _embed_forward(table, ids):
  return embed(table, ids), (table, ids)


def _embed_backward(residuals, dy):
  table, ids = residuals
  return jax.vjp(lambda t: _embed_reference(t, ids), table)[1](dy)[0], None


embed.defvjp(_embed_forward, _embed_backward)


def _attention_reference(query, key, value, bias):
  """XLA's attention, the same function as `attention`: see there for the shapes."""
  scores = jnp.einsum('blhd,bhtd->bhlt', query, key, preferred_element_type=jnp.float32)
  weights = jax.nn.softmax(scores + bias, axis=-1)
  return jnp.einsum('bhlt,bhtd->blhd', weights, value)


def attention_applies(query: jax.Array, key: jax.Array, value: jax.Array,
                      bias: jax.Array) -> bool:
  """Whether `attention(query, key, value, bias)` runs the kernel (see `attention`)."""
  b, length, h, depth = query.shape
  bias_ok = bias.ndim == 4 and all(
      n in (1, full) for n, full in zip(bias.shape, (b, h, length, key.shape[2])))
  return (query.ndim == 4 and key.ndim == 4 and key.shape == value.shape
          and key.shape[:2] == (b, h) and key.shape[3] == depth and depth % 16 == 0
          and 1 <= length <= MAX_ROWS and bias_ok and bias.shape[3] == key.shape[2]
          and all(a.dtype == jnp.float32 for a in (query, key, value, bias)) and in_use())


@jax.custom_vjp
def attention(query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array) -> jax.Array:
  """softmax(q . k + bias) v by the kernel, all float32.

  Args:
    query: [B, L, H, Dh], 1 <= L <= 16, Dh a multiple of 16.
    key: [B, H, T, Dh].
    value: [B, H, T, Dh].
    bias: [B or 1, H or 1, L or 1, T] (masks and position biases).

  Returns:
    [B, L, H, Dh]. Differentiable (the gradients are XLA's).
  """
  out = jax.ShapeDtypeStruct(query.shape, jnp.float32)
  return jax.ffi.ffi_call('spec_decode_attention', out, vmap_method='sequential')(
      query, key, value, bias)


def _attention_forward(query, key, value, bias):
  return attention(query, key, value, bias), (query, key, value, bias)


def _attention_backward(residuals, dy):
  return jax.vjp(_attention_reference, *residuals)[1](dy)


attention.defvjp(_attention_forward, _attention_backward)
