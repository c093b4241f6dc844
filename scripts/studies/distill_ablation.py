r"""Trains a draft with each distillation recipe on one budget and measures its alpha.

  python scripts/studies/distill_ablation.py --draft draft_small --steps 200 \
      --distill_dir out/distill --out_dir out/distill_ablation_small

Each row trains the same starting draft for the same number of steps and
tokens per batch, then measures alpha as `scripts/measure_alpha.py` does (the
target's own outputs for the first N test inputs, one teacher-forced pass per
model) at T = 0 and T = 1 on Multi30k test (200) and on Debian summarization
test (100):

  bundled          the starting draft itself (no training)
  sequence KD      hard labels: cross entropy on the target's greedy outputs
                   (--distill_dir, written by scripts/distill.py with
                   `gin/runs/distill.gin`; left out without it)
  tvd/fkl/rkl/jsd  white-box (`spec_decode.training.whitebox`): the divergence at T = 1
                   on half references, half on-policy draft samples
  tvd, no on-policy  the references alone

A row's result is kept in OUT_DIR/rows/ as soon as it is measured and reused
when the command is repeated, so an interrupted ablation resumes at its next
row.
"""

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys
from typing import Any

import jax
import numpy as np

from spec_decode.models import alpha as alpha_lib
from spec_decode import data
from spec_decode import demo
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import report_plots
from spec_decode import models
from spec_decode import sampling as sampling_lib
from spec_decode.training import whitebox

