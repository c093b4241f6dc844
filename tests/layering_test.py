"""The package's layers: who may import whom, and a core that needs no optional library."""

import ast
import pathlib
import subprocess
import sys
import textwrap

import pytest


ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'spec_decode'
# The loops and the paper's equations: they see step functions and caches, never a model.
ENGINE = ('decoding', 'speculative', 'draft_phase', 'sampling', 'cache', 'loop_utils', 'beam_search',
          'speculative_beam', 'theory', 'checks', 'options')
# What a decoding user installs without extras: everything but the harness and the seqio tasks.
OPTIONAL = ('seqio', 'tensorflow', 'tensorflow_datasets', 'torch', 'transformers', 'matplotlib')


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imports(path: pathlib.Path) -> set[str]:
  """The absolute module names a file imports (`from a import b` gives a and a.b)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
      names.update(f'{node.module}.{alias.name}' for alias in node.names)
  return names


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob('*.py'))}


def offenders(allowed, forbidden_prefixes):
  return sorted(f'{name} imports {target}' for name, targets in MODULES.items()
                if not allowed(name) for target in targets
                if any(target == f or target.startswith(f + '.') for f in forbidden_prefixes))


def test_only_the_harness_and_the_demo_import_the_harness():
  inside = lambda name: name.startswith('spec_decode.harness') or name == 'spec_decode.demo'
  assert not offenders(inside, ['spec_decode.harness'])


def test_the_engine_imports_no_model_checkpoint_cli_or_training_code():
  engine = [f'spec_decode.{name}' for name in ENGINE]
  assert set(engine) <= set(MODULES), sorted(set(engine) - set(MODULES))
  forbidden = ['spec_decode.' + name for name in (
      'models', 'multihost', 'text', 't5', 'llama', 'checkpoints', 'cli', 'training', 'harness',
      'demo', 'data')]
  assert not offenders(lambda name: name not in engine, forbidden)


def test_the_command_line_imports_no_training_code():
  assert not offenders(lambda n: not n.startswith('spec_decode.cli'), ['spec_decode.training'])


def test_the_checks_see_a_violation(monkeypatch):
  monkeypatch.setitem(MODULES, 'spec_decode.decoding', {'spec_decode.models'})
  monkeypatch.setitem(MODULES, 'spec_decode.cli.infer', {'spec_decode.harness.loading'})
  with pytest.raises(AssertionError):
    test_the_engine_imports_no_model_checkpoint_cli_or_training_code()
  with pytest.raises(AssertionError):
    test_only_the_harness_and_the_demo_import_the_harness()


_BLOCKED_IMPORT = textwrap.dedent('''
    import importlib.abc, sys
    BLOCKED = {blocked!r}
    class Block(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
          raise ImportError(f'{{name}} is blocked in this test')
    sys.meta_path.insert(0, Block())
    import importlib
    for module in {modules!r}:
      importlib.import_module(module)
    leaked = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)
    assert not leaked, leaked
    print('imported', len({modules!r}))
''')


def _import_blocked(modules, blocked=OPTIONAL):
  code = _BLOCKED_IMPORT.format(blocked=tuple(blocked), modules=list(modules))
  return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                        cwd=ROOT)


def test_the_core_imports_without_the_optional_libraries():
  core = [name for name in MODULES
          if not name.startswith('spec_decode.harness') and name not in (
              'spec_decode.demo', 'spec_decode.training.tasks', 'spec_decode.training.metrics')]
  done = _import_blocked(core)
  assert done.returncode == 0, done.stderr[-3000:]


def test_the_blocked_import_check_sees_an_optional_import():
  done = _import_blocked(['spec_decode.harness.figures'], blocked=('matplotlib',))
  assert done.returncode != 0 and 'blocked' in done.stderr


def test_no_module_of_the_package_imports_itself_through_a_cycle():
  """The import graph among spec_decode's modules is acyclic.

  A package counts as its __init__, except where a statement imports one of
  its submodules from it (`from spec_decode import data`: an edge to data).
  """
  graph = {name: {t for t in targets if t in MODULES and t != name
                  and not any(o.startswith(t + '.') for o in targets)}
           for name, targets in MODULES.items()}
  state = {}

  def visit(name, path):
    state[name] = 'open'
    for target in sorted(graph[name]):
      if state.get(target) == 'open':
        raise AssertionError(' -> '.join(path + [name, target]))
      if target not in state:
        visit(target, path + [name])
    state[name] = 'done'

  for name in sorted(graph):
    if name not in state:
      visit(name, [])


def test_the_old_flat_front_end_modules_are_gone():
  for old in ('lm', 'lm_sharding', 'sharding', 'drafts', 'pruned_head', 'acceptance', 'api_checks',
              'loop_options', 'drafting', '_moved', 'llama.model'):
    assert f'spec_decode.{old}' not in MODULES, old
