"""Argument checks and small helpers shared by the decoding loops (spec_decode.decoding)."""

import jax
import jax.numpy as jnp

from spec_decode import checks


def cache_length(max_decode_len: int, gamma: int = 0) -> int:
  """Positions a cache needs so that no write ever leaves its buffers.

  An unfinished row writes at most up to position max_decode_len - 1 + gamma;
  a finished row keeps stepping (batched) at its final index <= max_decode_len.

  Raises:
    ValueError: a length beyond int32, in which the loops index positions.
  """
  length = max_decode_len + gamma + 1
  if length > checks.INT32_MAX:
    raise ValueError(f'max_decode_len={max_decode_len} + gamma={gamma} + 1 = {length} positions '
                     f'exceed int32 ({checks.INT32_MAX}): use a smaller max_decode_len')
  return length


def split_rows(keys: jax.Array, num: int) -> list[jax.Array]:
  """[B] keys -> `num` arrays of [B] keys, each row split independently."""
  split = jax.vmap(lambda k: jax.random.split(k, num))(keys)  # [B, num]
  return [split[:, i] for i in range(num)]


def row_keys(rng: jax.Array | int, batch: int) -> jax.Array:
  """One key, or [B] keys (typed or raw uint32), or an int seed -> [B] typed keys."""
  rng = checks.check_rng(rng)
  if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    rng = jax.random.wrap_key_data(rng)
  if rng.ndim == 0:
    return jax.random.split(rng, batch)
  if rng.shape != (batch,):
    raise ValueError(f'rng must be one key or {batch} keys (one per row), got shape {rng.shape}')
  return rng


def check_static_args(target_step_fn, target_cache, draft_step_fn, draft_cache, *, gamma,
                       max_decode_len, prompt) -> None:
  """Raises ValueError for arguments that would decode garbage."""
  checks.check_size('max_decode_len', max_decode_len)
  needed = cache_length(max_decode_len, gamma)
  caches = {'target': target_cache} if draft_step_fn is None else {
      'target': target_cache, 'draft': draft_cache}
  for name, cache in caches.items():
    if cache.capacity < needed:
      raise ValueError(
          f'the {name} cache holds {cache.capacity} positions but max_decode_len='
          f'{max_decode_len} with gamma={gamma} needs {needed}: allocate it with '
          f'cache_length(max_decode_len, gamma)')
  batch = target_cache.batch_size
  if draft_step_fn is not None and draft_cache.batch_size != batch:
    raise ValueError(f'draft cache batch {draft_cache.batch_size} != target cache batch {batch}')
  if prompt is not None:
    if prompt.ndim != 2 or prompt.shape[0] != batch:
      raise ValueError(f'prompt must be [batch={batch}, P], got shape {prompt.shape}')
    if not jnp.issubdtype(prompt.dtype, jnp.integer):
      raise ValueError(f'prompt must hold integer token ids, got {prompt.dtype}')
    if prompt.shape[1] >= max_decode_len:
      raise ValueError(f'prompt of length {prompt.shape[1]} does not fit max_decode_len='
                       f'{max_decode_len}: it must be shorter, to leave room to decode')
  if draft_step_fn is not None:
    probe = jnp.zeros((batch, 1), jnp.int32)
    v_p = jax.eval_shape(target_step_fn, probe, target_cache)[0].shape[-1]
    v_q = jax.eval_shape(draft_step_fn, probe, draft_cache)[0].shape[-1]
    if v_p != v_q:
      raise ValueError(f'draft vocabulary size {v_q} != target vocabulary size {v_p}: speculative '
                       'sampling compares p and q token by token, so they must share a vocabulary')


def nonfinite_rows(logits: jax.Array) -> jax.Array:
  """[B, ..., V] -> [B] bool: the row's logits hold a NaN or +inf, or a position's are all -inf.

  -inf alone is a mask (a token the model rules out, as drafts.PromptLookupDraft
  writes), so it passes while some token at the position stays finite.

  Two float reductions per position, each vectorized on XLA:CPU (where a
  boolean `all` over isfinite of every logit cost ~10% of a greedy baseline
  step at batch 8, scripts/studies/check_finite_cost.py): the sum over V is
  NaN wherever a NaN is, on any backend (addition propagates NaN), and the
  maximum is +inf where a +inf is and -inf where all are. The maximum alone
  misses NaN: XLA:CPU's vectorized max drops a NaN among finite values, and
  backends differ in whether max propagates NaN. A sum of finite logits may
  overflow to +-inf but not to NaN (short of logits near float32's largest
  of both signs at once), so finite logits pass.
  """
  positions = (logits.shape[0], -1)
  top = jnp.max(logits, axis=-1).reshape(positions)
  total = jnp.sum(logits, axis=-1, dtype=jnp.float32).reshape(positions)
  return jnp.any(~jnp.isfinite(top) | jnp.isnan(total), axis=-1)
