"""Progress bars that fall back to plain iteration where tqdm is not installed.

The accelerator benchmark (scripts/studies/shape_walltime.py) must run on
images with only jax, flax, optax, numpy, orbax, tensorstore, sentencepiece and
msgpack.
"""

from typing import Iterable, TypeVar

T = TypeVar('T')


def bar(iterable: Iterable[T], desc: str, disable: bool = False) -> Iterable[T]:
  """tqdm.tqdm(iterable, desc=desc, disable=disable), or a line per bar without tqdm."""
  try:
    import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    if not disable:
      print(f'{desc} ...', flush=True)
    return iterable
  return tqdm.tqdm(iterable, desc=desc, disable=disable)
