r"""Prints how often a top-p nucleus reaches beyond the k largest entries: where top-k caps work.

  python scripts/studies/nucleus_mass.py                   # bundled models, T = 1, top_p 0.9
  python scripts/studies/nucleus_mass.py --top_p 0.95 --temperature 0.7 --n 200

`sampling.adjust` finds the top-p threshold among the `sampling.TOP_P_CAP` largest
probabilities (`lax.top_k`) when they hold at least top_p, and otherwise by a
bisection over the whole vocabulary, several times dearer on XLA:CPU. This
script measures how often the second case comes up: each model is run
teacher-forced on the reference translations of the first `--n` Multi30k test
sentences (one pass per sentence), and a position counts when the `k` largest
probabilities of its distribution at `--temperature` sum to less than `--top_p`.

It then times, on this machine, `lax.top_k` for each k and the bisection over
one row (a draft step) and gamma + 1 rows (a verify call) of the vocabulary,
round-robin, and prints what each k as the cap would cost per speculative
iteration: gamma one-row calls, each paying the bisection as often as the
draft's positions need it, and one (gamma + 1)-row call, paying it as often as
any of gamma + 1 consecutive positions of the target needs it (neighbouring
positions are not independent).
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode import demo
from spec_decode.harness import loading
from spec_decode.harness import timing
from spec_decode import sampling
from spec_decode.models import protocol


def positions_beyond(model, examples, *, temperature: float, top_p: float, caps: list[int],
                     window: int) -> tuple[dict[int, float], dict[int, float]]:
  """How often the nucleus reaches past each cap: per position, and per verify window.

  Args:
    model: a T5Model, run teacher-forced on each example's reference.
    examples: dicts with 'inputs' and 'targets' texts.
    temperature: T of the adjusted distributions (> 0).
    top_p: the nucleus' mass.
    caps: the numbers k of largest probabilities to test.
    window: positions per verify call (gamma + 1); a call bisects when any of them needs
      it, so windows of consecutive positions count, not independent ones.

  Returns:
    Two dicts cap -> share: of positions whose `cap` largest probabilities hold less
    than top_p, and of windows (every run of `window` consecutive positions of an output,
    or the whole output where it is shorter) holding such a position.
  """
  params = sampling.SamplingParams.create(temperature=temperature)

  @jax.jit
  def top_mass(encoder_input_tokens, decoder_input_tokens):
    logits = alpha_lib.teacher_forced_logits(model, protocol.Batch(encoder_input_tokens),
                                             decoder_input_tokens)
    probs = sampling.adjust(logits, params)[0]  # [L, V]
    return jnp.cumsum(jax.lax.top_k(probs, max(caps))[0], axis=-1)  # [L, max cap]

  positions = windows = 0
  beyond, windows_beyond = {cap: 0 for cap in caps}, {cap: 0 for cap in caps}
  for example in examples:
    inputs = loading.encode_texts([example['inputs']], 256)
    outputs = loading.encode(example['targets'], 256)
    shifted = np.zeros((1, -(-len(outputs) // 16) * 16), np.int32)  # few shapes to compile
    shifted[0, 1:len(outputs)] = outputs[:-1]  # BOS = 0, then the reference
    mass = np.asarray(top_mass(jnp.asarray(inputs), jnp.asarray(shifted)))[:len(outputs)]
    starts = range(max(len(outputs) - window + 1, 1))
    positions += len(outputs)
    windows += len(starts)
    for cap in caps:
      past = mass[:, cap - 1] < top_p  # [L]
      beyond[cap] += int(np.sum(past))
      windows_beyond[cap] += sum(bool(np.any(past[i:i + window])) for i in starts)
  return ({cap: beyond[cap] / positions for cap in caps},
          {cap: windows_beyond[cap] / windows for cap in caps})


def _loop(fn, steps: int):
  @jax.jit
  def run(x):  # every output is summed, so that XLA computes all of it
    body = lambda i, acc: acc + jnp.sum(fn(x + i.astype(x.dtype) * 1e-9))
    return jax.lax.fori_loop(0, steps, body, jnp.zeros((), jnp.float32))
  return run


def cap_costs(caps: list[int], rows: list[int], vocab: int, top_p: float, *, steps: int = 50,
              rounds: int = 7) -> dict[tuple[str, int], float]:
  """Microseconds per call of `lax.top_k` at each cap and of the bisection, per row count.

  Args:
    caps: the k of each `lax.top_k` timed.
    rows: row counts R of the [R, vocab] probabilities (flat ones: every row bisects).
    vocab: V.
    top_p: the bisection's bound.
    steps: calls per timed loop.
    rounds: round-robin rounds; the median is kept.

  Returns:
    (f'top_k {cap}' or 'bisection', R) -> microseconds per call.
  """
  rng = np.random.default_rng(0)
  runs = {}
  for n in rows:
    probs = jax.nn.softmax(jnp.asarray(rng.standard_normal((n, vocab)), jnp.float32), axis=-1)
    for cap in caps:
      top_k = _loop(lambda x, cap=cap: jax.lax.top_k(x, cap)[0], steps)
      runs[(f'top_k {cap}', n)] = functools.partial(top_k, probs)
    keys = lambda x: sampling.order_keys(x)
    bisect = lambda x: keys(x) >= sampling.bisect_threshold(keys(x), x, jnp.asarray(top_p))
    runs[('bisection', n)] = functools.partial(_loop(bisect, steps), probs)
  seconds = timing.round_robin(runs, rounds)
  return {key: float(np.median(s)) / steps * 1e6 for key, s in seconds.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--drafts', nargs='+', default=['draft_small', 'draft_large'],
                      choices=['draft_small', 'draft_large'])
  parser.add_argument('--n', type=int, default=100, help='Multi30k test sentences')
  parser.add_argument('--temperature', type=float, default=1.0)
  parser.add_argument('--top_p', type=float, default=0.9)
  parser.add_argument('--caps', type=int, nargs='+', default=[64, 128, 256, 512, 1024])
  parser.add_argument('--gamma', type=int, default=4, help='draft length of the cost estimate')
  parser.add_argument('--steps', type=int, default=50, help='calls per timed loop')
  parser.add_argument('--rounds', type=int, default=7, help='round-robin rounds (median)')
  args = parser.parse_args()
  if args.temperature <= 0:
    parser.error(f'temperature must be > 0 (at 0 there is no nucleus), got {args.temperature}')
  if not 0 < args.top_p < 1:
    parser.error(f'top_p must lie in (0, 1), got {args.top_p}')
  if min(args.n, args.gamma, args.steps, args.rounds) < 1:
    parser.error('n, gamma, steps and rounds must be >= 1')
  if min(args.caps) < 1 or max(args.caps) > 8192:
    parser.error(f'caps must lie within 1 .. 8192 (the vocabulary), got {args.caps}')

  examples = data.load_examples('demo_ende', 'test_multi30k', args.n)
  caps = sorted(set(args.caps))
  print(f'Share of positions whose {caps} largest probabilities hold less than top_p '
        f'{args.top_p} (T = {args.temperature}, teacher-forced on the references of '
        f'{len(examples)} Multi30k test sentences; sampling.TOP_P_CAP = {sampling.TOP_P_CAP}):\n')
  print('| model | ' + ' | '.join(f'k = {cap}' for cap in caps) + ' |')
  print('| --- | ' + ' | '.join('---' for _ in caps) + ' |')
  share, window_share = {}, {}
  verify = args.gamma + 1
  for name in ['target'] + args.drafts:
    share[name], window_share[name] = positions_beyond(
        demo.load(name), examples, temperature=args.temperature, top_p=args.top_p, caps=caps,
        window=verify)
    print(f'| {name} | ' + ' | '.join(f'{share[name][cap]:.4f}' for cap in caps) + ' |')
  print(f'| target, any of {verify} consecutive positions | '
        + ' | '.join(f'{window_share["target"][cap]:.4f}' for cap in caps) + ' |')

  us = cap_costs(caps, [1, verify], 8192, args.top_p, steps=args.steps, rounds=args.rounds)
  print(f'\nMicroseconds on this machine (V = 8192, loops timed round-robin): lax.top_k per call, '
        f'and top_k plus the bisection where a call needs it per speculative iteration at gamma '
        f'{args.gamma} ({args.gamma} one-row draft calls, one {verify}-row verify call, which '
        f'bisects as often as the target\'s windows above). '
        f'The bisection: {us[("bisection", 1)]:.1f} (1 row), {us[("bisection", verify)]:.1f} '
        f'({verify} rows).\n')
  print(f'| cap | top_k, 1 row | top_k, {verify} rows | '
        + ' | '.join(f'iteration, {d}' for d in args.drafts) + ' |')
  print('| --- | --- | --- | ' + ' | '.join('---' for _ in args.drafts) + ' |')
  for cap in caps:
    one, rows = us[(f'top_k {cap}', 1)], us[(f'top_k {cap}', verify)]
    target_calls = rows + window_share['target'][cap] * us[('bisection', verify)]
    iterations = [args.gamma * (one + share[d][cap] * us[('bisection', 1)]) + target_calls
                  for d in args.drafts]
    print(f'| {cap} | {one:.1f} | {rows:.1f} | ' + ' | '.join(f'{t:.0f}' for t in iterations)
          + ' |')


if __name__ == '__main__':
  main()
