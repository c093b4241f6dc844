r"""Decodes text with a T5 model, sped up by a draft: see spec_decode/cli/infer.py.

  python scripts/decode.py --gin_file=runs/t5_1_1_xxl_small.gin \
      --gin.INPUT_FILE="'inputs.txt'" --gin.GAMMA=5 > outputs.jsonl
"""

import sys

from spec_decode.cli import infer

if __name__ == '__main__':
  sys.exit(infer.main())
