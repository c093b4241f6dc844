"""spec_decode: speculative decoding (Leviathan et al. 2023) for T5 1.1 models in JAX/Flax."""
