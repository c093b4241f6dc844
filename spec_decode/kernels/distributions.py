"""Sampling's row kernels for XLA:CPU: softmax, argmax, and top-k's and top-p's thresholds.

Every decoding step turns a few rows of V logits into a distribution (the
draft's row; the verify call's gamma + 1 rows), and with top-k or top-p cuts
each row at a threshold. In the decoding loop XLA:CPU's fusions for these cost
more per row than one pass of vector code (distributions.cc,
`scripts/studies/truncation_cost.py`, `scripts/studies/sampling_kernels.py`);
`spec_decode.sampling` takes these kernels where `thresholds_apply`,
`softmax_applies` and `argmax_applies` say so (float32, the kernels in use:
`kernels.in_use`), XLA's operations elsewhere. Each call does its rows in turn
on one thread; under vmap the mapped axis is one more leading axis of the same
call.

`top_k_threshold` and `top_p_threshold` give the thresholds in one call: an
exact bisection over each row's float bits that drops the entries that can no
longer decide as it narrows, where XLA:CPU sorts the row or bisects it with 32
masked sums of the whole row. `softmax` is jax.nn.softmax over the last axis
(within a few float32 roundings; the same for a row alone or among others).
`argmax` is the first index of each row's maximum, in one pass.
"""

import math

import jax
import jax.numpy as jnp
from jax import lax

from spec_decode import kernels

# The softmax kernel pays inside the decoding loop (a draft step's row, a verify call's
# gamma + 1), where XLA's fusion ran 3x slower than alone; in a loop of softmaxes alone XLA's
# multithreaded fusion was faster, by 3x per row from 16 rows (docs/measurements-cpu.md). So
# larger calls (teacher-forced acceptance, big batches) keep XLA's.
SOFTMAX_MAX_ROWS = 8


def thresholds_apply(x: jax.Array) -> bool:
  """Whether `top_k_threshold` and `top_p_threshold` run the kernel on rows x [..., V].

  Every row count: per row the kernel's top-k/top-p mask cost 0.15-0.91 of XLA's
  (`truncation_cost.py`, 1 and 4 rows, V = 8192 and 32128, top-k 40 included).
  """
  return x.dtype == jnp.float32 and x.ndim >= 1 and x.shape[-1] >= 1 and kernels.in_use()


def softmax_applies(x: jax.Array) -> bool:
  """Whether `softmax` runs the kernel on x [..., V]: as thresholds, <= SOFTMAX_MAX_ROWS rows."""
  return thresholds_apply(x) and math.prod(x.shape[:-1]) <= SOFTMAX_MAX_ROWS


def argmax_applies(x: jax.Array) -> bool:
  """Whether `argmax` runs the kernel on x [..., V]: as thresholds, every row count.

  In a loop the kernel's argmax cost 0.29-0.54 of XLA's at 1-1024 rows of
  V = 8192 and 32128 (EPYC).
  """
  return thresholds_apply(x)


def argmax(x: jax.Array) -> jax.Array:
  """[..., V] float32 -> [...] int32: the first index of each row's largest entry.

  jnp.argmax's result, a row with a NaN included (the first NaN's index).
  """
  out = jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32)
  return jax.ffi.ffi_call('spec_decode_argmax', out, vmap_method='broadcast_all')(
      lax.stop_gradient(x))


@jax.custom_jvp
def softmax(x: jax.Array) -> jax.Array:
  """jax.nn.softmax(x, axis=-1) by the kernel: x [..., V] float32 -> [..., V].

  A row whose maximum is not finite (all -inf, +inf or a NaN) gives NaNs, as
  jax.nn.softmax does. Differentiable (the tangent is XLA's arithmetic).
  """
  out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
  return jax.ffi.ffi_call('spec_decode_softmax', out, vmap_method='broadcast_all')(x)


@softmax.defjvp
def _softmax_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  y = softmax(x)
  return y, y * (dx - jnp.sum(y * dx, axis=-1, keepdims=True))


def _threshold(target: str, x: jax.Array, bound: jax.Array) -> jax.Array:
  """[..., V], bound broadcastable to [..., 1] -> [..., 1] (see distributions.cc)."""
  x = lax.stop_gradient(x)  # a threshold feeds comparisons only
  bound = jnp.broadcast_to(lax.stop_gradient(bound), x.shape[:-1] + (1,))[..., 0]
  out = jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)
  return jax.ffi.ffi_call(target, out, vmap_method='broadcast_all')(
      x, bound.astype(jnp.float32))[..., None]


def top_k_threshold(logits: jax.Array, k: jax.Array) -> jax.Array:
  """The k-th largest entry of each row: top-k keeps the entries >= it (ties kept).

  Args:
    logits: [..., V] float32 (-inf allowed).
    k: broadcastable to [..., 1], integers in 1..V.

  Returns:
    [..., 1] float32.
  """
  return _threshold('spec_decode_top_k_threshold', logits, k)


def top_p_threshold(probs: jax.Array, top_p: jax.Array) -> jax.Array:
  """The smallest probability whose larger entries hold less than top_p, per row.

  The nucleus is the entries >= it: the most likely tokens down to the first
  rank whose preceding mass reaches top_p, every token tied with the last one
  kept. The masses are summed in double precision. A row whose top_p is not
  > 0 is not cut: its threshold is -inf.

  Args:
    probs: [..., V] float32 probabilities.
    top_p: broadcastable to [..., 1], at most 1.

  Returns:
    [..., 1] float32.
  """
  return _threshold('spec_decode_top_p_threshold', probs, top_p)
