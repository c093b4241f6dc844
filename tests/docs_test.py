"""The README and docs: length, links that resolve, no internal vocabulary, scripts that exist."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / 'README.md'
PAGES = [README, *sorted((ROOT / 'docs').glob('*.md')), ROOT / 'docs' / 'results' / 'README.md',
         ROOT / 'configs' / 'README.md', ROOT / 'spec_decode' / 'data' / 'models' / 'README.md']
# [text](target) and <img src="target">; the target up to a space, `)` or `#`.
LINK = re.compile(r'\]\(([^)\s#]+)(?:#[^)\s]*)?\)|src="([^"#]+)"')
# Words of the project's own bookkeeping that mean nothing to a reader.
INTERNAL = re.compile(r'(?i:\bmilestones?\b|\bthrowaway\b|\bissue #?\d+|\bstop \d+\b)|\bM\d{1,2}\b')


def relative_links(page: pathlib.Path) -> list[str]:
  """The links of a Markdown page that point into the repository."""
  targets = [a or b for a, b in LINK.findall(page.read_text(encoding='utf-8'))]
  return [t for t in targets if not re.match(r'[a-z]+:', t)]


def test_readme_is_a_doorway():
  assert len(README.read_text(encoding='utf-8')) <= 20_000


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
  missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
  assert not missing, f'{page.relative_to(ROOT)} links to missing files: {missing}'


def test_the_link_check_finds_a_missing_file(tmp_path):
  page = tmp_path / 'page.md'
  (tmp_path / 'there.md').write_text('x')
  page.write_text('[a](there.md) [b](gone.md#part) [c](https://example.org/x) ![d](img/no.png)')
  assert [t for t in relative_links(page) if not (tmp_path / t).exists()] == ['gone.md',
                                                                             'img/no.png']


def _sources() -> list[pathlib.Path]:
  code = [p for folder in ('spec_decode', 'scripts', 'tests', 'gin', 'configs')
          for p in (ROOT / folder).rglob('*') if p.suffix in ('.py', '.gin', '.sh', '.md', '.json')
          and p.name != 'docs_test.py']
  return [*PAGES, *code, *sorted((ROOT / 'notebooks').glob('*.ipynb'))]


def test_no_internal_vocabulary():
  hits = [f'{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}'
          for path in _sources() if path.exists()
          for n, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1)
          if INTERNAL.search(line)]
  assert not hits, '\n'.join(hits)


def test_the_vocabulary_check_finds_bookkeeping_words():
  for line in ('as of milestone 12', 'a throwaway script', 'see issue 43', 'fixed in M7'):
    assert INTERNAL.search(line), line
  for line in ('T5 1.1 small', 'the M_q draft', 'M_p', 'gamma = 7'):
    assert not INTERNAL.search(line), line


SCRIPT = re.compile(r'\bscripts/[\w/]+\.(?:py|sh)\b')


def test_named_scripts_exist():
  missing = [f'{path.relative_to(ROOT)}: {name}' for path in _sources() if path.exists()
             for name in SCRIPT.findall(path.read_text(encoding='utf-8'))
             if not (ROOT / name).exists()]
  assert not missing, '\n'.join(missing)


def test_the_script_check_reads_paths():
  assert SCRIPT.findall('run (scripts/studies/beam.py) or `bash scripts/x.sh --small`') == [
      'scripts/studies/beam.py', 'scripts/x.sh']