SCRIPTS = pathlib.Path(__file__).resolve().parents[1]
# (task, split, first n inputs): where alpha is measured.
EVALUATIONS = (('demo_ende', 'test_multi30k', 200), ('demo_debsum', 'test', 100))
TEMPERATURES = (0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Settings:
  """One ablation.

  Attributes:
    draft: 'draft_small' or 'draft_large' (bundled config and checkpoint).
    steps: optimizer steps of every trained row.
    batch_tokens: tokens per batch (padding included) of every trained row.
    learning_rate: Adafactor's (relative) peak rate of the white-box rows.
    kd_learning_rate: the sequence-KD row's, as its recipe (runs/distill.gin).
    distill_dir: scripts/distill.py records (greedy outputs of the target) for
      the sequence-KD row; None leaves the row out.
    work_dir: where the runs train (checkpoints, logs, exports).
    out_dir: the report (report.md, alpha.csv, results.json, alpha.png).
  """

  draft: str = 'draft_small'
  steps: int = 200
  batch_tokens: int = 4096
  learning_rate: float = 3e-3
  kd_learning_rate: float = 1e-2
  distill_dir: str | None = None
  work_dir: str = 'out/distill_ablation'
  out_dir: str = 'out/distill_ablation/report'


def rows(s: Settings) -> dict[str, dict[str, Any]]:
  """name -> how the row is trained ({} for the bundled draft)."""
  out = {'bundled': {}}
  if s.distill_dir:
    out['sequence KD'] = {'kind': 'sequence_kd'}
  for name in whitebox.DIVERGENCES:
    out[name] = {'kind': 'whitebox', 'divergence': name, 'on_policy_weight': 0.5}
  out['tvd, no on-policy'] = {'kind': 'whitebox', 'divergence': 'tvd', 'on_policy_weight': 0.0}
  return out


def _config(draft: str) -> str:
  return 'demo_' + draft


def _slug(row: str) -> str:
  """A row's name as a file or folder name."""
  return row.replace(' ', '_').replace(',', '')


def _checkpoint(name: str) -> pathlib.Path:
  return demo.MODELS_DIR / name


def train_row(s: Settings, name: str, how: dict[str, Any]) -> pathlib.Path:
  """Trains one row (resuming its work dir) and returns its exported checkpoint."""
  work = pathlib.Path(s.work_dir) / _slug(name)
  export = work / 't5x'
  if (export / 'checkpoint').exists():
    return export
  if how['kind'] == 'whitebox':
    cfg = whitebox.WhiteboxConfig(
        divergence=how['divergence'], on_policy_weight=how['on_policy_weight'],
        reference_weight=0.5, num_steps=s.steps, batch_tokens=s.batch_tokens,
        learning_rate=s.learning_rate, eval_examples=0, init_checkpoint=str(_checkpoint(s.draft)))
    whitebox.train(loading.parse_config(_config('target')), str(_checkpoint('target')),
                   loading.parse_config(_config(s.draft)), cfg, str(work), export_dir=str(export))
    return export
  gin = ['--gin_file=runs/distill.gin', f'--gin_file=models/demo/{s.draft}.gin',
         f'--gin.MODEL_CONFIG=@{_config(s.draft)}/t5.T5Config()', f"--gin.WORKDIR='{work}'",
         f"--gin.DISTILL_DIR='{s.distill_dir}'", f'--gin.NUM_STEPS={s.steps}',
         f'--gin.BATCH_TOKENS={s.batch_tokens}', f'--gin.LEARNING_RATE={s.kd_learning_rate}',
         f"--gin.INIT_CHECKPOINT='{_checkpoint(s.draft)}'"]
  for script, extra in (('train.py', []), ('export_t5x.py', [f"--gin.OUTPUT_DIR='{export}'"])):
    subprocess.run([sys.executable, str(SCRIPTS / script), *gin, *extra], check=True)
  return export


def evaluation_sets(target: models.T5Model
                    ) -> dict[tuple[str, float], tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """(task, T) -> the target's outputs for the first test inputs (measure_alpha.py's)."""
  sets = {}
  for task, split, n in EVALUATIONS:
    inputs = loading.encode_texts([e['inputs'] for e in data.load_examples(task, split, n)], 256)
    for t in TEMPERATURES:
      tokens, lengths = alpha_lib.generate_sequences(
          target, inputs, sampling=sampling_lib.SamplingParams.create(t), max_decode_len=128,
          rng=jax.random.key(0), progress=True)
      sets[task, t] = (inputs, tokens, lengths)
  return sets


def measure_row(target: models.T5Model, checkpoint: pathlib.Path, draft: str,
                sets: dict) -> dict[str, float]:
  """alpha and its standard error of one checkpoint on every evaluation set."""
  model = loading.load_model(_config(draft), str(checkpoint))
  out = {}
  for (task, t), (inputs, tokens, lengths) in sets.items():
    stats = alpha_lib.measure_alpha(target, model, inputs, tokens, lengths,
                                     sampling=sampling_lib.SamplingParams.create(t))
    out[f'{task} T={t:g}'] = stats.alpha
    out[f'{task} T={t:g} s.e.'] = stats.stderr
  return out


def run(s: Settings, command: str) -> list[pathlib.Path]:
  """Trains and measures every row not measured yet; writes the report."""
  out = pathlib.Path(s.out_dir)
  (out / 'rows').mkdir(parents=True, exist_ok=True)
  target = sets = None
  results = []
  for name, how in rows(s).items():
    path = out / 'rows' / f'{_slug(name)}.json'
    if not path.exists():
      checkpoint = train_row(s, name, how) if how else _checkpoint(s.draft)
      target = target or loading.load_model(_config('target'), str(_checkpoint('target')))
      sets = sets or evaluation_sets(target)
      path.write_text(json.dumps({'row': name, **measure_row(target, checkpoint, s.draft, sets)}))
    results.append(json.loads(path.read_text()))
  return write_report(out, results, s, command)


def write_report(out: pathlib.Path, results: list[dict], s: Settings,
                 command: str) -> list[pathlib.Path]:
  """report.md, alpha.csv, results.json and alpha.png."""
  keys = [f'{task} T={t:g}' for task, _, _ in EVALUATIONS for t in TEMPERATURES]
  columns = [('recipe', lambda r: r['row'])] + [
      (f'alpha {k}', lambda r, k=k: f'{r[k]:.3f} ± {r[k + " s.e."]:.3f}') for k in keys]
  evaluations = ', '.join(f'{task}/{split} first {n}' for task, split, n in EVALUATIONS)
  text = (f'# Distillation ablation: {s.draft}\n\n`{command}`\n\nEvery trained row starts from '
          f'the bundled {s.draft} and takes {s.steps} steps of {s.batch_tokens}-token batches '
          f'(Adafactor; white-box rows at {s.learning_rate:g}, half references and half on-policy '
          f'draft samples at T = 1 unless said, divergence at T = 1; sequence KD at '
          f'{s.kd_learning_rate:g} on the target\'s greedy outputs, `gin/runs/distill.gin`). '
          f'alpha as `scripts/measure_alpha.py` measures it ({evaluations}; max_decode_len 128), '
          f'± one standard error over sequences.\n\n'
          + report.markdown_table(results, columns) + '\n\n![alpha](alpha.png)\n')
  paths = [out / 'report.md', out / 'alpha.csv', out / 'results.json', out / 'alpha.png']
  paths[0].write_text(text)
  report.write_csv(paths[1], results)
  paths[2].write_text(json.dumps({'settings': dataclasses.asdict(s), 'rows': results}, indent=1))
  fig = report_plots.figure((8, 4))
  ax = fig.add_subplot()
  width = 0.8 / len(results)
  for i, r in enumerate(results):
    ax.bar(np.arange(len(keys)) + i * width, [r[k] for k in keys], width,
           yerr=[r[k + ' s.e.'] for k in keys], label=r['row'])
  ax.set(xticks=np.arange(len(keys)) + 0.4 - width / 2, xticklabels=keys, ylabel='alpha',
         title=f'{s.draft}: alpha after {s.steps} steps per recipe')
  ax.set_ylim(bottom=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(paths[3], dpi=120)
  return paths


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--draft', default='draft_small', choices=['draft_small', 'draft_large'])
  parser.add_argument('--steps', type=int, default=200, help='optimizer steps per trained row')
  parser.add_argument('--batch_tokens', type=int, default=4096)
  parser.add_argument('--learning_rate', type=float, default=3e-3, help='white-box rows')
  parser.add_argument('--kd_learning_rate', type=float, default=1e-2, help='sequence-KD row')
  parser.add_argument('--distill_dir', default=None,
                      help='scripts/distill.py records for the sequence-KD row')
  parser.add_argument('--work_dir', default='out/distill_ablation')
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()
  settings = Settings(
      draft=args.draft, steps=args.steps, batch_tokens=args.batch_tokens,
      learning_rate=args.learning_rate, kd_learning_rate=args.kd_learning_rate,
      distill_dir=args.distill_dir, work_dir=args.work_dir, out_dir=args.out_dir)
  paths = run(settings, 'python ' + ' '.join(sys.argv))
  print('\n'.join(map(str, paths)))


if __name__ == '__main__':
  main()
