#!/usr/bin/env bash
# Loop costs at the paper's shapes on one GPU or TPU chip, as one command.
#
#   bash scripts/accelerator_check.sh            # T5-XXL + T5-small, bfloat16, batch 1 and 8,
#                                                # and the bundled demo pair's shapes
#   bash scripts/accelerator_check.sh --small    # tiny shapes: batch 2 and the demo pair (CPU, CI)
#
# Needs only jax, flax, optax, numpy, orbax, tensorstore, sentencepiece and msgpack (no seqio,
# tensorflow, gin, tqdm or matplotlib; plots are drawn where matplotlib exists) and no install:
# the repository is put on PYTHONPATH. Weights are random (scripts/shape_walltime.py): alpha is
# an input, every cost is measured. Writes docs/results/accelerator_<device>/ (--small:
# out/accelerator_check_small_<device>/), one folder per run and a README.md indexing them.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}  # e.g. PYTHON=python3.11

small=0
if [[ "${1:-}" == "--small" ]]; then small=1; shift; fi
if [[ $# -gt 0 ]]; then echo "usage: $0 [--small]" >&2; exit 2; fi

device=$("$python" -c "import jax, re; print(re.sub(r'[^a-z0-9]+', '_', jax.devices()[0].device_kind.lower()).strip('_'))")
if [[ $small == 1 ]]; then
  out="out/accelerator_check_small_${device}"
  pair=nano_nano
  command="bash scripts/accelerator_check.sh --small"
  xxl=(--target nano --draft nano --vocab_size 256 --dtype float32 --input_len 8
       --max_decode_len 4 --gammas 1 --block_gammas 1 --repeats 1 --num_steps 2)
  batches=(2)  # one batch size: batch 1 runs the same code
  demo=(--target demo_target --draft demo_draft_small --vocab_size 8192 --dtype float32
        --input_len 8 --max_decode_len 2 --gammas 1 --repeats 1 --num_steps 2)
else
  out="docs/results/accelerator_${device}"
  pair=xxl_small
  command="bash scripts/accelerator_check.sh"
  xxl=(--target xxl --draft small --dtype bfloat16 --input_len 64 --max_decode_len 32
       --gammas 1 2 3 5 7 --block_gammas 3 5 7 --repeats 3 --num_steps 16)
  batches=(1 8)
  demo=(--target demo_target --draft demo_draft_small --vocab_size 8192 --dtype bfloat16
        --input_len 32 --max_decode_len 32 --repeats 3 --num_steps 16)
fi
mkdir -p "$out"
index="$out/README.md"
{
  echo "# Loop costs on $("$python" -c 'import jax; print(jax.devices()[0].device_kind)')"
  echo
  echo "\`$command\` on $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), jax $("$python" -c 'import jax; print(jax.__version__)')."
  echo "Random weights: **alpha is an input** in every speedup table; every cost is measured."
  echo
  echo "| run | folder | wall seconds |"
  echo "| --- | --- | --- |"
} > "$index"

run() {  # name, then shape_walltime.py arguments; writes $out/$name.row
  local name=$1; shift
  local start=$SECONDS
  "$python" scripts/shape_walltime.py "$@" --out_dir "$out/$name"
  echo "| $name | [$name/]($name/report.md) | $((SECONDS - start)) |" > "$out/$name.row"
}
names=()
for batch in "${batches[@]}"; do names+=("${pair}_batch${batch}"); done
names+=(demo_pair)
if [[ $small == 1 ]]; then
  # Compile-bound tiny runs: side by side (logs in $out/<run>.log), so that CI takes under a minute.
  pids=()
  for batch in "${batches[@]}"; do
    run "${pair}_batch${batch}" "${xxl[@]}" --batch_size "$batch" > "$out/${pair}_batch${batch}.log" 2>&1 &
    pids+=($!)
  done
  run demo_pair "${demo[@]}" --batch_size 1 > "$out/demo_pair.log" 2>&1 &
  pids+=($!)
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { cat "$out/${names[$i]}.log" >&2; echo "${names[$i]} failed" >&2; exit 1; }
  done
else
  for batch in "${batches[@]}"; do
    run "${pair}_batch${batch}" "${xxl[@]}" --batch_size "$batch"
  done
  run demo_pair "${demo[@]}" --batch_size 1
fi
for name in "${names[@]}"; do cat "$out/$name.row" >> "$index"; rm "$out/$name.row"; done
echo "total $SECONDS s" >> "$index"
echo "report: $index"
