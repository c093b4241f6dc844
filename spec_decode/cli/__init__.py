"""The spec-decode command line: a T5X-style gin-configured decode of a JSONL file.

  infer      the entry point (spec-decode, scripts/decode.py)
  settings   every setting checked before anything compiles
  jsonl      reading the input file, writing the output file complete or clearly not
  memory     the memory a run needs, checked against the device's before compiling
  gin_utils  --gin_file / --gin.NAME=VALUE flags and the gin search path
"""
