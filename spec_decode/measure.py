"""The measurements behind the paper's Tables 2 and 3: alpha, c, r(K), walltime.

alpha (Table 3) without running the algorithm: the target generates sequences
(greedy or sampled), then ONE teacher-forced pass of each model over them gives
p and q at every generated position, adjusted with the same SamplingParams, and

  beta = sum_x min(p(x), q(x)),   alpha = E[beta]

over all positions (at temperature 0, beta is 1 where the argmaxes agree, else
0). A draft is a T5Model or a draft provider of `spec_decode.drafts` (e.g. a
zero-cost unigram or bigram table estimated from the task's training targets).

c and r(K) (Section 3.3 and `theory.walltime_improvement`): seconds per call of
each model's step function inside a compiled `lax.fori_loop` at batch 1, over a
real cache, compile and warm-up excluded, median over repeats:

  c = draft step (K = 1) / target step (K = 1)
  r(K) = target call over K positions / target step (K = 1)

Walltime (Table 2): every input decoded alone (batch 1) by the baseline and by
speculative decoding, one compiled function per decoder (inputs padded to one
length), the median over repeats per input; `summarize` compares the measured
speedup with eq. (5) and splits an iteration's time into draft steps, the
verify pass and everything else (sampling, accept/reject, the loop, encoding).
"""

import dataclasses
import functools
import json
import pathlib
import time
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import sentencepiece as spm
import tqdm

from spec_decode import cache as cache_lib
from spec_decode import checkpoints
from spec_decode import data
from spec_decode import decoding
from spec_decode import drafts
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode import theory
from spec_decode.t5.config import T5Config, t5_1_1

BOS_ID, EOS_ID = decoding.BOS_ID, 1
ALPHA_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)

# ---------------------------------------------------------------------------
# Text, tokens and model configs.


def parse_config(spec: str, vocab_size: int = 8192, dtype: str | None = None) -> T5Config:
  """A T5Config from a size name of `t5_1_1` or a JSON file of T5Config fields.

  Args:
    spec: e.g. 'small' (with `vocab_size`, default the bundled 8k vocabulary)
      or 'target.json' holding {"vocab_size": 8192, "emb_dim": 512, ...}.
    vocab_size: vocab_size of a size name; a JSON file has its own.
    dtype: activation dtype override ('float32' or 'bfloat16'), None keeps it.
  """
  if spec.endswith('.json'):
    config = T5Config(**json.loads(pathlib.Path(spec).read_text()))
  else:
    config = t5_1_1(spec, vocab_size=vocab_size)
  return config if dtype is None else dataclasses.replace(config, dtype=dtype)


def load_model(spec: str, checkpoint: str, vocab_size: int = 8192,
               dtype: str | None = None) -> models.T5Model:
  """A T5Model from a config spec (see `parse_config`) and a checkpoint path."""
  config = parse_config(spec, vocab_size, dtype)
  return models.T5Model(config, jax.device_put(checkpoints.load_params(checkpoint, config)))


@functools.cache
def tokenizer() -> spm.SentencePieceProcessor:
  """The bundled SentencePiece vocabulary (pad 0, EOS 1)."""
  return spm.SentencePieceProcessor(model_file=str(data.VOCAB_PATH))


