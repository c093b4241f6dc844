"""Trains a draft on the target's distributions (DistillSpec): see gin/runs/whitebox.gin."""

import sys

from spec_decode.training import whitebox

if __name__ == '__main__':
  sys.exit(whitebox.main())
