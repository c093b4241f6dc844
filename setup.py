"""spec_decode: speculative decoding (Leviathan et al. 2023) for T5X-style T5 1.1 models."""

import setuptools

setuptools.setup(
    name='spec_decode',
    version='0.1.0',
    description='Speculative decoding for T5 1.1 encoder-decoder models in JAX/Flax',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['spec_decode', 'spec_decode.*']),
    include_package_data=True,
    package_data={'spec_decode': ['data/**/*']},
    install_requires=[
        'jax~=0.10.2',
        'jaxlib~=0.10.2',
        'flax~=0.12.8',
        'optax~=0.2.8',
        'orbax-checkpoint~=0.12.8',
        'etils[epath]',
        'tensorstore>=0.1.70',
        'msgpack>=1.0',
        'safetensors>=0.4',
        'gin-config>=0.5',
        'seqio==0.0.20',
        'tensorflow~=2.21.0',
        'tensorflow-datasets~=4.9.10',
        'sentencepiece>=0.2',
        'numpy>=1.26',
        'scipy>=1.11',
        'tqdm>=4.66',
        'matplotlib>=3.8',
        'sacrebleu>=2.4',
        'rouge-score>=0.1.2',
    ],
    extras_require={
        'test': ['pytest>=8', 'pytest-xdist>=3.8', 'nbclient>=0.10', 'nbformat>=5.10',
                 'ipykernel>=6.29'],
        # The Hugging Face peer: parity tests, HF export and assisted generation.
        # torch is pinned to the CPU wheel these machines keep on local disk.
        'hf': ['torch==2.13.0', 'transformers>=5.0'],
    },
    entry_points={'console_scripts': ['spec-decode=spec_decode.infer:main']},
)