def encode_texts(texts: Sequence[str], max_input_len: int, multiple: int = 16) -> np.ndarray:
  """Texts -> encoder inputs of one shape, so one compiled function serves all.

  Args:
    texts: input texts (task prefix included).
    max_input_len: longer inputs are cut to this many tokens, EOS kept.
    multiple: the common length is the longest input rounded up to this.

  Returns:
    [N, S] int32 ids, EOS appended, 0-padded; S <= max(max_input_len, multiple).
  """
  ids = [tokenizer().encode(text)[:max_input_len - 1] + [EOS_ID] for text in texts]
  length = -(-max(len(x) for x in ids) // multiple) * multiple
  tokens = np.zeros((len(ids), length), np.int32)
  for i, x in enumerate(ids):
    tokens[i, :len(x)] = x
  return tokens


def detokenize(ids: Sequence[int]) -> str:
  """Output ids -> text, cut at the first EOS."""
  ids = list(ids)
  return tokenizer().decode(ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids)


def target_token_stream(task: str, split: str = 'train', *, limit: int | None = None,
                        cache_dir: str | pathlib.Path | None = None) -> np.ndarray:
  """Every target of a local task split tokenized, each followed by EOS.

  Args:
    task: a local task of `spec_decode.data` ('demo_ende', 'demo_debsum').
    split: its split.
    limit: only the first `limit` examples.
    cache_dir: if given, the stream is saved there as .npy and read back later.

  Returns:
    [T] int32, the concatenated id sequences (EOS separates them).
  """
  path = None
  if cache_dir is not None:
    name = f'{task}_{split}_{limit or "all"}_{data.VOCAB_PATH.stem}_targets.npy'
    path = pathlib.Path(cache_dir) / name
    if path.exists():
      return np.load(path)
  targets = [e['targets'] for e in data.load_examples(task, split, limit)]
  stream = np.asarray([t for ids in tokenizer().encode(targets) for t in ids + [EOS_ID]],
                      np.int32)
  if path is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, stream)
  return stream


Draft = models.T5Model | drafts.DraftProvider


def teacher_forced_logits(model: Draft, encoder_input_tokens: jax.Array,
                          decoder_input_tokens: jax.Array) -> jax.Array:
  """One full-sequence pass: [B, S] inputs, [B, L] decoder inputs -> [B, L, V].

  A draft provider makes it one call of its step function over all L positions
  (which the step-function contract makes equal to L single calls).
  """
  if isinstance(model, models.T5Model):
    return model.network.apply({'params': model.params}, encoder_input_tokens,
                               decoder_input_tokens)
  step_fn, cache = model.start(encoder_input_tokens, decoder_input_tokens.shape[1])
  return step_fn(decoder_input_tokens, cache)[0]


# ---------------------------------------------------------------------------
# alpha (Table 3).


@dataclasses.dataclass(frozen=True)
class AlphaStats:
  """alpha = E[beta] over the positions of target-generated sequences.

  Attributes:
    alpha: mean beta over all generated positions (each token weighs the same).
    stderr: its standard error. Positions of one sequence are correlated, so
      it is the ratio estimator's, from per-sequence sums (cluster-robust).
    std: standard deviation of beta over positions.
    sequence_alpha: [N] mean beta of each sequence.
    positions: number of positions.
  """

  alpha: float
  stderr: float
  std: float
  sequence_alpha: np.ndarray
  positions: int

  @classmethod
  def from_betas(cls, betas: np.ndarray, lengths: np.ndarray) -> 'AlphaStats':
    """[N, L] beta per position and [N] generated lengths -> the statistics."""
    betas, lengths = np.asarray(betas, np.float64), np.asarray(lengths)
    mask = np.arange(betas.shape[1])[None, :] < lengths[:, None]
    sums = np.sum(np.where(mask, betas, 0.0), axis=1)
    total = int(lengths.sum())
    alpha = float(sums.sum() / total)
    m = len(lengths)
    spread = np.sqrt(m / (m - 1) * np.sum((sums - alpha * lengths)**2)) if m > 1 else np.nan
    return cls(alpha=alpha, stderr=float(spread / total), std=float(np.std(betas[mask])),
               sequence_alpha=sums / lengths, positions=total)

  def row(self) -> dict[str, float]:
    """The flat record a report row takes (quantiles of `sequence_alpha`)."""
    quantiles = np.quantile(self.sequence_alpha, ALPHA_QUANTILES)
    return dict(alpha=self.alpha, stderr=self.stderr, std=self.std,
                sequences=len(self.sequence_alpha), positions=self.positions,
                **{f'q{round(100 * q)}': float(v) for q, v in zip(ALPHA_QUANTILES, quantiles)})


