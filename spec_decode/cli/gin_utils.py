"""T5X-style command lines: gin files, `--gin.NAME=VALUE` bindings, clear errors.

  python scripts/decode.py --gin_file=runs/decode.gin --gin.GAMMA=5

`--gin_file` is looked up in the working directory, then in `--gin_search_path`
folders, then in this repository's gin/ folder (so `runs/decode.gin` works, and
so do `include` lines inside gin files). Values are gin expressions: strings
need quotes, `--gin.TARGET_CHECKPOINT="'/ckpt/xxl'"`. Gin stays at the edges:
library functions take plain arguments and only entry points call `run`.
"""

import argparse
import difflib
import logging
import re
import signal
import sys
import traceback
from typing import Any, Callable, Sequence

import gin

from spec_decode import data

GIN_DIR = data.repository_dir('gin')


class ConfigError(ValueError):
  """A bad setting, file or input; `run` reports it without a traceback.

  Attributes:
    message: the message, without the call site gin appends to `str(error)`.
  """

  def __init__(self, message: str):
    super().__init__(message)
    self.message = message


class Interrupted(Exception):
  """SIGINT or SIGTERM arrived; `run` reports it and exits with 128 + signum.

  Attributes:
    signum: the signal number.
    message: what the run had done, e.g. which output is incomplete.
  """

  def __init__(self, signum: int, message: str = ''):
    self.signum = signum
    self.message = message or f'interrupted by {signal.Signals(signum).name}'
    super().__init__(self.message)


def _raise_interrupted(signum: int, frame: Any) -> None:
  del frame
  raise Interrupted(signum)


def parse_flags(argv: Sequence[str], prog: str, description: str,
                example: str) -> argparse.Namespace:
  """T5X's flags: `--gin.NAME=VALUE` is short for `--gin_bindings='NAME = VALUE'`."""
  parser = argparse.ArgumentParser(prog=prog, description=description, epilog=f'e.g. {example}')
  parser.add_argument('--gin_file', action='append', default=[], required=True,
                      help='gin file, repeatable (e.g. runs/decode.gin)')
  parser.add_argument('--gin_bindings', action='append', default=[],
                      help="gin binding, repeatable (e.g. 'GAMMA = 5')")
  parser.add_argument('--gin_search_path', action='append', default=[],
                      help='folder to look up gin files and includes in, repeatable')
  rewritten = []
  for arg in argv:
    if arg.startswith('--gin.'):
      name, sep, value = arg[len('--gin.'):].partition('=')
      if not sep:
        parser.error(f'{arg}: expected --gin.NAME=VALUE')
      arg = f'--gin_bindings={name} = {value}'
    rewritten.append(arg)
  return parser.parse_args(rewritten)


def parse_gin(files: Sequence[str], bindings: Sequence[str],
              fn: Callable[..., Any]) -> Callable[..., Any]:
  """Parses gin files, then bindings; returns `fn` with gin's arguments.

  Raises:
    ConfigError: a file not found, a syntax error, a bad binding, a macro
      binding no file reads, a required macro left unbound or no binding of
      `fn`.
  """
  try:
    gin.parse_config_files_and_bindings(files, None, finalize_config=False)
  except (OSError, SyntaxError, ValueError, NameError, ImportError) as e:
    raise ConfigError(f'gin files {list(files)}: {e}') from None
  for binding in bindings:
    try:
      gin.parse_config(binding)
    except SyntaxError as e:
      raise ConfigError(f'gin binding {binding!r}: {e} (string values need quotes: '
                        "--gin.NAME=\"'text'\")") from None
    except (ValueError, NameError, ImportError) as e:
      raise ConfigError(f'gin binding {binding!r}: {e}') from None
  _check_macros_used(bindings)
  try:
    gin.finalize()
  except ValueError as e:
    if '/macro.value set to `%gin.REQUIRED`' not in str(e):
      raise ConfigError(str(e)) from None
    name = str(e).split('/macro.value')[0]
    raise ConfigError(f'{name} is required: bind it in a gin file or with --gin.{name}=VALUE') \
        from None
  try:
    return gin.get_configurable(fn)
  except ValueError:
    raise ConfigError(f'no gin file configures {fn.__module__}.{fn.__qualname__}') from None


