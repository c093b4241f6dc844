"""Plots training and eval loss of runs: python scripts/plot_training.py OUT.png NAME=WORKDIR ...

A run continued in a new workdir (e.g. with another optimizer, from an
exported checkpoint of step S) is NAME=WORKDIR,WORKDIR2@S: the first stage
is cut at step S and the second's steps are drawn from S on, with a dotted
line at S.

White-box distillation logs (spec_decode.training.whitebox) plot with
--train_key beta --eval_key eval_alpha --ylabel alpha: the running beta of the
training batches and alpha measured on validation inputs.
"""

import argparse
import json
import pathlib

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top


def read_stages(stages: str, train_key: str = 'train_loss',
                eval_key: str = 'eval_loss') -> tuple[dict[int, float], dict[int, float], list[int]]:
  """Train and eval values by step of 'WORKDIR,WORKDIR2@S,...', and the starts S."""
  train, evals, starts = {}, {}, []
  for stage in stages.split(','):
    workdir, _, start = stage.partition('@')
    start = int(start or 0)
    if start:
      starts.append(start)
    # A later stage replaces what earlier ones logged past its start.
    for log in (train, evals):
      for step in [s for s in log if s > start]:
        del log[step]
    for line in open(pathlib.Path(workdir) / 'log.jsonl'):
      # A resumed run logs its steps again after the restored one: keep the last.
      record = json.loads(line)
      for key, log in ((train_key, train), (eval_key, evals)):
        if key in record:
          log[start + record['step']] = record[key]
  return train, evals, starts


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('output', help='PNG file to write')
  parser.add_argument('runs', nargs='+', help='NAME=WORKDIR[,WORKDIR2@S...], each holding log.jsonl')
  parser.add_argument('--title', default='Demo pair training (demo_mix, 2 CPU cores)')
  parser.add_argument('--train_key', default='train_loss', help='log.jsonl key of the line')
  parser.add_argument('--eval_key', default='eval_loss', help='log.jsonl key of the dots')
  parser.add_argument('--ylabel', default='cross entropy per target token (nats)')
  args = parser.parse_args()
  fig, ax = plt.subplots(figsize=(8, 5))
  for spec in args.runs:
    name, _, stages = spec.partition('=')
    train, evals, starts = read_stages(stages, args.train_key, args.eval_key)
    line, = ax.plot(*zip(*sorted(train.items())), alpha=0.5, lw=1, label=f'{name} train')
    ax.plot(*zip(*sorted(evals.items())), 'o-', color=line.get_color(), label=f'{name} validation')
    for start in starts:
      ax.axvline(start, color=line.get_color(), ls=':', lw=1)
  ax.set(xlabel='step', ylabel=args.ylabel, ylim=(0, None),
         title=args.title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize='small', ncol=2)
  fig.tight_layout()
  fig.savefig(args.output, dpi=120)
  print(f'wrote {args.output}')


if __name__ == '__main__':
  main()