@jax.jit
def betas(target: models.T5Model, draft: Draft, encoder_input_tokens: jax.Array,
          tokens: jax.Array, sampling: sampling_lib.SamplingParams) -> jax.Array:
  """beta at every position of given output sequences, one pass per model.

  Args:
    target: M_p.
    draft: M_q, same vocabulary.
    encoder_input_tokens: [B, S] int32, 0 = padding.
    tokens: [B, L] int32 outputs; position j holds token j + 1 of the output.
    sampling: applied identically to p and q.

  Returns:
    [B, L] float32 sum_x min(p_j(x), q_j(x)), p_j and q_j the adjusted
    distributions of output token j + 1 given tokens 1..j.
  """
  decoder_input_tokens = jnp.pad(tokens[:, :-1], ((0, 0), (1, 0)))  # BOS, shifted right
  p = sampling_lib.adjust(teacher_forced_logits(target, encoder_input_tokens,
                                                decoder_input_tokens), sampling)
  q = sampling_lib.adjust(teacher_forced_logits(draft, encoder_input_tokens,
                                                decoder_input_tokens), sampling)
  return jnp.sum(jnp.minimum(p, q), axis=-1)


def _batches(n: int, batch_size: int) -> Iterator[np.ndarray]:
  """Row indices of each batch; the last is padded by repeating its last row."""
  for start in range(0, n, batch_size):
    yield np.minimum(np.arange(start, start + batch_size), n - 1)


