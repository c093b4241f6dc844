"""Compiles the CPU kernels once per machine and registers them with XLA.

`load()` compiles `dense.cc`, `attention.cc` and `distributions.cc` (with their
`common.h`) into one library with the system's C++ compiler (`$CXX`, else g++ or c++)
against the XLA FFI headers that ship with jaxlib (`jax.ffi.include_dir()`),
for the CPU that builds it (-march=native), into a cache folder, and registers
its handlers as XLA:CPU FFI targets. The library's name holds a hash of the
source, the compiler, the flags, jaxlib's version and the CPU's model and
instruction set, so a change of any of them builds a new one, and a home
folder shared by machines of other CPUs never loads a library built for
another instruction set. A build writes to a temporary file and renames it:
processes that build at once (test workers) each end with a whole library.

  python -m spec_decode.kernels   # builds now, prints the library's path

Cache folder: $SPEC_DECODE_KERNEL_CACHE, else $XDG_CACHE_HOME/spec_decode
(~/.cache/spec_decode). One that cannot be written (a file in its place, a
read-only folder) without the library in it is a BuildError, which
`kernels.available` turns into a warning and XLA's products.
"""

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import jax
import jaxlib

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, name)
                for name in ('dense.cc', 'attention.cc', 'distributions.cc'))
HEADERS = (os.path.join(_HERE, 'common.h'),)  # included by the sources: part of the hash
# FFI target name -> the library's handler symbol.
TARGETS = {'spec_decode_dense': 'SpecDecodeDense', 'spec_decode_dense_panels': 'SpecDecodeDensePanels',
           'spec_decode_dense_panels_bf16': 'SpecDecodeDensePanelsBf16',
           'spec_decode_embed': 'SpecDecodeEmbed', 'spec_decode_embed_bf16': 'SpecDecodeEmbedBf16',
           'spec_decode_attention': 'SpecDecodeAttention',
           'spec_decode_top_k_threshold': 'SpecDecodeTopKThreshold',
           'spec_decode_top_p_threshold': 'SpecDecodeTopPThreshold',
           'spec_decode_softmax': 'SpecDecodeSoftmax', 'spec_decode_argmax': 'SpecDecodeArgmax'}
FLAGS = ('-O3', '-march=native', '-ffp-contract=fast', '-std=c++17', '-shared', '-fPIC', '-w')
COMPILE_TIMEOUT_S = 300


class BuildError(RuntimeError):
  """The kernels could not be compiled or loaded (the message says why)."""


CACHE_VARIABLE = 'SPEC_DECODE_KERNEL_CACHE'


def cache_dir() -> str:
  """Where built libraries are kept."""
  if os.environ.get(CACHE_VARIABLE):
    return os.environ[CACHE_VARIABLE]
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'spec_decode')


def compiler() -> str:
  """The C++ compiler's path; BuildError if there is none."""
  for name in (os.environ.get('CXX'), 'g++', 'c++'):
    path = name and shutil.which(name)
    if path:
      return path
  raise BuildError('no C++ compiler ($CXX, g++ or c++) on PATH')


def _cpu() -> str:
  """The CPU's model name and instruction-set flags (Linux), else the platform's name."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as f:
      lines = [line for line in f if line.startswith(('model name', 'flags', 'Features'))]
    return ''.join(sorted(set(lines)))
  except OSError:
    return platform.processor() or platform.machine()


def library_path(cxx: str) -> str:
  """The cache path of the library this machine, compiler and jaxlib build."""
  sources = []
  for source in SOURCES + HEADERS:
    with open(source, 'rb') as f:
      sources.append(f.read())
  key = hashlib.sha256(b'\0'.join([*sources, cxx.encode(), ' '.join(FLAGS).encode(),
                                   jaxlib.__version__.encode(), _cpu().encode()]))
  return os.path.join(cache_dir(), f'kernels-{key.hexdigest()[:16]}.so')


def build() -> str:
  """Compiles the library unless it is cached; returns its path.

  Raises:
    BuildError: no compiler, a cache folder it cannot write, a compile error
      (its output quoted), or a compile that took longer than COMPILE_TIMEOUT_S.
  """
  cxx = compiler()
  path = library_path(cxx)
  if os.path.isfile(path):
    return path
  folder = os.path.dirname(path)
  try:
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix='.so', dir=folder)
  except OSError as e:  # a file in the way, a read-only folder
    raise BuildError(f'cannot write the library to the cache folder {folder} '
                     f'(${CACHE_VARIABLE} sets it): {e.strerror or e}') from None
  os.close(handle)
  command = [cxx, *FLAGS, f'-I{jax.ffi.include_dir()}', *SOURCES, '-o', temporary]
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S,
                          check=False)
    if done.returncode:
      raise BuildError(f'{" ".join(command)} failed:\n{done.stderr[-2000:]}')
    os.replace(temporary, path)
  except subprocess.TimeoutExpired:
    raise BuildError(f'compiling {", ".join(SOURCES)} took more than {COMPILE_TIMEOUT_S} s') from None
  except OSError as e:  # the compiler could not run, or the folder turned unwritable
    raise BuildError(f'building {path}: {e}') from None
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)
  return path


@functools.cache
def load() -> str:
  """Builds (or finds) the library, registers its FFI targets for XLA:CPU; returns its path.

  Raises:
    BuildError: as `build`, or a library that does not load.
  """
  path = build()
  try:
    library = ctypes.cdll.LoadLibrary(path)
    for target, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                  platform='cpu')
  except (OSError, AttributeError) as e:
    raise BuildError(f'{path} does not load: {e}') from None
  return path
