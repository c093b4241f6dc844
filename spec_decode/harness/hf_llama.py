"""Peers on a real Llama pair: transformers' greedy and assisted generation (PyTorch, CPU).

`peers(target_dir, draft_dir, max_new_tokens)` loads the target folder with
transformers and builds the same draft as a LlamaForCausalLM (its layers
from the draft folder, its embedding the target's; transformers' draft scores
the whole vocabulary, ours a pruned head), and returns the functions
`real_pair.run_pair` times: greedy `generate`, and assisted generation
(`assistant_model=`, a constant `gamma` draft tokens per call), each at 1 and
2 PyTorch threads (on shared cores either can be the faster). A draft over
the target's features (models.FeatureDraft) is no transformers model: its
peer is transformers' prompt lookup (`prompt_lookup_num_tokens=gamma`).

Needs the hf extra (torch, transformers).
"""

import json
import pathlib
import time
from typing import Any, Callable

import numpy as np

from spec_decode.llama import draft as draft_lib

THREADS = (1, 2)


def _draft_model(transformers, torch, target, draft_dir: pathlib.Path):
  """The draft folder as a LlamaForCausalLM over the target's embedding."""
  import safetensors.torch  # pylint: disable=g-import-not-at-top
  stored = json.loads((draft_dir / draft_lib.CONFIG_FILE).read_text())
  stored.pop('spec_decode_draft', None)
  stored['torch_dtype'] = stored['dtype'] = 'float32'
  config = transformers.LlamaConfig(**stored)
  model = transformers.LlamaForCausalLM(config)
  state = {k: v.float() for k, v in safetensors.torch.load_file(
      str(draft_dir / draft_lib.WEIGHTS_FILE)).items()}
  state['model.embed_tokens.weight'] = target.model.embed_tokens.weight.detach().clone()
  missing, unexpected = model.load_state_dict(state, strict=False)
  if unexpected or [m for m in missing if m != 'lm_head.weight']:
    raise ValueError(f'the draft folder does not fit transformers\' Llama: missing {missing}, '
                     f'unexpected {unexpected}')
  model.tie_weights()
  return model.eval()


def peers(target_dir: str, draft_dir: str, max_new_tokens: int,
          threads: tuple[int, ...] = THREADS) -> dict[str, Callable[[np.ndarray, int], Any]]:
  """name -> fn(prompt ids [n], gamma) -> (seconds, generated ids incl. EOS), greedy.

  Names: hf_greedy_{t}t and hf_assisted_{t}t (hf_prompt_lookup_{t}t for a
  draft over features) for each thread count t.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  target = transformers.LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
  lookup = draft_lib.reads_target_features(draft_dir)
  if not lookup:
    draft = _draft_model(transformers, torch, target, pathlib.Path(draft_dir))
    draft.generation_config.num_assistant_tokens_schedule = 'constant'
  common = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                eos_token_id=target.generation_config.eos_token_id,
                pad_token_id=target.generation_config.pad_token_id)

  def make(threads_: int, assisted: bool):
    def run(ids: np.ndarray, gamma: int):
      torch.set_num_threads(threads_)
      kwargs = dict(common)
      if assisted and lookup:
        kwargs['prompt_lookup_num_tokens'] = gamma
      elif assisted:
        draft.generation_config.num_assistant_tokens = gamma
        kwargs['assistant_model'] = draft
      x = torch.as_tensor(np.asarray(ids, np.int64)[None])
      with torch.inference_mode():
        if not run.warm:
          target.generate(x, attention_mask=torch.ones_like(x), **kwargs)
          run.warm = True
        start = time.perf_counter()
        out = target.generate(x, attention_mask=torch.ones_like(x), **kwargs)
        seconds = time.perf_counter() - start
      return seconds, out[0, x.shape[1]:].numpy()
    run.warm = False
    return run

  speculative = 'prompt_lookup' if lookup else 'assisted'
  return {f'hf_{kind}_{t}t': make(t, kind == speculative)
          for t in threads for kind in ('greedy', speculative)}
