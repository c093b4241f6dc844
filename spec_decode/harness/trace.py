"""Speculative decoding of one input, one iteration at a time on the host, and its plot.

`trace_speculative` records each iteration's drafts, accepted count and the
target's own token. It runs the engine's pieces (T5Model.start's step
functions, sampling.adjust/sample, speculative.accept) with the
engine's PRNG splits, so its tokens equal models.speculative_generate's for
the same key. `plot_trace` draws it (Figure 1 of the paper).
"""

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from spec_decode import cache as cache_lib
from spec_decode import decoding
from spec_decode import draft_phase
from spec_decode.harness import figures
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode.models import protocol


@dataclasses.dataclass(frozen=True)
class Iteration:
  """One speculative iteration of `trace_speculative`.

  Attributes:
    drafts: the gamma drafted tokens x_1..x_gamma.
    accepted: n, the accepted prefix length.
    token: y, the target's own token (residual sample or bonus).
    emitted: the tokens appended to the output (x_1..x_n, y, cut at EOS and
      at max_decode_len).
  """

  drafts: list[int]
  accepted: int
  token: int
  emitted: list[int]


@functools.partial(jax.jit, static_argnames='capacity')
def _start(model: models.T5Model, encoder_input_tokens: jax.Array, capacity: int):
  return model.start(protocol.Batch.of(model, encoder_input_tokens), capacity)[1]


@jax.jit
def _step(model: models.T5Model, encoder_input_tokens: jax.Array, tokens: jax.Array,
          cache: cache_lib.Cache):
  # model.start's step function; its fresh cache is unused (and compiled away).
  step_fn, _ = model.start(protocol.Batch.of(model, encoder_input_tokens), cache.capacity)
  return step_fn(tokens, cache)


@jax.jit
def _adjust_and_sample(key: jax.Array, logits: jax.Array,
                       sampling: sampling_lib.SamplingParams):
  probs = sampling_lib.adjust(logits, sampling)
  return sampling_lib.sample(key, probs), probs


_accept = jax.jit(speculative.accept)


def trace_speculative(target: models.T5Model, draft: models.T5Model,
                      encoder_input_tokens: np.ndarray, rng: jax.Array, *, gamma: int,
                      max_decode_len: int, sampling: sampling_lib.SamplingParams | None = None,
                      eos_id: int = 1) -> tuple[list[Iteration], list[int]]:
  """Speculative decoding of ONE input on the host, recording every iteration.

  Algorithm 1 step by step, with the PRNG splits of decoding.speculative_decode
  (batch 1), so the output equals models.speculative_generate(target, draft,
  encoder_input_tokens, rng, ...)'s: token for token when greedy, and for the
  same key when sampling (up to floating-point differences between the fused
  and the step-by-step computation).

  Args:
    target: M_p.
    draft: M_q, same vocabulary.
    encoder_input_tokens: [1, S] int32.
    rng: one PRNG key.
    gamma: drafts per iteration.
    max_decode_len: maximum output tokens.
    sampling: as for speculative_generate; greedy when None.
    eos_id: the token that ends the output.

  Returns:
    (iterations, output tokens). The number of target calls is
    len(iterations).
  """
  sampling = sampling if sampling is not None else sampling_lib.SamplingParams.create()
  inputs = jnp.asarray(encoder_input_tokens, jnp.int32)
  if inputs.ndim != 2 or inputs.shape[0] != 1:
    raise ValueError(f'trace_speculative takes one input [1, S], got shape {inputs.shape}')
  capacity = decoding.cache_length(max_decode_len, gamma)
  target_cache, draft_cache = _start(target, inputs, capacity), _start(draft, inputs, capacity)
  rng = jax.random.split(rng, 1)  # [1]: the row's stream, as loop_utils.row_keys.
  output: list[int] = []
  iterations: list[Iteration] = []
  last = decoding.BOS_ID
  while True:
    split = jax.vmap(lambda k: jax.random.split(k, 3))(rng)  # [1, 3]
    rng, draft_key, accept_key = split[:, 0], split[:, 1], split[:, 2]
    draft_keys = jax.vmap(lambda k: jax.random.split(k, gamma))(draft_key)  # [1, gamma]

    # 1. gamma draft calls, the first over the last two tokens (draft_phase.first_call).
    drafts, qs = [], []
    known = jnp.asarray([[decoding.BOS_ID] + output + [0]], jnp.int32)  # last at len(output)
    logits, draft_cache = draft_phase.first_call(
        lambda tokens, cache: _step(draft, inputs, tokens, cache), draft_cache, known)
    for i in range(gamma):
      if i:
        logits, draft_cache = _step(draft, inputs, jnp.asarray([drafts[-1:]], jnp.int32),
                                    draft_cache)
        logits = logits[:, 0]
      x_i, q_i = _adjust_and_sample(draft_keys[:, i], logits, sampling)
      drafts.append(int(x_i[0]))
      qs.append(q_i)
    x = jnp.asarray([drafts], jnp.int32)  # [1, gamma]

    # 2. One target call over [last, x_1..x_gamma].
    logits, target_cache = _step(target, inputs, jnp.asarray([[last] + drafts], jnp.int32),
                                 target_cache)

    # 3. Accept a prefix, draw the target's own token.
    n, y = _accept(accept_key, x, jnp.stack(qs, axis=1), logits, sampling)
    n, y = int(n[0]), int(y[0])

    # 4. Emit x_1..x_n, y, cut at the first EOS and at max_decode_len.
    emitted = []
    for t in drafts[:n] + [y]:
      if len(output) + len(emitted) >= max_decode_len:
        break
      emitted.append(t)
      if t == eos_id:
        break
    output += emitted
    iterations.append(Iteration(drafts=drafts, accepted=n, token=y, emitted=emitted))
    index = jnp.asarray([len(output)], jnp.int32)
    target_cache = cache_lib.rewind(target_cache, index)
    draft_cache = cache_lib.rewind(draft_cache, index)
    if eos_id in emitted or len(output) >= max_decode_len:
      return iterations, output
    last = output[-1]