def generate_sequences(target: models.T5Model, encoder_input_tokens: np.ndarray, *,
                       sampling: sampling_lib.SamplingParams, max_decode_len: int,
                       rng: jax.Array, batch_size: int = 16,
                       progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """The target's own outputs, batched (input i sampled with fold_in(rng, i)).

  Returns:
    tokens [N, max_decode_len] int32 (EOS included, 0 after) and lengths [N].
  """
  n = len(encoder_input_tokens)
  keys = jax.vmap(functools.partial(jax.random.fold_in, rng))(jnp.arange(n))
  tokens, lengths = [], []
  for rows in tqdm.tqdm(list(_batches(n, batch_size)), desc='generate', disable=not progress):
    out = models.generate(target, jnp.asarray(encoder_input_tokens[rows]), keys[rows],
                          max_decode_len=max_decode_len, sampling=sampling, eos_id=EOS_ID)
    tokens.append(np.asarray(out.tokens))
    lengths.append(np.asarray(out.lengths))
  return np.concatenate(tokens)[:n], np.concatenate(lengths)[:n]


def measure_alpha(target: models.T5Model, draft: Draft, encoder_input_tokens: np.ndarray,
                  tokens: np.ndarray, lengths: np.ndarray, *,
                  sampling: sampling_lib.SamplingParams, batch_size: int = 16) -> AlphaStats:
  """alpha of a draft on the target's outputs (from `generate_sequences`).

  Args:
    target: M_p, which generated `tokens` with the same `sampling`.
    draft: M_q, a T5Model or a draft provider.
    encoder_input_tokens: [N, S] int32.
    tokens: [N, L] int32 the target's outputs.
    lengths: [N] their lengths.
    sampling: applied identically to p and q.
    batch_size: rows per teacher-forced pass.
  """
  n = len(tokens)
  per_row = [np.asarray(betas(target, draft, jnp.asarray(encoder_input_tokens[rows]),
                              jnp.asarray(tokens[rows]), sampling))
             for rows in _batches(n, batch_size)]
  return AlphaStats.from_betas(np.concatenate(per_row)[:n], lengths)


# ---------------------------------------------------------------------------
# c and r(K): step times inside compiled loops.


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Seconds per model call inside a compiled loop (batch 1, compile excluded).

  Attributes:
    draft_s: one draft step (K = 1) in a run of draft steps (a loop of draft
      steps alone): the cost of draft steps 2 .. gamma of an iteration.
    draft_first_s: the first draft step after a target call: what a draft
      step adds to a loop of target steps (timed paired, see
      `draft_step_in_loop_time`). On a CPU it exceeds `draft_s` by the DRAM
      traffic of re-reading the draft weights that the target call evicted
      from the cache.
    verify_measured_s: [k_max] one target call over K = 1 .. k_max
      positions, as timed.
  """

  draft_s: float
  draft_first_s: float
  verify_measured_s: np.ndarray

  @property
  def verify_s(self) -> np.ndarray:
    """[k_max] the verify times as used: the non-decreasing fit of the measured ones."""
    return nondecreasing_fit(self.verify_measured_s)

  @property
  def target_s(self) -> float:
    """One target step (K = 1)."""
    return float(self.verify_s[0])

  @property
  def c(self) -> float:
    """The paper's c: a draft step over a target step."""
    return self.draft_s / self.target_s

  @property
  def c_first(self) -> float:
    """The first draft step of an iteration over a target step."""
    return self.draft_first_s / self.target_s

  @property
  def r(self) -> np.ndarray:
    """[k_max] r(K) = verify_s[K - 1] / target_s, theory's `verify_cost`."""
    return self.verify_s / self.target_s

  def row(self) -> dict:
    return dict(target_step_ms=1e3 * self.target_s, draft_step_ms=1e3 * self.draft_s, c=self.c,
                draft_first_ms=1e3 * self.draft_first_s, c_first=self.c_first,
                verify_ms=(1e3 * self.verify_s).tolist(), r=self.r.tolist(),
                verify_measured_ms=(1e3 * np.asarray(self.verify_measured_s)).tolist())


def _timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
  """Median walltime of fn() over `repeats` runs (already compiled), last result."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return float(np.median(times)), out


@functools.partial(jax.jit, static_argnames=('capacity',))
def _fresh_cache(model: Draft, encoder_input_tokens: jax.Array, capacity: int):
  return model.start(encoder_input_tokens, capacity)[1]


@functools.partial(jax.jit, static_argnames=('k', 'num_steps'))
def _step_loop(model: Draft, encoder_input_tokens: jax.Array, cache: cache_lib.Cache, *,
               k: int, num_steps: int) -> jax.Array:
  """num_steps calls over K positions, each fed the argmaxes of the last (serial)."""
  step_fn, _ = model.start(encoder_input_tokens, cache.capacity)  # XLA drops the unused encoder.
  position = cache.index

  def body(_, carry):
    tokens, cache = carry
    logits, cache = step_fn(tokens, cache)
    return sampling_lib.argmax(logits).astype(jnp.int32), cache_lib.rewind(cache, position)

  tokens = jnp.full((cache.batch_size, k), EOS_ID + 1, jnp.int32)
  return jax.lax.fori_loop(0, num_steps, body, (tokens, cache))[0]


@functools.partial(jax.jit, static_argnames=('num_steps',))
def _pair_loop(target: models.T5Model, draft: Draft, encoder_input_tokens: jax.Array,
               caches: tuple[cache_lib.Cache, cache_lib.Cache], *, num_steps: int) -> jax.Array:
  """num_steps (draft step, target step) pairs at K = 1, each fed the other's argmax."""
  (target_cache, draft_cache) = caches
  target_step, _ = target.start(encoder_input_tokens, target_cache.capacity)
  draft_step, _ = draft.start(encoder_input_tokens, draft_cache.capacity)
  position = target_cache.index

  def body(_, carry):
    tokens, target_cache, draft_cache = carry
    logits, draft_cache = draft_step(tokens, draft_cache)
    logits, target_cache = target_step(sampling_lib.argmax(logits).astype(jnp.int32),
                                       target_cache)
    return (sampling_lib.argmax(logits).astype(jnp.int32),
            cache_lib.rewind(target_cache, position), cache_lib.rewind(draft_cache, position))

  tokens = jnp.full((target_cache.batch_size, 1), EOS_ID + 1, jnp.int32)
  return jax.lax.fori_loop(0, num_steps, body, (tokens, target_cache, draft_cache))[0]


def draft_step_in_loop_time(target: models.T5Model, draft: Draft,
                            encoder_input_tokens: jax.Array, *, capacity: int, position: int,
                            num_steps: int = 64, repeats: int = 5) -> float:
  """Seconds a draft step adds to a loop of target steps (K = 1), paired.

  Runs of a (draft step, target step) loop alternate with runs of a target-step
  loop; the result is the median of the per-pair differences, so that drift of
  a shared machine between runs cancels instead of landing in c.
  """
  encoder_input_tokens = jnp.asarray(encoder_input_tokens)
  target_cache, draft_cache = (
      cache_lib.rewind(c, jnp.full_like(c.index, position)) for c in (
          _fresh_cache(target, encoder_input_tokens, capacity),
          _fresh_cache(draft, encoder_input_tokens, capacity)))
  pair = lambda: _pair_loop(target, draft, encoder_input_tokens, (target_cache, draft_cache),
                            num_steps=num_steps)
  alone = lambda: _step_loop(target, encoder_input_tokens, target_cache, k=1,
                             num_steps=num_steps)
  jax.block_until_ready((pair(), alone()))  # compile and warm up
  differences = [_timed(pair, 1)[0] - _timed(alone, 1)[0] for _ in range(2 * repeats + 1)]
  return max(float(np.median(differences)), 0.0) / num_steps


def step_time(model: Draft, encoder_input_tokens: jax.Array, *, k: int = 1, capacity: int,
              position: int, num_steps: int = 64, repeats: int = 5) -> float:
  """Seconds per call of a model's step function over K positions.

  Args:
    model: a T5Model or a draft provider.
    encoder_input_tokens: [B, S] int32 (batch 1 for the paper's setting).
    k: positions per call.
    capacity: the cache's positions, e.g. decoding.cache_length(...).
    position: the cache index every call writes at (rewound after each);
      position + k <= capacity.
    num_steps: calls per compiled loop.
    repeats: timed runs of the loop; the median is taken.
  """
  if position + k > capacity:
    raise ValueError(f'position {position} + k {k} exceeds the capacity {capacity}')
  encoder_input_tokens = jnp.asarray(encoder_input_tokens)
  cache = _fresh_cache(model, encoder_input_tokens, capacity)
  cache = cache_lib.rewind(cache, jnp.full_like(cache.index, position))
  run = lambda: _step_loop(model, encoder_input_tokens, cache, k=k, num_steps=num_steps)
  jax.block_until_ready(run())  # compile and warm up
  return _timed(run, repeats)[0] / num_steps


def measure_step_times(target: models.T5Model, draft: Draft, encoder_input_tokens: np.ndarray,
                       *, k_max: int, max_decode_len: int, num_steps: int = 64,
                       repeats: int = 5, progress: bool = False) -> StepTimes:
  """c, c_first and r(K) for K = 1 .. k_max (k_max = gamma_max + 1), at mid-output.

  See `StepTimes` for what each time is.

  Args:
    target: M_p.
    draft: M_q.
    encoder_input_tokens: [1, S] one real input.
    k_max: the largest verify call timed.
    max_decode_len: sets the caches' capacity as decoding does.
    num_steps: calls per compiled loop.
    repeats: timed runs per loop.
    progress: show a progress bar.
  """
  capacity = decoding.cache_length(max_decode_len, k_max - 1)
  timed = functools.partial(step_time, encoder_input_tokens=encoder_input_tokens,
                            capacity=capacity, position=max_decode_len // 2,
                            num_steps=num_steps, repeats=repeats)
  draft_s = timed(draft)
  verify_measured_s = np.asarray([timed(target, k=k) for k in tqdm.trange(
      1, k_max + 1, desc='r(K)', disable=not progress)])
  draft_first_s = draft_step_in_loop_time(
      target, draft, encoder_input_tokens, capacity=capacity, position=max_decode_len // 2,
      num_steps=num_steps, repeats=repeats)
  return StepTimes(draft_s=draft_s, draft_first_s=draft_first_s,
                   verify_measured_s=verify_measured_s)


def nondecreasing_fit(values: np.ndarray) -> np.ndarray:
  """The least-squares non-decreasing sequence closest to `values` (pool adjacent violators).

  A target call over more positions never costs less, so a dip in measured
  r(K) is noise; left in, it would make best_gamma chase it.

  Args:
    values: [n] measurements in order of K.

  Returns:
    [n] the fit: each run of violators replaced by its mean.
  """
  blocks = []  # [mean, count] of pooled runs
  for value in np.asarray(values, np.float64):
    blocks.append([value, 1])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
      blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
  return np.concatenate([np.full(n, m) for m, n in blocks])


# ---------------------------------------------------------------------------
# Walltime (Table 2).

DecodeFn = Callable[[jax.Array, jax.Array], decoding.DecodeOutput]


@dataclasses.dataclass(frozen=True)
class Decoded:
  """N inputs decoded one by one (batch 1), timed.

  Attributes:
    seconds: [N] median seconds per input over the repeats.
    tokens: N output id lists (EOS included when emitted).
    iterations: [N] loop iterations, i.e. target calls.
    draft_calls: [N] draft calls (0 for the baseline).
    accept_histogram: [gamma + 1] how often 0..gamma drafts were accepted,
      over all inputs (the baseline: [target calls]).
  """

  seconds: np.ndarray
  tokens: list[list[int]]
  iterations: np.ndarray
  draft_calls: np.ndarray
  accept_histogram: np.ndarray

  @property
  def total_s(self) -> float:
    return float(np.sum(self.seconds))

  @property
  def tokens_per_call(self) -> float:
    """Generated tokens per target call (eq. (1) measured)."""
    return sum(map(len, self.tokens)) / max(int(np.sum(self.iterations)), 1)

  def fixed_s(self) -> float:
    """Seconds per input that do not grow with the loop's iterations.

    The intercept of a least-squares line through (iterations, seconds) of
    the inputs: encoder passes, cache set-up and the call's dispatch, which
    eq. (5) does not model. 0 when all inputs took the same number of
    iterations (no line to fit); clipped to [0, shortest input's seconds].
    """
    if len(np.unique(self.iterations)) < 2:
      return 0.0
    _, intercept = np.polyfit(self.iterations.astype(float), self.seconds, 1)
    return float(np.clip(intercept, 0.0, np.min(self.seconds)))


def baseline_decoder(target: models.T5Model, *, max_decode_len: int,
                     sampling: sampling_lib.SamplingParams) -> DecodeFn:
  """The target alone, `models.generate`, as a DecodeFn."""
  return lambda inputs, keys: models.generate(target, inputs, keys, max_decode_len=max_decode_len,
                                              sampling=sampling, eos_id=EOS_ID)


def t5x_baseline_decoder(target: models.T5Model, *, max_decode_len: int,
                         sampling: sampling_lib.SamplingParams, eos_id: int = EOS_ID) -> DecodeFn:
  """T5X's own `decoding.temperature_sample` on the same network, as a DecodeFn.

  Needs `t5x` (not on PyPI; researchers with TPUs have it). Its
  `tokens_to_logits` is our step function over our explicit cache, so the
  comparison isolates the decoding loop. top-k is not supported (T5X's is
  static); top-p is passed through.

  Raises:
    ImportError: t5x is not importable.
    ValueError: sampling.top_k is set.
  """
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top

  if np.any(np.asarray(sampling.top_k) > 0):
    raise ValueError('the T5X baseline takes no top_k here; use top_p or plain sampling')
  top_p = float(np.asarray(sampling.top_p))

  @jax.jit
  def decode(inputs: jax.Array, keys: jax.Array) -> decoding.DecodeOutput:
    step_fn, cache = target.start(inputs, decoding.cache_length(max_decode_len))

    def tokens_to_logits(state):
      logits, new_cache = step_fn(state.cur_token, state.cache)
      return logits[:, 0], new_cache

    decodes, _ = t5x_decoding.temperature_sample(
        jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32), cache, tokens_to_logits,
        eos_id=eos_id, decode_rng=jax.random.key_data(keys[0]), num_decodes=1,
        temperature=sampling.temperature, topk=0, topp=top_p if top_p < 1 else 0.0)
    tokens = decodes[:, 0]  # [B, max_decode_len], 0 after EOS
    is_eos = tokens == eos_id
    lengths = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1,
                        max_decode_len).astype(jnp.int32)
    calls = jnp.max(lengths)  # T5X steps every row until the last one ends
    return decoding.DecodeOutput(
        tokens=tokens, lengths=lengths, generated=lengths, target_calls=lengths,
        draft_calls=jnp.zeros_like(lengths), accept_histogram=jnp.sum(lengths)[None],
        loop_target_calls=calls, loop_draft_calls=jnp.zeros((), jnp.int32))

  return decode


