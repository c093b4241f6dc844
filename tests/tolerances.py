"""Equality up to float32 rounding, relative to the magnitude of what is compared.

Two computations of the same quantity along different arithmetic paths (a
call over gamma + 1 positions against one-position calls, chunked against
whole, XLA against PyTorch) agree to a few float32 ulps of the magnitude of
the terms, not of each element: a logit near 0 carries the rounding of its
larger neighbours, and a beam score of -66 differs in its last bits on
machines whose kernels sum in another order. So the bound is `ulps` float32
epsilons times the largest magnitude of `desired`, never a fixed absolute
number (1e-5 is two ulps of a score of 66, and failed so on a Zen 2 EPYC).
"""

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23, one ulp at magnitude 1


def assert_close(actual, desired, *, ulps: float, err_msg: str = '') -> None:
  """|actual - desired| <= ulps * EPS32 * max|desired| elementwise, shapes equal."""
  actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
  bound = ulps * EPS32 * max(float(np.max(np.abs(desired), initial=0.0)), 1e-30)
  np.testing.assert_allclose(actual, desired, rtol=0, atol=bound,
                             err_msg=f'{err_msg} (bound {ulps} float32 ulps of the magnitude)')
