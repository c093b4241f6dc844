"""Exports a training run as a T5X checkpoint: see gin/runs/train.gin."""

import sys

from spec_decode.training import train

if __name__ == '__main__':
  sys.exit(train.export_main())
