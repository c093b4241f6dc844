"""The bundled demo pair, and the README's main command.

Three T5 1.1 models trained on the bundled data (spec_decode/training/train.py,
gin/runs/train.gin; see spec_decode/data/models/README.md) and committed as
bfloat16 T5X checkpoints under spec_decode/data/models/:

  target       M_p, 4+4 layers, width 384, 20.4M parameters
  draft_large  M_q, 2+2 layers, width 256, 8.1M parameters
  draft_small  M_q, 2+2 layers, width 128, 3.3M parameters

`load(name)` reads one as a T5Model in float32 (bfloat16 matmuls are ~10x
slower than float32 on CPUs without native bf16).

  python -m spec_decode.demo            # the short Table 2 on this machine
  python -m spec_decode.demo --pair smollm2   # a real pretrained target (harness.smollm2_demo)

measures c, c_first and r(K), alpha at temperature 0 and 1 (and at 1 with
top_k 40 and with top_p 0.9, where the draft samples at the temperature alone
and only p truncates: exact, and cheaper per draft step; `--truncated_draft`
truncates q too), chooses gamma by eq. (5) with the measured r
and c_first along the target's outputs (each position's own beta:
`theory.best_gamma_along`), times the baseline and speculative decoding at
batch 1 on the first Multi30k test sentences, with c, c_first and r(K) timed
again between the inputs for the predictions (the machine's speed drifts),
and prints the walltime table; the full
report (Markdown, CSV, plots) goes to --out_dir. The draft scores the 4096
tokens most frequent in the training targets (`--head_size`; its output layer
is most of what a draft step reads: see scripts/studies/pruned_head.py).
"""

import argparse
import sys
import textwrap

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.harness import experiments
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode import models
from spec_decode.t5 import config as config_lib
from spec_decode.t5.config import T5Config

MODELS_DIR = data.DATA_DIR / 'models'
VOCABULARY = str(data.VOCAB_PATH)  # the bundled 8k SentencePiece model the three were trained with

DEMO_VOCAB_SIZE = data.VOCAB_SIZE
NAMES = tuple(data.MODEL_SIZES)


def config(name: str, dtype: str = 'float32') -> T5Config:
  """The T5Config of a bundled model (its shape: data.MODEL_SIZES[name])."""
  if name not in NAMES:
    raise ValueError(f'unknown demo model {name!r}; expected one of {NAMES}')
  return config_lib.of_size(data.MODEL_SIZES[name], vocab_size=DEMO_VOCAB_SIZE, dtype=dtype,
                           param_dtype=dtype)


def checkpoint_dir(name: str) -> str:
  """The checkpoint directory of a bundled model, wherever the package is installed.

  gin/runs/demo.gin binds the command line's checkpoints to it
  (`@target/demo.checkpoint_dir()`), so that the demo decodes from any directory.
  """
  config(name)  # checks the name
  return str(MODELS_DIR / name)


def vocabulary_file() -> str:
  """VOCABULARY, for gin files (`@demo.vocabulary_file()`)."""
  return VOCABULARY


def load(name: str, dtype: str = 'float32') -> models.T5Model:
  """One bundled model ('target', 'draft_large' or 'draft_small').

  Raises:
    ValueError: the bundled vocabulary is not the one the model records
      (`checkpoints.check_vocabulary`).
  """
  checkpoints.check_vocabulary(checkpoint_dir(name), VOCABULARY)
  return models.T5Model.load(checkpoint_dir(name), config(name, dtype))


def check_head_size(head_size: int) -> None:
  """Raises ValueError unless head_size is 0 (the full head) or in 2..DEMO_VOCAB_SIZE."""
  if not (head_size == 0 or 2 <= head_size <= DEMO_VOCAB_SIZE):
    raise ValueError(f'head_size must be 0 or in 2..{DEMO_VOCAB_SIZE}, got {head_size}')


def load_draft(name: str, task: str = 'demo_ende', head_size: int = 0):
  """A bundled draft model by name, or a zero-cost draft provider by kind.

  Args:
    name: 'draft_large', 'draft_small', or one of experiments.DRAFT_KINDS
      ('unigram', 'bigram', 'prompt_lookup', 'uniform').
    task: the local task whose training targets estimate table drafts and
      rank the tokens of a pruned head.
    head_size: 0, or (draft models only) N in 2..8192: the draft scores only
      the N tokens most frequent in the task's training targets
      (`models.PrunedHeadDraft`: q = 0 for the rest, still exact).

  Raises:
    ValueError: an unknown name, or a head_size for a provider or out of range.
  """
  check_head_size(head_size)
  if name not in NAMES:
    if head_size:
      raise ValueError(f'head_size applies to draft models, not to the {name!r} provider')
    return experiments.draft_provider(name, DEMO_VOCAB_SIZE, task)
  return loading.pruned_head(load(name), task, head_size) if head_size else load(name)


