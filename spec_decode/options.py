"""The options of a decoding loop: static ones (LoopOptions) and traced ones (Knobs).

Both are checked once, where they are built, and travel whole from the front
ends (spec_decode.models.front_ends, the command line) down to the loop body.
"""

import dataclasses
import functools

import flax.struct
import jax

from spec_decode import checks
from spec_decode import sampling as sampling_lib


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """The static options of a decoding loop, checked once when built.

  Frozen and hashable, so one object is a `jax.jit` static argument: the
  front ends build it from their keyword arguments and pass it down whole.
  Changing it recompiles; the traced `Knobs` never do.

  Attributes:
    max_decode_len: most output tokens per row, an int >= 1.
    gamma: drafted tokens per iteration, an int >= 1; 0 is the baseline.
    verification: 'token' (Algorithm 1) or 'block' (speculative.accept_reject).
    verify_lengths: None (every verify call covers gamma + 1 positions), or
      the K values of draft_phase.verify, stored sorted with gamma + 1 added.
    eos_id: the token that ends a row; a negative id: none does (the cost
      measurements decode to max_decode_len). The front ends take -1 or an
      id of the model's vocabulary (checks.check_eos).
    check_finite: stop a row whose logits are not finite and flag it in
      DecodeOutput.nonfinite (loop_utils.nonfinite_rows).

  Raises:
    ValueError: a value outside its range, named (also verify_lengths or a
      verification other than 'token' for the baseline).
  """

  max_decode_len: int
  gamma: int = 0
  verification: str = 'token'
  verify_lengths: tuple[int, ...] | None = None
  eos_id: int = 1
  check_finite: bool = True

  def __post_init__(self):
    assign = functools.partial(object.__setattr__, self)
    assign('max_decode_len', checks.check_size('max_decode_len', self.max_decode_len))
    assign('gamma', checks.check_size('gamma', self.gamma, minimum=0))
    checks.check_verification(self.verification)
    if not self.gamma and (self.verification != 'token' or self.verify_lengths is not None):
      raise ValueError(f'the baseline (gamma 0) verifies nothing: verification '
                       f'{self.verification!r} and verify_lengths {self.verify_lengths!r} need '
                       f'gamma >= 1')
    assign('verify_lengths', checks.check_verify_lengths(self.verify_lengths, self.gamma))
    assign('eos_id', checks.check_int('eos_id', self.eos_id, minimum=-checks.INT32_MAX))
    if not isinstance(self.check_finite, bool):
      raise ValueError(f'check_finite must be True or False, got {self.check_finite!r}')
    if self.max_decode_len + self.gamma + 2 > checks.INT32_MAX:  # the tokens buffer
      raise ValueError(f'max_decode_len + gamma + 2 must be at most {checks.INT32_MAX} '
                       f'(positions are int32), got {self.max_decode_len} + {self.gamma} + 2')


@flax.struct.dataclass
class Knobs:
  """The traced knobs of a decoding loop: changing them never recompiles.

  Build it with `Knobs.create`, which checks each value once; inside a traced
  function construct `Knobs(...)` directly.

  Attributes:
    sampling: temperature/top-k/top-p of the target's p (what the output follows).
    draft_sampling: the knobs that turn the draft's logits into q. Any q keeps
      the output exact (e.g. `sampling.untruncated()` skips the draft's
      top-k/top-p work for a little acceptance).
    lenience: l of Appendix A.5 in (0, 1]; 1 is exact.
    confidence_threshold: None drafts gamma tokens per iteration; a number in
      [0, 1] makes gamma a maximum (spec_decode.draft_phase). None or not is
      part of the program (a pytree leaf or none), its value is traced.
  """

  sampling: sampling_lib.SamplingParams
  draft_sampling: sampling_lib.SamplingParams
  lenience: jax.Array | float = 1.0
  confidence_threshold: jax.Array | float | None = None

  @classmethod
  def create(cls, sampling: sampling_lib.SamplingParams | None = None,
             draft_sampling: sampling_lib.SamplingParams | None = None,
             lenience: float | jax.Array = 1.0,
             confidence_threshold: float | jax.Array | None = None) -> 'Knobs':
    """The knobs, each checked (traced values pass the value checks).

    Args:
      sampling: None is greedy (temperature 0).
      draft_sampling: None takes `sampling`'s.
      lenience: a number in (0, 1].
      confidence_threshold: None, or a number in [0, 1].

    Raises:
      TypeError: sampling knobs that are not SamplingParams.
      ValueError: a lenience or confidence_threshold out of its range.
    """
    sampling = sampling_lib.SamplingParams.create() if sampling is None else sampling
    draft_sampling = sampling if draft_sampling is None else draft_sampling
    for name, value in (('sampling', sampling), ('draft_sampling', draft_sampling)):
      if not isinstance(value, sampling_lib.SamplingParams):
        raise TypeError(f'{name} must be a SamplingParams (SamplingParams.create(...)), got '
                        f'{type(value).__name__}')
    checks.check_lenience(lenience)
    checks.check_threshold(confidence_threshold)
    return cls(sampling, draft_sampling, lenience, confidence_threshold)

  def check_batch(self, batch: int) -> None:
    """Raises ValueError unless each sampling knob is a scalar or [batch]."""
    sampling_lib.check_batch(self.sampling, batch)
    sampling_lib.check_batch(self.draft_sampling, batch, 'draft_sampling')
