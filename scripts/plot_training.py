"""Plots training and eval loss of runs: python scripts/plot_training.py OUT.png NAME=WORKDIR ..."""

import argparse
import json
import pathlib

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('output', help='PNG file to write')
  parser.add_argument('runs', nargs='+', help='NAME=WORKDIR, each holding log.jsonl')
  args = parser.parse_args()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for spec in args.runs:
    name, _, workdir = spec.partition('=')
    records = [json.loads(line) for line in open(pathlib.Path(workdir) / 'log.jsonl')]
    # A resumed run logs its steps again after the restored one: keep the last.
    train = sorted({r['step']: r['train_loss'] for r in records if 'train_loss' in r}.items())
    evals = sorted({r['step']: r['eval_loss'] for r in records if 'eval_loss' in r}.items())
    line, = ax.plot(*zip(*train), alpha=0.5, lw=1, label=f'{name} train')
    ax.plot(*zip(*evals), 'o-', color=line.get_color(), label=f'{name} validation')
  ax.set(xlabel='step', ylabel='cross entropy per target token (nats)', ylim=(0, None),
         title='Demo pair training (demo_mix, 2 CPU cores)')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(args.output, dpi=120)
  print(f'wrote {args.output}')


if __name__ == '__main__':
  main()
