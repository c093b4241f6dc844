r"""Prints how much of the target's verify cost r(K) is attention over the cache.

  python scripts/studies/attention_cost.py                     # the bundled target, K = 1 .. 5
  python scripts/studies/attention_cost.py --config small      # a T5 1.1 size, random weights

A verify call over K positions runs every matmul of a decoder step with K rows
and attends from K queries over the cache. This times the target's call over
K = 1 .. --k_max (a compiled loop of calls, as `harness.step_costs` times
r(K)) in two programs, round-robin: the model as it is, and the same model
with attention's products skipped (each attention layer passes its query
straight to its output projection, so the scores, the softmax, the weighted
sum and the position biases go: a wrong model whose other work is the same).
The difference is what attention costs per call; r(K) without it is what the
matmuls and the rest leave. Each program is compiled after clearing JAX's
caches (`step_costs.compiled_step_loop`), so the variant really runs.
"""

import argparse
import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import decoding
from spec_decode import demo
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import step_costs
from spec_decode.harness import timing
from spec_decode import models
from spec_decode.t5 import layers


@contextlib.contextmanager
def attention_skipped():
  """Within: every MultiHeadAttention returns out(query), its products skipped."""
  call = layers.MultiHeadAttention.__call__

  def skipped(self, inputs_q, key, value, bias, deterministic=True):
    del key, value, bias, deterministic
    query = jnp.swapaxes(self._heads(self.query(inputs_q)), 1, 2)  # [B, L, H, Dh]
    return self.out(query.reshape(query.shape[:-2] + (-1,)))

  layers.MultiHeadAttention.__call__ = skipped
  try:
    yield
  finally:
    layers.MultiHeadAttention.__call__ = call


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default=None,
                      help='a T5 1.1 size or config file with random weights (default: the '
                           'bundled target)')
  parser.add_argument('--k_max', type=int, default=5, help='largest K timed')
  parser.add_argument('--max_decode_len', type=int, default=64, help='sets the cache capacity')
  parser.add_argument('--num_steps', type=int, default=32, help='calls per timed loop')
  parser.add_argument('--rounds', type=int, default=9)
  args = parser.parse_args()
  if min(args.k_max, args.max_decode_len, args.num_steps, args.rounds) < 1:
    parser.error('k_max, max_decode_len, num_steps and rounds must be >= 1')

  if args.config is None:
    target, name = demo.load('target'), 'the bundled target'
  else:
    target = models.T5Model.random(loading.parse_config(args.config), jax.random.key(0))
    name = f'{args.config} (random weights)'
  inputs, _ = experiments.task_inputs('demo_ende', 'test_multi30k', 1, 256)
  first = loading.trim_padding(inputs[0])[None]
  if args.config is not None:  # a random model's vocabulary may be smaller
    first = np.minimum(first, target.vocab_size - 1)
  common = dict(capacity=decoding.cache_length(args.max_decode_len, args.k_max - 1),
                position=args.max_decode_len // 2, num_steps=args.num_steps)
  ks = range(1, args.k_max + 1)
  runs = {('as is', k): step_costs.compiled_step_loop(target, first, k=k, **common) for k in ks}
  with attention_skipped():
    runs.update({('skipped', k): step_costs.compiled_step_loop(target, first, k=k, **common)
                 for k in ks})
  seconds = timing.round_robin(runs, args.rounds)
  ms = {key: 1e3 * float(np.median(s)) / args.num_steps for key, s in seconds.items()}

  print(f'{name}, {jax.devices()[0].platform}, one target call over K positions at cache index '
        f'{common["position"]} of {common["capacity"]}, median of {args.rounds} interleaved '
        'rounds\n')
  print('| K | ms, as is | r(K), as is | ms, attention skipped | r(K), attention skipped '
        '| attention ms | attention, target steps |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  step = ms[('as is', 1)]
  for k in ks:
    full, bare = ms[('as is', k)], ms[('skipped', k)]
    print(f'| {k} | {full:.3f} | {full / step:.2f} | {bare:.3f} | {bare / ms[("skipped", 1)]:.2f} '
          f'| {full - bare:.3f} | {(full - bare) / step:.2f} |')


if __name__ == '__main__':
  main()