def _draw_tokens(ax, y: float, parts: Sequence[tuple[str, str, bool]], fontsize: float):
  """Draws (text, color, struck) parts one after another on one line."""
  text = ax.text(0.0, y, '', fontsize=fontsize, va='center', transform=ax.transAxes)
  for s, color, struck in parts:
    text = ax.annotate(s, xy=(1, 0), xycoords=text, va='bottom', ha='left', color=color,
                       fontsize=fontsize, annotation_clip=False)
    if struck:
      ax.annotate('', xy=(1, 0.45), xycoords=text, xytext=(0, 0.45), textcoords=text,
                  arrowprops=dict(arrowstyle='-', color=color, lw=1.2), annotation_clip=False)


def plot_trace(iterations: Sequence[Iteration], piece: Callable[[int], str],
               detokenize: Callable[[list[int]], str], *, source: str = '',
               eos_id: int = 1, max_prefix_chars: int = 70,
               fontsize: float = 10) -> matplotlib.figure.Figure:
  """The paper's Figure 1 for a trace: one line per target call.

  Each line shows the output so far (black), the accepted drafts (green), the
  first rejected draft (red, struck through) and the target's own token
  (blue: the residual sample after a rejection, the bonus after a clean sweep).

  Args:
    iterations: from trace_speculative.
    piece: token id -> its text (e.g. a SentencePiece piece with '▁' as ' ').
    detokenize: ids -> text, for the output so far.
    source: the input text, for the title.
    eos_id: shown as '</s>'.
    max_prefix_chars: longer outputs so far are shown as '…' + their end.
    fontsize: of the tokens.
  """
  rows = len(iterations)
  fig = plt.figure(figsize=(13, 0.8 + 0.32 * rows))
  ax = fig.add_axes((0.11, 0.02, 0.87, 0.96 - 0.5 / (0.8 + 0.32 * rows)))
  ax.set_axis_off()
  name = lambda t: '</s>' if t == eos_id else piece(t)
  output: list[int] = []
  for r, it in enumerate(iterations):
    y = 1.0 - (r + 0.5) / rows
    prefix = detokenize(output) if output else ''
    if len(prefix) > max_prefix_chars:
      prefix = '…' + prefix[-max_prefix_chars:]
    tokens = [(t, figures.GREEN, False) for t in it.drafts[:it.accepted]]
    if it.accepted < len(it.drafts):
      tokens.append((it.drafts[it.accepted], figures.RED, True))
    tokens.append((it.token, figures.BLUE, False))
    if eos_id in [t for t, _, _ in tokens]:  # Nothing after the output's end.
      tokens = tokens[:[t for t, _, _ in tokens].index(eos_id) + 1]
    parts = [(prefix, 'k', False)]
    for t, color, struck in tokens:
      s = name(t)
      if not parts[-1][0]:
        s = s.lstrip()
      if struck and s.startswith(' '):  # Strike the word, not the space before it.
        parts.append((' ', 'k', False))
        s = s[1:]
      parts.append((s, color, struck))
    ax.text(-0.01, y, f'call {r + 1}', transform=ax.transAxes, ha='right', va='center',
            fontsize=fontsize - 1, color=figures.GREY)
    _draw_tokens(ax, y, parts, fontsize)
    output += it.emitted
  tokens = sum(len(it.emitted) for it in iterations)
  gamma = len(iterations[0].drafts) if iterations else 0
  title = (f'gamma = {gamma}: {tokens} tokens in {rows} target calls '
           f'({tokens / max(rows, 1):.2f} per call; the target alone needs {tokens})')
  if source:
    title = f'{source}\n{title}'
  fig.suptitle(title, fontsize=fontsize + 1, x=0.11, ha='left')
  return fig
