"""The module paths of the flat layout, kept importable for one release.

`import spec_decode.infer` (or `from spec_decode import train`) gives the module at its new path,
with a DeprecationWarning naming it; the moved modules are the same objects, so attributes and
gin registrations are shared.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    'spec_decode.hf_checkpoints': 'spec_decode.checkpoints.hf',
    'spec_decode.param_trees': 'spec_decode.checkpoints.param_trees',
    'spec_decode.train': 'spec_decode.training.train',
    'spec_decode.distill': 'spec_decode.training.distill',
    'spec_decode.whitebox': 'spec_decode.training.whitebox',
    'spec_decode.tasks': 'spec_decode.training.tasks',
    'spec_decode.metrics': 'spec_decode.training.metrics',
    'spec_decode.infer': 'spec_decode.cli.infer',
    'spec_decode.infer_settings': 'spec_decode.cli.settings',
    'spec_decode.jsonl': 'spec_decode.cli.jsonl',
    'spec_decode.gin_utils': 'spec_decode.cli.gin_utils',
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Finds an old module name and loads it as the module at its new path."""

  def __init__(self):
    self._specs = {}  # new module name -> its own spec

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname not in MOVED:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    new = MOVED[spec.name]
    warnings.warn(f'{spec.name} moved to {new}; the old path goes in the next release',
                  DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    self._specs[new] = module.__spec__
    return module

  def exec_module(self, module):
    # Already executed at its new path; importlib has just set the old name's spec on it, so
    # give the module its own back (importlib.reload and pickling go by __spec__.name).
    module.__spec__ = self._specs[module.__name__]


def install() -> None:
  """Puts the alias finder on sys.meta_path, once."""
  if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