def _check_macros_used(bindings: Sequence[str]) -> None:
  """Raises ConfigError for a `NAME = VALUE` binding that no binding refers to as %NAME.

  Gin itself rejects unknown configurables and parameters, but a macro it
  never reads (a misspelt TEMPRATURE, or MODEL_PARALLEL without
  runs/sharded/mesh.gin) is silently a new, unused macro.
  """
  used = set()
  # gin has no public view of its bindings; _CONFIG maps scoped names to them.
  bindings_so_far = gin.config._CONFIG  # pylint: disable=protected-access
  for reference in gin.config.iterate_references(bindings_so_far):
    scope, _, selector = reference.scoped_selector.rpartition('/')
    if selector == 'gin.macro':
      used.add(scope)
  for binding in bindings:
    name = binding.partition('=')[0].strip()
    if '.' in name or name in used:
      continue
    message = f'gin binding {binding!r}: no gin file uses the macro {name}'
    close = difflib.get_close_matches(name, sorted(used), n=3)
    users = _files_using(name)
    if users:
      message += ' (' + ' and '.join(f'--gin_file={path}' for path in users) + ' uses it)'
    elif close:
      message += f' (did you mean {" or ".join(close)}?)'
    raise ConfigError(message)


def _files_using(name: str) -> list[str]:
  """This repository's gin files (relative to gin/) that read macro `name`."""
  pattern = re.compile(rf'%{re.escape(name)}\b')
  return sorted(str(path.relative_to(GIN_DIR)) for path in GIN_DIR.rglob('*.gin')
                if pattern.search(path.read_text()))


def _raised_inside(fn: Callable[..., Any], error: BaseException) -> bool:
  """Whether `error` came from inside `fn`'s body, not from gin building its arguments."""
  return any(frame.f_code is fn.__code__ for frame, _ in traceback.walk_tb(error.__traceback__))


# What gin appends to an error raised inside a configurable it calls.
_GIN_CONTEXT = re.compile(r"\n\s*In call to configurable '([^']+)' \(.*?\)(?: in scope '([^']*)')?",
                          re.S)


def _without_gin_context(error: BaseException) -> str:
  """`error`'s message, gin's "In call to configurable ..." lines cut to `(gin: scope/name)`."""
  message = str(error)
  match = _GIN_CONTEXT.search(message)
  if not match:
    return message
  name, scope = match.group(1), match.group(2)
  return f'{message[:match.start()]} (gin: {scope + "/" if scope else ""}{name})'


def run(fn: Callable[..., Any], argv: Sequence[str] | None, *, prog: str, description: str,
        example: str, on_error: Callable[[str], None] | None = None) -> int:
  """Parses the flags, calls gin-configured `fn`; returns the exit status.

  A ConfigError, or an error gin meets building one of `fn`'s arguments (a
  config's bad field, a missing config.json), prints `error: ...` on stderr
  and returns 1; SIGINT and SIGTERM
  raise Interrupted inside `fn`, which prints its message and returns
  128 + the signal number. `on_error`, if given, then gets the message.
  """
  args = parse_flags(sys.argv[1:] if argv is None else argv, prog, description, example)
  # gin logs an error for every search path a file is not in before the one it is in.
  logging.getLogger().addFilter(lambda r: not r.getMessage().startswith('Path not found: '))
  for path in [*args.gin_search_path, GIN_DIR]:
    gin.add_config_file_search_path(str(path))
  handlers = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    configured = parse_gin(args.gin_file, args.gin_bindings, fn)
    try:
      configured()
    except (ValueError, TypeError, OSError) as e:
      if isinstance(e, ConfigError) or _raised_inside(fn, e):
        raise
      # gin built an argument (a config, a vocabulary) and that failed: a setting's fault.
      raise ConfigError(f'{type(e).__name__}: {_without_gin_context(e)}') from None
  except ConfigError as e:
    print(f'error: {e.message}', file=sys.stderr)
    if on_error is not None:
      on_error(e.message)
    return 1
  except Interrupted as e:
    print(f'error: {e.message}', file=sys.stderr)
    if on_error is not None:
      on_error(e.message)
    return 128 + e.signum
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
  return 0
