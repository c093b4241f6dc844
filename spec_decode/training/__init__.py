"""Training the models: pretraining on the bundled data, sequence-level and white-box distillation.

  train     the training loop (seqio-style tasks, Adafactor, orbax checkpoints)
  batches   length buckets: fixed batch shapes, their steps compiled up front
  checks    every setting checked when a config is built; the run's vocabulary record
  distill   sequence-level distillation: the target's outputs as the draft's data
  whitebox  distribution-level distillation: the draft trained on p itself, on-policy
  tasks     the seqio tasks and mixtures (needs the [data] extra)
  metrics   BLEU and ROUGE as T5 scores them (needs the [harness] extra)
"""
