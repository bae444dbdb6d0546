#!/usr/bin/env bash
# The GPU runs behind docs/performance.md and docs/transport.md, one script per device call.
#
#   bench/h200_runs.sh levers OUTDIR   # each throughput lever on 2 GPUs, and the slow-link pair
#   bench/h200_runs.sh final OUTDIR    # seed vs final at seq 2048 and 4096, 1 GPU, slow link, transport
#   bench/h200_runs.sh verify OUTDIR   # the headline rows again (target 1, transport pair), for a release
#
# Needs torch and transformers (no Ray, no install: the package is put on PYTHONPATH). Every run has
# its own time limit, so one hang costs one row. Logs go to OUTDIR/logs; the tables to stdout.
# OVERRIDES (JSON of Hugging Face config fields) shrinks the model for a CPU smoke run of this script.
set -uo pipefail
mode=${1:?levers or final}
out=${2:?output folder}
cd "$(dirname "$0")/.."
mkdir -p "$out/logs"
# NVLink multicast stays off on shared hosts; the NCCL logs of each run land beside its output.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/training${PYTHONPATH:+:$PYTHONPATH}"
overrides=${OVERRIDES:-"{}"}
py=${PYTHON:-python3}

bench() {  # bench NAME NPROC LIMIT_S ARGS...
    local name=$1 nproc=$2 limit=$3 start=$SECONDS
    shift 3
    echo "\$ torchrun --nproc-per-node $nproc bench/train_throughput.py $*" | tee "$out/logs/$name.log"
    timeout "$limit" "$py" -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
        bench/train_throughput.py --overrides "$overrides" --json "$out/logs/$name.json" "$@" \
        >>"$out/logs/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >>"$out/logs/$name.log"
    grep -hE '^(\||# [0-9]+x|[0-9]+ GPU|\(exit)' "$out/logs/$name.log"
}

train() {  # train NAME LIMIT_S CONFIG_JSON [VAR=VALUE...]: the training function itself, 2 ranks
    local name=$1 limit=$2 cfg=$3 start=$SECONDS
    shift 3
    echo "\$ $* torchrun --nproc-per-node 2 -m fsdp_train --config-json '$cfg'" | tee "$out/logs/$name.log"
    cfg=$("$py" -c 'import json,sys; c=json.loads(sys.argv[1]); o=json.loads(sys.argv[2]); print(json.dumps({**c, "model_overrides": o} if o else c))' "$cfg" "$overrides")
    env "$@" FSDP_TRAIN_NCCL_LOG_DIR="$out/logs/nccl-$name" timeout "$limit" "$py" -m torch.distributed.run \
        --standalone --nproc-per-node 2 -m fsdp_train --config-json "$cfg" >>"$out/logs/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >>"$out/logs/$name.log"
    tail -n 1 "$out/logs/$name.log"
    "$py" bench/summarize_events.py "$out/logs/$name.log" | tail -n 1
}

date -u
nvidia-smi --query-gpu=name,memory.total,power.limit,driver_version --format=csv,noheader 2>/dev/null
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'

sockets=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 FSDP_TRAIN_RANKS_PER_NODE=1)
gathered='"reshard_after_forward":false'
slow='"seq_len":2048,"batch_size_per_rank":8,"grad_accum":4,"steps":3,"lr_schedule":"constant","compile":true,"probe_size_bytes":268435456'
case "$mode" in
levers)
    bench levers-2048 2 250 --seq-len 2048 --batch 8 --warmup 3 --steps 8 \
        --recipes seed,ours-compile,ours-chunked,ours-gathered,ours-final,ours-final@b16
    train slow-full 120 "{$slow,\"sharding\":\"full\"}" "${sockets[@]}"
    train slow-full-gathered 100 "{$slow,\"sharding\":\"full\",\"reshard_after_forward\":false}" "${sockets[@]}"
    train slow-auto 90 "{$slow,\"sharding\":\"auto\"}" "${sockets[@]}"
    ;;
final)
    bench final-2048 2 150 --seq-len 2048 --batch 8 --warmup 4 --steps 46 --recipes seed,ours-final
    bench final-2048-1gpu 1 80 --seq-len 2048 --batch 8 --warmup 3 --steps 10 --recipes ours-final
    bench final-4096 2 100 --seq-len 4096 --batch 4 --warmup 3 --steps 10 --recipes seed,ours-final
    train slow-auto 70 "{$slow,$gathered,\"sharding\":\"auto\"}" "${sockets[@]}"
    train slow-full 80 "{$slow,$gathered,\"sharding\":\"full\"}" "${sockets[@]}"
    train nvlink-default 60 '{"steps":3,"seq_len":2048,"batch_size_per_rank":4,"probe_size_bytes":268435456,"lr_schedule":"constant"}'
    bench final-2048-b16 2 60 --seq-len 2048 --batch 16 --warmup 3 --steps 8 --recipes ours-final
    ;;
verify)
    bench final-2048 2 150 --seq-len 2048 --batch 8 --warmup 4 --steps 46 --recipes seed,ours-final
    train nvlink-default 60 '{"steps":3,"seq_len":2048,"batch_size_per_rank":4,"probe_size_bytes":268435456,"lr_schedule":"constant"}'
    train slow-auto 70 "{$slow,$gathered,\"sharding\":\"auto\"}" "${sockets[@]}"
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac

echo
for f in "$out"/logs/*.log; do
    grep -hE '^(\$|\||# [0-9]+x|[0-9]+ GPU|\(exit)' "$f" | grep -v '^|---' || true
done
echo
"$py" bench/summarize_events.py $(grep -l 'fsdp_train --config-json' "$out"/logs/*.log)
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$out/logs"