def speculative_decoder(target: models.T5Model, draft: Draft, *, gamma: int,
                        max_decode_len: int, sampling: sampling_lib.SamplingParams,
                        lenience: float = 1.0) -> DecodeFn:
  """`models.speculative_generate` with a fixed gamma and lenience, as a DecodeFn."""
  return lambda inputs, keys: models.speculative_generate(
      target, draft, inputs, keys, gamma=gamma, max_decode_len=max_decode_len, sampling=sampling,
      lenience=lenience, eos_id=EOS_ID)


def time_decoding(decoders: dict[str, DecodeFn], encoder_input_tokens: np.ndarray,
                  rng: jax.Array, *, repeats: int = 3, progress: bool = False
                  ) -> dict[str, Decoded]:
  """Decodes each input alone with every decoder, interleaved, timed.

  Input i is decoded with key fold_in(rng, i) by every decoder and in every
  repeat. Each decoder compiles once, on input 0, before any timing.

  Args:
    decoders: name -> `decode(inputs [1, S], keys [1]) -> DecodeOutput`.
    encoder_input_tokens: [N, S] int32, one shape for all inputs.
    rng: one PRNG key.
    repeats: timed runs per input and decoder; the median is kept.
    progress: show a progress bar.

  Returns:
    name -> Decoded.
  """
  inputs = [jnp.asarray(encoder_input_tokens[i:i + 1]) for i in range(len(encoder_input_tokens))]
  keys = [jax.random.fold_in(rng, i)[None] for i in range(len(inputs))]
  for decode in decoders.values():
    jax.block_until_ready(decode(inputs[0], keys[0]))
  records = {name: [] for name in decoders}
  for x, key in zip(tqdm.tqdm(inputs, desc='walltime', disable=not progress), keys):
    for name, decode in decoders.items():
      seconds, out = _timed(lambda: decode(x, key), repeats)
      records[name].append((seconds, jax.device_get(out)))
  return {name: Decoded(
      seconds=np.asarray([s for s, _ in outs]),
      tokens=[o.tokens[0, :o.lengths[0]].tolist() for _, o in outs],
      iterations=np.asarray([int(o.loop_target_calls) for _, o in outs]),
      draft_calls=np.asarray([int(o.loop_draft_calls) for _, o in outs]),
      accept_histogram=np.sum([o.accept_histogram for _, o in outs], axis=0))
          for name, outs in records.items()}


