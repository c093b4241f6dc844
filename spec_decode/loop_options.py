"""LoopOptions: the static options of a decoding loop, one frozen object checked once."""

import dataclasses
import functools

from spec_decode import api_checks
from spec_decode import drafting
from spec_decode import speculative
from spec_decode.loop_utils import check_size


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """The static options of a decoding loop, checked once when built.

  Frozen and hashable, so one object is a `jax.jit` static argument: the
  front ends (`models`, `sharding`, the command line) build it from their
  keyword arguments and pass it down whole. Changing it recompiles; the
  traced knobs (sampling, draft_sampling, lenience, confidence_threshold)
  are arguments of the loop and never recompile.

  Attributes:
    max_decode_len: most output tokens per row, an int >= 1.
    gamma: drafted tokens per iteration, an int >= 1; 0 is the baseline.
    verification: 'token' (Algorithm 1) or 'block' (speculative.accept_reject).
    verify_lengths: None (every verify call covers gamma + 1 positions), or
      the K values of drafting.verify, stored sorted with gamma + 1 added.
    eos_id: the token that ends a row (a negative id: none does, as the
      cost measurements decode to max_decode_len).
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
    assign('max_decode_len', check_size('max_decode_len', self.max_decode_len))
    assign('gamma', check_size('gamma', self.gamma, minimum=0))
    speculative.check_verification(self.verification)
    if not self.gamma and (self.verification != 'token' or self.verify_lengths is not None):
      raise ValueError(f'the baseline (gamma 0) verifies nothing: verification '
                       f'{self.verification!r} and verify_lengths {self.verify_lengths!r} need '
                       f'gamma >= 1')
    assign('verify_lengths', drafting.check_verify_lengths(self.verify_lengths, self.gamma))
    assign('eos_id', api_checks.check_int('eos_id', self.eos_id, minimum=-api_checks.INT32_MAX))
    if not isinstance(self.check_finite, bool):
      raise ValueError(f'check_finite must be True or False, got {self.check_finite!r}')
    if self.max_decode_len + self.gamma + 2 > api_checks.INT32_MAX:  # the tokens buffer
      raise ValueError(f'max_decode_len + gamma + 2 must be at most {api_checks.INT32_MAX} '
                       f'(positions are int32), got {self.max_decode_len} + {self.gamma} + 2')
