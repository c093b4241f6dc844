#!/usr/bin/env bash
# The white-box distillation recipe on one GPU or TPU chip, as one command: the target's outputs for the training
# inputs, white-box distillation of a bundled draft on them (TVD at T = 1), then alpha on the
# Multi30k and Debian test sets against the draft it started from.
#
#   bash scripts/accelerator_distill.sh OUT_DIR [--small] [--draft draft_small|draft_large]
#                                       [--steps N] [--batch_tokens N] [--train_seconds S]
#                                       [--eval_every N] [--records DIR | --records_only]
#
# --train_seconds bounds the training stage: training stops after the first step that ends past
# it, and that step is checkpointed, exported and measured (log.jsonl says how far it got).
# A lent device runs a command for at most 10 minutes: leave room for the other stages.
# --eval_every sets how often training measures alpha (T = 0) on the validation records: the
# alpha-against-steps curve in log.jsonl (default: every 1000 steps, or every step count below).
#
# --records DIR takes the target's outputs from an earlier run's mix/ folder (train.jsonl and
# validation.jsonl) instead of decoding them: the two record stages are the target's greedy and
# sampled outputs, the same wherever they are computed, so a short lease can spend its time on
# training (make them on any machine with --records_only, which stops after them).
#
# --small runs every stage at tiny sizes (CPU, CI). On CPU the full recipe takes hours (the
# runs in docs/results/whitebox-target-outputs/); on an accelerator the stages print
# their seconds so that the next run can be sized.
#
# The device image has jax, flax, optax, orbax, tensorstore, sentencepiece and msgpack but
# not gin-config or tqdm, which training and measurement import. Both are pure Python:
#   python3 -m pip install --target build/device_site --no-deps gin-config tqdm
# here, then carry build/device_site; this script puts it on PYTHONPATH. No
# install: the repository is put on PYTHONPATH too. A lent device returns at most 8 files from
# $OUT, so pack what matters, e.g. (device tool, carry ["build/device_site"], timeout_s 590):
#   bash scripts/accelerator_distill.sh /tmp/distill --train_seconds 300 2>&1 | tee $OUT/log.txt;
#   tar czf $OUT/distill.tgz -C /tmp/distill --exclude records --exclude mix .
# (CI runs --small with the other packages the image lacks made unimportable.)
#
# OUT_DIR gets: records/ and mix/train.jsonl (the target's outputs), log.jsonl (training),
# t5x/ (the distilled draft, bfloat16 T5X), alpha_multi30k/ and alpha_debsum/
# (scripts/measure_alpha.py reports, the start draft beside the new one), seconds.txt (per
# stage), and DONE when everything finished; without DONE it is incomplete.
set -euo pipefail
[[ $# -ge 1 && $1 != --* ]] && out_arg=$(realpath -m "$1") || out_arg=""  # before the cd
caller=$PWD
cd "$(dirname "$0")/.."
# build/device_site is on the path whether or not it exists (a missing folder is skipped).
export PYTHONPATH="$PWD:$PWD/build/device_site${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}

usage() {
  echo "usage: $0 OUT_DIR [--small] [--draft draft_small|draft_large] [--steps N]" \
       "[--batch_tokens N] [--train_seconds S] [--eval_every N] [--records DIR | --records_only]" >&2
  exit 2
}
[[ -n $out_arg ]] || usage
out=$out_arg; shift
small=0; draft=draft_small; steps=""; batch_tokens=""; train_seconds=""; eval_every=""
records=""; records_only=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --small) small=1; shift ;;
    --draft) [[ ${2:-} == draft_small || ${2:-} == draft_large ]] || usage; draft=$2; shift 2 ;;
    --steps) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; steps=$2; shift 2 ;;
    --batch_tokens) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; batch_tokens=$2; shift 2 ;;
    --train_seconds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; train_seconds=$2; shift 2 ;;
    --eval_every) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; eval_every=$2; shift 2 ;;
    --records) [[ -n ${2:-} ]] || usage; records=$(cd "$caller" && realpath -m "$2"); shift 2 ;;
    --records_only) records_only=1; shift ;;
    *) usage ;;
  esac
done
[[ -z $records || $records_only == 0 ]] || usage
[[ -z $records || ( -f $records/train.jsonl && -f $records/validation.jsonl ) ]] || {
  echo "--records $records: expected train.jsonl and validation.jsonl in it" >&2; exit 2; }
"$python" -c "import gin, tqdm" 2>/dev/null || {
  echo "gin-config and tqdm are missing: python3 -m pip install --target build/device_site --no-deps gin-config tqdm" >&2
  exit 2
}
rm -f "$out/DONE"
mkdir -p "$out/records"

if [[ $small == 1 ]]; then
  m30k_greedy=demo_multi30k:train:24; deb_greedy=demo_debsum:train:8
  m30k_sampled=demo_multi30k:train:16; val=demo_ende:validation:4
  batch=8; decode_len=16; steps=${steps:-3}; batch_tokens=${batch_tokens:-512}; n_eval=4
  # Training measures no alpha of its own (the alpha stages do): CI time.
  checkpoint_every=100; train_eval=0; log_every=10; compile_buckets=False
  warmup=(--gin.WARMUP_STEPS=1)  # whitebox.gin's 50 would outlast the 3 steps