def summarize(baseline: Decoded, speculative: Decoded, *, gamma: int, alpha: float,
              times: StepTimes) -> dict:
  """Measured against predicted speedup, and where an iteration's time goes.

  Args:
    baseline: the target alone.
    speculative: speculative decoding of the same inputs with `gamma`.
    gamma: its draft length; times must cover K = gamma + 1.
    alpha: the measured acceptance rate (e.g. `measure_alpha`).
    times: the measured step times.

  Returns:
    A flat record: speedups (measured; eq. (5) with the measured r(gamma + 1)
    and c_first; the paper's eq. (5) with r = 1 and c alone), tokens per call
    (measured, eq. (1)), the fraction of outputs identical to the baseline's,
    milliseconds per baseline token and per speculative iteration, split into
    draft steps, verify pass, the per-input fixed cost (`Decoded.fixed_s`)
    spread over the iterations, and the rest (the loop's own work: sampling,
    the accept test, cache bookkeeping), and the speedup of the loops alone
    (fixed costs removed), which is what eq. (5) predicts.
  """
  iterations = int(np.sum(speculative.iterations))
  iteration_ms = 1e3 * speculative.total_s / iterations
  n = len(speculative.seconds)
  baseline_fixed_s, speculative_fixed_s = baseline.fixed_s(), speculative.fixed_s()
  fixed_ms = 1e3 * speculative_fixed_s * n / iterations
  loop_speedup = ((baseline.total_s - n * baseline_fixed_s)
                  / (speculative.total_s - n * speculative_fixed_s))
  # One first draft step per iteration, the other draft calls in a run.
  draft_calls = int(np.sum(speculative.draft_calls))
  draft_ms = 1e3 * (times.draft_first_s * min(iterations, draft_calls)
                    + times.draft_s * max(draft_calls - iterations, 0)) / iterations
  verify_ms = 1e3 * float(times.verify_s[gamma])
  token_ms = 1e3 * baseline.total_s / int(np.sum(baseline.iterations))
  return dict(
      gamma=gamma, alpha=alpha, c=times.c, c_first=times.c_first, r=float(times.r[gamma]),
      measured_speedup=baseline.total_s / speculative.total_s,
      loop_speedup=loop_speedup, baseline_fixed_ms=1e3 * baseline_fixed_s,
      speculative_fixed_ms=1e3 * speculative_fixed_s,
      predicted_speedup=float(theory.walltime_improvement(alpha, gamma, times.c, times.r,
                                                          times.c_first)),
      predicted_speedup_eq5=float(theory.walltime_improvement(alpha, gamma, times.c)),
      tokens_per_call=speculative.tokens_per_call,
      expected_tokens_per_call=float(theory.expected_tokens(alpha, gamma)),
      identical=float(np.mean([b == s for b, s in zip(baseline.tokens, speculative.tokens)])),
      baseline_s=baseline.total_s, speculative_s=speculative.total_s,
      baseline_token_ms=token_ms, target_step_ms=1e3 * times.target_s,
      iteration_ms=iteration_ms, draft_ms=draft_ms, verify_ms=verify_ms, fixed_ms=fixed_ms,
      other_ms=iteration_ms - draft_ms - verify_ms - fixed_ms,
      accept_histogram=speculative.accept_histogram.tolist())


