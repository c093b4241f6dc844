r"""Peer comparison: Hugging Face transformers (PyTorch CPU) on the same weights.

  python scripts/hf_peer.py --target_config demo_target \
      --target_checkpoint spec_decode/data/models/target --draft_config demo_draft_large \
      --draft_checkpoint spec_decode/data/models/draft_large --gamma 3 --n 50 \
      --out_dir out/hf_peer

Exports both models to HF format (`checkpoints.write_hf`), then decodes the
same inputs greedily at batch 1 four ways: HF `generate` (plain greedy), HF
assisted generation (`assistant_model=`, a constant `gamma` draft tokens per
call), our baseline and our speculative decoding (compile excluded). Reports
generated tokens per second of each, the ratios (ours / HF), and how many of
HF's greedy outputs equal ours token for token. HF assisted generation runs
encoder-decoder models at batch 1 only, hence batch 1 everywhere.
"""

import argparse
import json
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode import data
from spec_decode.harness import loading
from spec_decode.harness import report
from spec_decode.harness import walltime
from spec_decode import models
from spec_decode import sampling as sampling_lib


def _hf_model(model: models.T5Model, directory: pathlib.Path):
  import transformers  # pylint: disable=g-import-not-at-top
  checkpoints.write_hf(str(directory), jax.device_get(model.params), model.config)
  hf = transformers.T5ForConditionalGeneration.from_pretrained(str(directory))
  return hf.eval()


def _hf_decode(hf, inputs: list[np.ndarray], max_decode_len: int, assistant=None,
               gamma: int = 0) -> tuple[float, list[list[int]]]:
  """Seconds and output ids (decoder start token dropped) of HF greedy decoding."""
  import torch  # pylint: disable=g-import-not-at-top
  kwargs = dict(max_new_tokens=max_decode_len, do_sample=False, num_beams=1)
  if assistant is not None:
    assistant.generation_config.num_assistant_tokens = gamma
    assistant.generation_config.num_assistant_tokens_schedule = 'constant'
    kwargs['assistant_model'] = assistant
  outputs, seconds = [], 0.0
  with torch.inference_mode():
    hf.generate(torch.as_tensor(inputs[0][None]), **kwargs)  # warm-up
    for ids in inputs:
      start = time.perf_counter()
      out = hf.generate(torch.as_tensor(ids[None]), **kwargs)
      seconds += time.perf_counter() - start
      outputs.append(out[0, 1:].tolist())
  return seconds, outputs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--target_config', required=True)
  parser.add_argument('--target_checkpoint', required=True)
  parser.add_argument('--draft_config', required=True)
  parser.add_argument('--draft_checkpoint', required=True)
  parser.add_argument('--task', default='demo_ende', choices=data.LOCAL_TASKS)
  parser.add_argument('--split', default='test_multi30k')
  parser.add_argument('--n', type=int, default=50)
  parser.add_argument('--gamma', type=int, default=3)
  parser.add_argument('--max_input_len', type=int, default=256)
  parser.add_argument('--max_decode_len', type=int, default=64)
  parser.add_argument('--out_dir', required=True)
  args = parser.parse_args()

  target = loading.load_model(args.target_config, args.target_checkpoint)
  draft = loading.load_model(args.draft_config, args.draft_checkpoint)
  examples = data.load_examples(args.task, args.split, args.n)
  padded = loading.encode_texts([e['inputs'] for e in examples], args.max_input_len)
  unpadded = [row[:np.count_nonzero(row)] for row in padded]

  greedy = sampling_lib.SamplingParams.create()
  ours = walltime.time_decoding({
      'baseline': walltime.baseline_decoder(target, max_decode_len=args.max_decode_len,
                                            sampling=greedy),
      'speculative': walltime.speculative_decoder(target, draft, gamma=args.gamma,
                                                  max_decode_len=args.max_decode_len,
                                                  sampling=greedy),
  }, padded, jax.random.key(0), repeats=1, progress=True)

  with tempfile.TemporaryDirectory() as tmp:
    hf_target = _hf_model(target, pathlib.Path(tmp) / 'target')
    hf_draft = _hf_model(draft, pathlib.Path(tmp) / 'draft')
    hf_greedy_s, hf_greedy = _hf_decode(hf_target, unpadded, args.max_decode_len)
    hf_assisted_s, hf_assisted = _hf_decode(hf_target, unpadded, args.max_decode_len,
                                            assistant=hf_draft, gamma=args.gamma)

  def rate(outputs, seconds):
    return sum(map(len, outputs)) / seconds

  row = dict(
      task=args.task, n=len(examples), gamma=args.gamma,
      hf_greedy_tok_s=rate(hf_greedy, hf_greedy_s),
      hf_assisted_tok_s=rate(hf_assisted, hf_assisted_s),
      ours_baseline_tok_s=rate(ours['baseline'].tokens, ours['baseline'].total_s),
      ours_speculative_tok_s=rate(ours['speculative'].tokens, ours['speculative'].total_s),
      hf_greedy_equal_ours=float(np.mean([h == o for h, o in zip(hf_greedy,
                                                                 ours['baseline'].tokens)])),
      hf_assisted_equal_ours=float(np.mean([h == o for h, o in zip(hf_assisted,
                                                                   ours['baseline'].tokens)])))
  row['baseline_ratio'] = row['ours_baseline_tok_s'] / row['hf_greedy_tok_s']
  row['speculative_ratio'] = row['ours_speculative_tok_s'] / row['hf_assisted_tok_s']
  out = pathlib.Path(args.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  columns = [(k, lambda r, k=k: f'{r[k]:.3g}' if isinstance(r[k], float) else str(r[k]))
             for k in row]
  table = report.markdown_table([row], columns)
  (out / 'hf_peer.md').write_text(f'# Peer: HF transformers on the same weights\n\n`{" ".join(sys.argv)}`'
                                  f'\n\n{table}\n', encoding='utf-8')
  (out / 'hf_peer.json').write_text(json.dumps(row, indent=1), encoding='utf-8')
  print(table)


if __name__ == '__main__':
  main()