PAIRS = ('bundled', 'smollm2')


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  chooser = argparse.ArgumentParser(add_help=False)
  chooser.add_argument('--pair', choices=PAIRS, default='bundled')
  if chooser.parse_known_args(argv)[0].pair == 'smollm2':
    from spec_decode.harness import smollm2_demo  # pylint: disable=g-import-not-at-top
    return smollm2_demo.main(argv)
  parser = argparse.ArgumentParser(description='The short Table 2 on the bundled demo pair.')
  parser.add_argument('--pair', choices=PAIRS, default='bundled',
                      help='smollm2: SmolLM2-135M-Instruct and its trained draft '
                           '(spec_decode.harness.smollm2_demo; its own options)')
  parser.add_argument('--draft', default='draft_small', choices=['draft_small', 'draft_large'],
                      help='draft_small is the faster pair on CPUs (see the README)')
  parser.add_argument('--head_size', type=int, default=4096,
                      help='the draft scores only the N tokens most frequent in the training '
                           'targets (exact; 98%% of their tokens at 4096; 0: all 8192)')
  parser.add_argument('--truncated_draft', action='store_true',
                      help='with top-k/top-p, q truncates as p does (default: q samples at the '
                           'temperature alone; exact either way)')
  parser.add_argument('--n', type=int, default=24, help='Multi30k test sentences timed')
  parser.add_argument('--repeats', type=int, default=2, help='timed runs per input (median)')
  parser.add_argument('--out_dir', default='out/demo_walltime')
  args = parser.parse_args(argv)

  settings = experiments.WalltimeSettings(
      task='demo_ende', split='test_multi30k', n=args.n, temperatures=(0.0, 1.0),
      gamma_max=7, gammas=(), max_decode_len=64, repeats=args.repeats, num_steps=32,
      truncations=((40, 1.0), (0, 0.9)), untruncated_draft=not args.truncated_draft)
  try:
    check_head_size(args.head_size)
  except ValueError as error:
    parser.error(str(error))
  target, draft = load('target'), load_draft(args.draft, head_size=args.head_size)
  name = f'{args.draft}, {args.head_size} ids' if args.head_size else args.draft
  alpha_rows, walltime_rows, timing = experiments.walltime_experiment(
      target, draft, name, settings)
  bucket = loading.INPUT_BUCKET  # walltime.time_decoding's default
  notes = (f'Bundled demo pair, demo_ende/test_multi30k, first {args.n} sentences, batch 1 '
           f'(each input padded to the smallest of {bucket}, {2 * bucket}, {4 * bucket}, ... '
           f'tokens that holds it), median of {args.repeats} runs.\n\n`python -m spec_decode.demo '
           f'{" ".join(argv)}`')
  paths = report.write_report(args.out_dir, title='Walltime on the bundled demo pair',
                              alpha_rows=alpha_rows, walltime_rows=walltime_rows, timing=timing,
                              notes=notes)
  print(report.markdown_table(walltime_rows, CONSOLE_COLUMNS))
  print('\n' + textwrap.fill(bound_line(walltime_rows), width=100))
  print(f'full report (every prediction, the knobs, plots): {paths[0]}')
  return 0


# The console's short table; the report holds the full one (report.WALLTIME_COLUMNS).
CONSOLE_COLUMNS: tuple[report.Column, ...] = (
    ('sampling', report.knobs_label),
    ('gamma', lambda r: str(r['gamma'])),
    ('alpha', lambda r: f'{r["alpha"]:.3f}'),
    ('speedup', lambda r: f'{r["measured_speedup"]:.2f}X'),
    ('ms/token: baseline', lambda r: f'{r["baseline_token_ms"]:.3f}'),
    ('speculative', lambda r: f'{r["baseline_token_ms"] / r["measured_speedup"]:.3f}'),
    ('greedy identical', report.identical_cell),
)


def bound_line(rows: list[dict]) -> str:
  """One line on what bounds the speedup: each input's fixed cost against its loop's."""
  row = rows[0]
  loop = row['predicted_speedup']
  whole = row.get('predicted_decode_speedup')
  line = (f'Bound: the loops alone would give {loop:.2f}X at {report.knobs_label(row)} (c = '
          f'{row["c"]:.2f}, first draft step after a target call {row["c_first"]:.2f})')
  if whole is None:
    return line + '.'
  return (line + f', but each input\'s start (encoder, caches) costs '
          f'{row["speculative_fixed_ms"]:.1f} ms, as much as its tokens\' steps: '
          f'{whole:.2f}X predicted for whole decodes.')


if __name__ == '__main__':
  sys.exit(main())
