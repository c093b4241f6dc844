#!/usr/bin/env bash
# The paper's regime on one GPU or TPU chip, as one command that fits a lent device's time.
#
#   bash scripts/accelerator_check.sh [--seconds S] [--out DIR] [--only STAGE,...]   # full
#   bash scripts/accelerator_check.sh --small                      # tiny shapes (CPU, CI)
#
# Stages, in this order (a stage that fails or runs out of time is recorded and the next runs):
#   xxl_small_batch1  T5-XXL + T5-small, bfloat16, random weights, batch 1: baseline ms per token,
#                     c, c_first, r(K) for K = 1..8, whole loops at gammas 3, 5, 7 (token) and 5
#                     (block), compile seconds, peak memory, speedups at given alphas and at the
#                     paper's Table 2 alphas (scripts/studies/shape_walltime.py; alpha is an input)
#   demo_pair         the bundled demo pair with its real weights (python -m spec_decode.demo):
#                     alpha, measured and predicted speedup, greedy identity
#   greedy_identity   the bundled pair's greedy outputs against the baseline's on 200 Multi30k
#                     inputs at three precisions (scripts/studies/greedy_identity.py)
#   xxl_small_batch8  as the first stage at batch 8, token verification only
# --seconds bounds the whole run (default 540): each stage gets at most its own share and what
# is left, and is skipped when less than half its share is left. Every loop at XXL compiles once.
# --only runs the named stages alone (e.g. what an earlier, shorter lease left out).
#
# Needs jax, flax, optax, numpy, orbax, tensorstore, sentencepiece, msgpack and sacrebleu, plus
# gin-config and tqdm from build/device_site where the image lacks them (see
# scripts/accelerator_distill.sh); no install: the repository is put on PYTHONPATH. Writes
# DIR (default docs/results/<device>_<date>/; --small: out/accelerator_check_small_<device>/):
# one folder or file per stage, <stage>.log, and README.md indexing them with their seconds.
# COMMIT names the commit in the index where the copy that runs has no git history of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/build/device_site${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}  # e.g. PYTHON=python3.11

usage() { echo "usage: $0 [--small] [--seconds S] [--out DIR] [--only STAGE,...]" >&2; exit 2; }
stages=(xxl_small_batch1 demo_pair greedy_identity xxl_small_batch8)
small=0; budget=540; out=""; only=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --small) small=1; shift ;;
    --seconds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; budget=$2; shift 2 ;;
    --out) [[ -n ${2:-} ]] || usage; out=$2; shift 2 ;;
    --only) [[ -n ${2:-} ]] || usage; only=$2; shift 2 ;;
    *) usage ;;
  esac
done
for name in ${only//,/ }; do
  [[ " ${stages[*]} " == *" $name "* ]] || { echo "--only: unknown stage $name; the stages:" \
    "${stages[*]}" >&2; exit 2; }
done

# The Python must start and import jax and this package; else say which Python and why.
probe_err=$(mktemp); code=0
device=$("$python" -c "import jax, re, spec_decode; print(re.sub(r'[^a-z0-9]+', '_', jax.devices()[0].device_kind.lower()).strip('_'))" 2>"$probe_err") || code=$?
if ((code != 0)); then
  why=$(sed '/^[[:space:]]*$/d' "$probe_err" | tail -n 1); rm -f "$probe_err"
  echo "error: PYTHON=$python cannot run the check (exit $code): ${why:-it printed nothing}" >&2
  exit 1
fi
rm -f "$probe_err"
if [[ $small == 1 ]]; then
  out=${out:-out/accelerator_check_small_${device}}
  xxl=(scripts/studies/shape_walltime.py --target nano --draft nano --vocab_size 256 --dtype float32 --input_len 8
       --max_decode_len 4 --repeats 1 --num_steps 2)
  b1=(--gammas 1 2 --block_gammas 1 --batch_size 1); b8=(--gammas 1 --batch_size 2)
  demo=(-m spec_decode.demo --n 1 --repeats 1)
  identity=(scripts/studies/greedy_identity.py --n 2 --gammas 2 --batch_size 2 --max_decode_len 8)
  shares=(60 240 60 60)
else
  out=${out:-docs/results/${device}_$(date -u +%Y-%m-%d)}
  xxl=(scripts/studies/shape_walltime.py --target xxl --draft small --dtype bfloat16 --input_len 64
       --max_decode_len 32 --repeats 3 --num_steps 16)
  b1=(--gammas 3 5 7 --block_gammas 5 --batch_size 1); b8=(--gammas 3 5 7 --batch_size 8)
  demo=(-m spec_decode.demo)
  identity=(scripts/studies/greedy_identity.py --n 200)
  shares=(300 150 90 240)
fi
mkdir -p "$out"
index="$out/README.md"
{
  echo "# The paper's regime on $("$python" -c 'import jax; print(jax.devices()[0].device_kind)')"
  echo
  echo "\`bash scripts/accelerator_check.sh $([[ $small == 1 ]] && echo '--small ')--seconds $budget$([[ -n $only ]] && echo " --only $only")\`" \
       "on $(date -u +%Y-%m-%d), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}," \
       "jax $("$python" -c 'import jax; print(jax.__version__)')."
  echo "The XXL runs have random weights: **alpha is an input** in their speedup tables; every" \
       "cost is measured. The demo pair runs with its real weights."
  echo
  echo "| stage | output | seconds | outcome |"
  echo "| --- | --- | --- | --- |"
} > "$index"

deadline=$((SECONDS + budget))
failed=0
stage() {  # name, share (seconds), output (in $out), then the command (its stdout goes to the log)
  local name=$1 share=$2 output=$3; shift 3
  local left=$((deadline - SECONDS - 5)) start=$SECONDS outcome=ok code=0
  local cap=$((share < left ? share : left))
  if [[ -n $only && ",$only," != *",$name,"* ]]; then
    echo "| $name | - | 0 | not asked for (--only) |" >> "$index"; return
  fi
  if ((2 * cap < share)); then  # under half its share left: it would only be cut
    echo "| $name | - | 0 | skipped: $left s left |" >> "$index"; echo "$name: skipped" >&2
    return
  fi
  echo "== $name (at most $cap s)" >&2
  timeout --kill-after=10 "$cap" "$@" > "$out/$name.log" 2>&1 || code=$?
  if ((code == 124 || code == 137)); then outcome="cut at $cap s"; failed=1
  elif ((code != 0)); then outcome="failed (exit $code)"; failed=1; fi
  [[ $outcome == ok ]] || tail -5 "$out/$name.log" >&2
  echo "| $name | [$output]($output) | $((SECONDS - start)) | $outcome |" >> "$index"
  echo "$name: $outcome, $((SECONDS - start)) s" >&2
}
stage xxl_small_batch1 "${shares[0]}" xxl_small_batch1/report.md \
  "$python" "${xxl[@]}" "${b1[@]}" --out_dir "$out/xxl_small_batch1"
stage demo_pair "${shares[1]}" demo_pair/report.md \
  "$python" "${demo[@]}" --out_dir "$out/demo_pair"
stage greedy_identity "${shares[2]}" greedy_identity.log "$python" "${identity[@]}"
stage xxl_small_batch8 "${shares[3]}" xxl_small_batch8/report.md \
  "$python" "${xxl[@]}" "${b8[@]}" --out_dir "$out/xxl_small_batch8"
echo "total $SECONDS s" >> "$index"
echo "report: $index"
exit $failed