# ---------------------------------------------------------------------------
# The decoding loops' own work (sampling, the accept test, bookkeeping).


def loop_work_time(*, gamma: int, temperature: float, vocab_size: int = 8192,
                   max_decode_len: int = 64, repeats: int = 9) -> float:
  """Seconds per iteration of a decoding loop whose model calls cost nothing.

  The step functions return fixed random logits (different ones for draft and
  target), so what is timed is the loop itself: adjusting and sampling over
  the vocabulary, the accept test, writing tokens, rewinding caches. Batch 1,
  compile excluded, median over repeats.

  Args:
    gamma: draft length; 0 times the baseline loop (one target call a token).
    temperature: sampling temperature (0: greedy).
    vocab_size: V of the logits.
    max_decode_len: tokens per decode (no EOS is ever drawn).
    repeats: timed decodes.
  """
  rng = np.random.default_rng(0)
  p_logits, q_logits = (jnp.asarray(2 * rng.standard_normal(vocab_size), jnp.float32)
                        for _ in range(2))

  def free_step(logits):
    def step_fn(tokens, cache):
      # Depends on the tokens, so XLA cannot hoist the sampling out of the loop.
      out = logits + 0.0 * tokens[..., None].astype(jnp.float32)  # [B, K, V]
      return out, cache.replace(index=cache.index + tokens.shape[1])
    return step_fn

  capacity = decoding.cache_length(max_decode_len, gamma)
  cache = cache_lib.Cache(index=jnp.zeros((1,), jnp.int32),
                          layers=jnp.zeros((1, capacity), jnp.int32), capacity=capacity)
  sampling = sampling_lib.SamplingParams.create(temperature)
  common = dict(max_decode_len=max_decode_len, sampling=sampling, eos_id=-1)
  if gamma:
    decode = jax.jit(lambda key: decoding.speculative_decode(
        free_step(p_logits), cache, free_step(q_logits), cache, gamma=gamma, rng=key, **common))
  else:
    decode = jax.jit(lambda key: decoding.autoregressive_decode(
        free_step(p_logits), cache, rng=key, **common))
  jax.block_until_ready(decode(jax.random.key(0)))  # compile
  seconds, out = _timed(lambda: decode(jax.random.key(0)), repeats)
  return seconds / int(out.loop_target_calls)
