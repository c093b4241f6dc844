"""Trains a T5 1.1 model: python scripts/train.py --gin_file=runs/train.gin ..."""

import sys

from spec_decode.training import tasks  # registers the seqio tasks
from spec_decode.training import train

del tasks

if __name__ == '__main__':
  sys.exit(train.main())