else
  m30k_greedy=demo_multi30k:train; deb_greedy=demo_debsum:train:5000
  m30k_sampled=demo_multi30k:train:15000; val=demo_ende:validation:200
  batch=512; decode_len=64; steps=${steps:-4000}; batch_tokens=${batch_tokens:-16384}; n_eval=200
  checkpoint_every=100; train_eval=$n_eval; log_every=10
  # Every bucket shape's step compiled side by side before training: one at a time, as the loop
  # meets them, they cost an H200 ~10-40 s each against ~20 ms a step once compiled.
  compile_buckets=True
  warmup=()  # whitebox.gin's
fi
target=(--config demo_target --checkpoint spec_decode/data/models/target)
: > "$out/seconds.txt"
stage() {  # name, then the command; appends "name seconds" to seconds.txt
  local name=$1 start=$SECONDS; shift
  echo "== $name" >&2
  "$@"
  echo "$name $((SECONDS - start))" | tee -a "$out/seconds.txt" >&2
}

# The target's outputs: greedy for every Multi30k training input and for Debian descriptions,
# samples at T = 1 for part of Multi30k.
mkdir -p "$out/mix"
if [[ -n $records ]]; then
  cp "$records/train.jsonl" "$records/validation.jsonl" "$out/mix/"
  echo "records from $records: $(wc -l < "$out/mix/train.jsonl") training records" >&2
else
  stage records_greedy "$python" scripts/distill.py "${target[@]}" --max_decode_len "$decode_len" \
    --train "$m30k_greedy" "$deb_greedy" --validation "$val" --batch_size "$batch" \
    --keep_unfinished --out_dir "$out/records/greedy"
  stage records_sampled "$python" scripts/distill.py "${target[@]}" --max_decode_len "$decode_len" \
    --train "$m30k_sampled" --validation "$val" --temperature 1 --seed 3 --batch_size "$batch" \
    --out_dir "$out/records/sampled"
  cat "$out/records/greedy/train.jsonl" "$out/records/sampled/train.jsonl" > "$out/mix/train.jsonl"
  cp "$out/records/greedy/validation.jsonl" "$out/mix/validation.jsonl"
fi
if [[ $records_only == 1 ]]; then
  touch "$out/DONE"
  echo "wrote $out/mix (the target's outputs; --records $out/mix takes them)" >&2
  exit 0
fi

gin_draft=demo_${draft}
rm -rf "$out/workdir" "$out/t5x"
train_args() {  # number of steps -> `args`: whitebox.py training (or resuming) to it, exporting
  args=(scripts/whitebox.py --gin_file=runs/whitebox.gin
    --gin_file=models/demo/target.gin --gin_file="models/demo/${draft}.gin"
    --gin.TARGET_CONFIG="@demo_target/t5.T5Config()"
    --gin.TARGET_CHECKPOINT="'spec_decode/data/models/target'"
    --gin.DRAFT_CONFIG="@${gin_draft}/t5.T5Config()"
    --gin.INIT_CHECKPOINT="'spec_decode/data/models/${draft}'" --gin.DIVERGENCE="'tvd'"
    --gin.DISTILL_DIR="'$out/mix'" --gin.REFERENCE_WEIGHT=0.0 --gin.DISTILLED_WEIGHT=1.0
    --gin.ON_POLICY_WEIGHT=0.0 --gin.NUM_STEPS="$1" "${warmup[@]}"
    --gin.BATCH_TOKENS="$batch_tokens"
    --gin.LEARNING_RATE=3e-3 --gin.WORKDIR="'$out/workdir'" --gin.EXPORT_DIR="'$out/t5x'"
    --gin.whitebox.WhiteboxConfig.eval_temperature=0.0
    --gin.whitebox.WhiteboxConfig.eval_examples="$train_eval"
    --gin.whitebox.WhiteboxConfig.log_every="$log_every"
    --gin.whitebox.WhiteboxConfig.eval_every="${eval_every:-$(( steps > 1000 ? 1000 : steps ))}"
    --gin.whitebox.WhiteboxConfig.checkpoint_every="$checkpoint_every"
    --gin.whitebox.WhiteboxConfig.compile_buckets="$compile_buckets")
}
bounded_train() {  # trains for at most about train_seconds (whitebox.train stops itself)
  train_args "$steps"
  [[ -z $train_seconds ]] || args+=(--gin.whitebox.WhiteboxConfig.train_seconds="$train_seconds")
  "$python" "${args[@]}"
}
stage train bounded_train
cp "$out/workdir/log.jsonl" "$out/log.jsonl"

alpha() {  # task, split, report folder, temperatures...
  local task=$1 split=$2 name=$3; shift 3
  "$python" scripts/measure_alpha.py --target_config demo_target \
    --target_checkpoint spec_decode/data/models/target \
    --draft_config "$gin_draft" --draft_checkpoint "spec_decode/data/models/${draft}" \
    --draft_config "$gin_draft" --draft_checkpoint "$out/t5x" \
    --temperatures "$@" --task "$task" --split "$split" --n "$n_eval" \
    --batch_size "$(( batch < 64 ? batch : 64 ))" --out_dir "$out/$name"
}
stage alpha_multi30k alpha demo_ende test_multi30k alpha_multi30k 0 1
stage alpha_debsum alpha demo_debsum test alpha_debsum 0
rm -rf "$out/workdir"
touch "$out/DONE"
echo "wrote $out (stages' seconds in $out/seconds.txt)" >&2
