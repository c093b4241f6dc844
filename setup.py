"""spec_decode: speculative decoding (Leviathan et al. 2023) for T5X-style models and Llama."""

import setuptools

# The core: decoding, the T5 network, checkpoints (T5X, orbax, Hugging Face), the command line,
# training. It imports no seqio, TensorFlow, PyTorch or matplotlib, so that it runs on the
# accelerator images as they are. jax is not pinned: install jax[tpu] or jax[cuda13] first on
# those machines, and pip keeps it.
CORE = [
    'jax>=0.10.2',
    'flax>=0.12.8',
    'optax>=0.2.8',
    'orbax-checkpoint>=0.12.8',
    'etils[epath]',
    'tensorstore>=0.1.70',
    'msgpack>=1.0',
    'safetensors>=0.4',
    'sentencepiece>=0.2',
    'numpy>=1.26',
    'gin-config>=0.5',
    'tqdm>=4.66',
]
EXTRAS = {
    # seqio tasks: T5's tfds datasets and the bundled tasks as seqio mixtures (training).
    'data': ['seqio==0.0.20', 'tensorflow~=2.21.0', 'tensorflow-datasets~=4.9.10'],
    # The measurement harness's plots and quality metrics (BLEU, ROUGE).
    'harness': ['matplotlib>=3.8', 'scipy>=1.11', 'sacrebleu>=2.4', 'rouge-score>=0.1.2'],
    # The Hugging Face peer: parity tests, HF export and assisted generation.
    # torch is pinned to the CPU wheel these machines keep on local disk.
    'hf': ['torch==2.13.0', 'transformers>=5.0'],
}
# A real pretrained target: spec_decode.llama.convert reads SmolLM2-135M-Instruct's GGUF file
# with transformers.
EXTRAS['smollm2'] = ['gguf>=0.10', 'accelerate>=1.0'] + EXTRAS['hf']
# Everything the README's test command needs: no test is skipped for a missing library.
EXTRAS['test'] = (['pytest>=8', 'pytest-xdist>=3.8', 'nbclient>=0.10', 'nbformat>=5.10',
                   'ipykernel>=6.29'] + EXTRAS['data'] + EXTRAS['harness'] + EXTRAS['smollm2'])
EXTRAS['all'] = sorted({r for reqs in EXTRAS.values() for r in reqs})

setuptools.setup(
    name='spec_decode',
    version='0.1.0',
    description='Speculative decoding for T5X-style, T5X decoder-only and Llama models in JAX/Flax',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.11',
    # gin/ and configs/ sit at the top of the repository (T5X's layout) and ship inside the
    # package as spec_decode/gin and spec_decode/configs, where a wheel install finds them
    # (`spec_decode.data.repository_dir`).
    packages=(setuptools.find_packages(include=['spec_decode', 'spec_decode.*'])
              + ['spec_decode.gin', 'spec_decode.configs']),
    package_dir={'spec_decode.gin': 'gin', 'spec_decode.configs': 'configs'},
    include_package_data=True,
    # The T5X checkpoints' zarr metadata are dotfiles (.zarray), which '*' leaves out.
    package_data={'spec_decode': ['data/**/*', 'data/**/.*', 'kernels/*.cc', 'kernels/*.h'],
                  'spec_decode.gin': ['**/*.gin'], 'spec_decode.configs': ['*.json', '*.md']},
    install_requires=CORE,
    extras_require=EXTRAS,
    entry_points={'console_scripts': ['spec-decode=spec_decode.cli.infer:main']},
)
