"""A Llama draft that shares its target's token embedding: stored without it, in bfloat16.

The draft trained for SmolLM2-135M-Instruct (`spec_decode.training.llama_draft`)
is a Llama of the target's width with a few layers of its own. It reads the
target's token embedding and scores with its tied output layer, pruned to
the ids the target writes most (models.PrunedHeadDraft: q = 0 elsewhere,
speculative sampling stays exact). Its folder holds only what is its own:

  config.json        the draft's Hugging Face LlamaConfig (the target's but
                     num_hidden_layers), with `spec_decode_draft` naming the
                     target's sizes and the head ids' file, and `reads`:
                     'features' for a draft over the target's features
  model.safetensors  the layers and the final norm, HF names, bfloat16 (and
                     `fc.weight` [E, 2E] and `feature_scale` [E] of a draft over features)
  head_ids.json      the N token ids the output layer scores, ascending

  draft = load(folder, target)   # a PrunedHeadDraft over the target's embedding,
                                 # or a models.FeatureDraft
"""

import json
import os
import pathlib
from typing import Any

import jax
import numpy as np
import safetensors.numpy

from spec_decode.checkpoints.param_trees import flatten, unflatten
from spec_decode.llama import hf
from spec_decode.llama.config import LlamaConfig
from spec_decode.models.feature_draft import FeatureDraft
from spec_decode.models.llama import LlamaModel
from spec_decode.models.pruned_head import PrunedHeadDraft

CONFIG_FILE, WEIGHTS_FILE, IDS_FILE = 'config.json', 'model.safetensors', 'head_ids.json'
EMBEDDING = 'embed_tokens/embedding'
# A feature draft's input layer [2E, E] (HF name fc.weight, EAGLE's) and its feature scale [E].
FC, FEATURE_SCALE = 'fc/kernel', 'feature_scale'
FEATURE_NAMES = {FC: 'fc.weight', FEATURE_SCALE: 'feature_scale'}


def draft_config(target: LlamaConfig, num_layers: int) -> LlamaConfig:
  """The config of a draft of `num_layers` layers over `target`'s embedding (float32)."""
  return LlamaConfig(**{**target.__dict__, 'num_hidden_layers': num_layers, 'dtype': 'float32'})


def save(folder: str | os.PathLike, config: LlamaConfig, own: dict[str, Any],
         head_ids: np.ndarray, hf_config: dict[str, Any]) -> None:
  """Writes a draft's own parameters (all but the embedding) in bfloat16, with its head ids.

  Args:
    folder: created if absent; its three files are replaced.
    config: the draft's config (tie_word_embeddings).
    own: the draft's parameter tree without `embed_tokens`.
    head_ids: [N] the ids the output layer scores.
    hf_config: the target's parsed config.json, the base of the draft's.
  """
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  names = {**hf.hf_names(config), **FEATURE_NAMES}
  tensors = {}
  for name, x in flatten(jax.device_get(own)).items():
    x = np.asarray(x, np.float32)
    tensors[names[name]] = np.ascontiguousarray(x.T if name.endswith('/kernel') else x)
  import ml_dtypes  # pylint: disable=g-import-not-at-top; jax's own dependency
  safetensors.numpy.save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()},
                              str(folder / WEIGHTS_FILE))
  stored = {**hf_config, 'num_hidden_layers': config.num_hidden_layers, 'torch_dtype': 'bfloat16',
            'spec_decode_draft': {'embedding': 'the target\'s model.embed_tokens.weight',
                                  'head_ids': IDS_FILE,
                                  'reads': 'features' if 'fc' in own else 'tokens'}}
  stored.pop('quantization_config', None)
  (folder / CONFIG_FILE).write_text(json.dumps(stored, indent=2) + '\n')
  (folder / IDS_FILE).write_text(json.dumps([int(i) for i in np.sort(head_ids)]) + '\n')


def reads_target_features(folder: str | os.PathLike) -> bool:
  """Whether the draft folder holds a draft over its target's features (else over tokens)."""
  stored = json.loads((pathlib.Path(folder) / CONFIG_FILE).read_text())
  return stored.get('spec_decode_draft', {}).get('reads') == 'features'


def load(folder: str | os.PathLike, target: LlamaModel) -> PrunedHeadDraft | FeatureDraft:
  """The draft in `folder` over `target`'s embedding (float32): a PrunedHeadDraft or a FeatureDraft.

  Raises:
    FileNotFoundError: a file of the folder is missing.
    ValueError: a config whose sizes differ from the target's (but its
      layers), or arrays missing, unexpected or of the wrong shape (named).
  """
  folder = pathlib.Path(folder)
  for name in (CONFIG_FILE, WEIGHTS_FILE, IDS_FILE):
    if not (folder / name).is_file():
      raise FileNotFoundError(f'{folder} is not a draft folder: no {name}')
  config = LlamaConfig.from_hf(str(folder))
  wanted = draft_config(target.config, config.num_hidden_layers)
  if config != wanted:
    differ = sorted(k for k in config.__dict__ if getattr(config, k) != getattr(wanted, k))
    raise ValueError(f'{folder} is a draft for another target: {", ".join(differ)} differ '
                     "from the target's")
  reads_features = reads_target_features(folder)
  expected = {k: v for k, v in hf.expected_shapes(config).items() if k != EMBEDDING}
  names = hf.hf_names(config)
  if reads_features:
    expected[FC] = (2 * config.hidden_size, config.hidden_size)
    expected[FEATURE_SCALE] = (config.hidden_size,)
    names = {**names, **FEATURE_NAMES}
  tensors = safetensors.numpy.load_file(str(folder / WEIGHTS_FILE))
  theirs = {names[k]: k for k in expected}
  problems = [f'missing array {n}' for n in sorted(set(theirs) - set(tensors))]
  problems += [f'unexpected array {n}' for n in sorted(set(tensors) - set(theirs))]
  flat = {}
  for hf_name, name in theirs.items():
    if hf_name not in tensors:
      continue
    x = np.asarray(tensors[hf_name], np.float32)
    x = x.T if name.endswith('/kernel') else x
    if x.shape != expected[name]:
      problems.append(f'{hf_name} has shape {x.shape[::-1] if name.endswith("/kernel") else x.shape}')
    flat[name] = np.ascontiguousarray(x)
  if problems:
    raise ValueError(f'{folder / WEIGHTS_FILE} does not fit its config:\n  ' + '\n  '.join(problems))
  ids = json.loads((folder / IDS_FILE).read_text())
  if reads_features:
    return FeatureDraft.create(config, unflatten(jax.device_put(flat)), target, np.asarray(ids))
  params = {**unflatten(jax.device_put(flat)), 'embed_tokens': target.params['embed_tokens']}
  model = LlamaModel(config, params, target.tokenizer)
  return PrunedHeadDraft.create(model, np.asarray(ids))
