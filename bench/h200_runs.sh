#!/usr/bin/env bash
# The GPU runs behind docs/performance.md and docs/transport.md, one script per device call.
#
#   bench/h200_runs.sh levers OUTDIR   # each throughput lever on 2 GPUs, and the slow-link pair
#   bench/h200_runs.sh final OUTDIR    # seed vs final at seq 2048 and 4096, 1 GPU, slow link, transport
#   bench/h200_runs.sh verify OUTDIR   # the headline rows again (target 1, transport pair), for a release
#   bench/h200_runs.sh round2-bf16 OUTDIR  # 1 GPU: bf16 levers, a kernel profile, time to first step (cold/warm)
#   bench/h200_runs.sh round2-fp8 OUTDIR   # 1 GPU: fp8 recipes against bf16, Qwen2.5-1.5B and a 7B-shaped model
#   TEXT=FILE bench/h200_runs.sh round2-final OUTDIR  # 1 GPU: the round-two tables of docs/performance.md
#   TEXT=FILE bench/h200_runs.sh round2-verify OUTDIR # 1 GPU: fp8 loss on text (1.5B), precision auto end to end
#   bench/h200_runs.sh round3-probe OUTDIR  # 1 GPU: where a start goes (import times, cProfile cold and warm), bf16 levers
#   TEXT=FILE bench/h200_runs.sh round3-text OUTDIR  # 1 GPU: fp8's loss on text for Qwen2.5-1.5B, 300 steps
#   BASE=DIR bench/h200_runs.sh round3-verify OUTDIR  # 1 GPU: starts of BASE's training package against this one's,
#                                                     # each cold then warm; the bf16 levers that won, twice each
#   WHEELS=DIR bench/h200_runs.sh round5-speed OUTDIR  # 1 GPU: torchtitan (its wheels from DIR) beside the
#                                                     # bundled function's recipes, one MFU formula, window timing
#   bench/h200_runs.sh round5-data OUTDIR   # 1 GPU: the function on Python sources with the document mask and compile,
#                                           # against random tokens; an asynchronous checkpoint's blocked and total time
#   WHEELS=DIR bench/h200_runs.sh round5 OUTDIR  # both (longer than one device call allows: run the halves)
#   bench/h200_runs.sh round6 OUTDIR   # 1 GPU: varlen attention with grouped key/value heads, flight-recorder dumps
#                                      # (OUTDIR/fr), checkpoints with lasting pinned buffers, the mask's ratio
#   bench/h200_runs.sh mask OUTDIR     # 1 GPU: round5-data's mask ratio alone (random tokens, then Python sources)
#   WHEELS=DIR bench/h200_runs.sh round8 OUTDIR  # 1 GPU: the document mask's attention kernels (bench/doc_attention.py),
#                                     # torchtitan beside ours-r5 and round eight's coordinate-descent recipes
#   WHEELS=DIR bench/h200_runs.sh round9 OUTDIR  # 1 GPU: torchtitan beside ours-r8 (with and without FSDP), the blocks
#                                     # as CUDA graphs, and the decoder stack compiled whole (both without FSDP)
#   FA4SITE=FILE bench/h200_runs.sh round10 OUTDIR  # 1 GPU: FlashAttention-4 (flash-attn-4 and its CuTe DSL, unpacked
#                                     # from FILE, a tar.xz of their wheels' contents, and FA4WHEELS, more wheels):
#                                     # the attention table, the document mask's ratio over 30 and 200 steps on it,
#                                     # then over 30 on torch's varlen kernel
#   WHEELS=DIR bench/h200_runs.sh round11 OUTDIR  # 1 GPU, one call (8-9 min): torchtitan beside ours-r9-graphs and
#                                     # round eleven's losses: Liger-kernel's fused linear cross-entropy (its wheel in
#                                     # DIR too), torchtitan's bf16 logits with a compiled cross-entropy
#   bench/h200_runs.sh round11-loss OUTDIR  # 1 GPU (~2-5 min): the training function with lossChunkTokens 4096, 0
#                                           # (the compiled cross-entropy) and 16384 (CHUNKS=...), each beside the
#                                           # package in BASELINE=DIR if given: Summary tokens/s, memory, step times
#   WHEELS=DIR bench/h200_runs.sh round12 OUTDIR  # 1 GPU (~7 min): torchtitan bf16 and fp8 (NO_TITAN=1: not), the
#                                     # training function in bf16 and fp8 for each SHAPES=SEQxBATCH (2048x8)
#   WHEELS=DIR bench/h200_runs.sh round12-loss OUTDIR  # 1 GPU (~3 min): bf16 against fp8 on Python sources, 50 steps
#   WHEELS=DIR bench/h200_runs.sh round12-bench OUTDIR  # 1 GPU (~5 min): round twelve's bench recipes side by side
#   bench/h200_runs.sh notice OUTDIR        # 1 GPU: a node's notice at step 35 of the 1.5B run (a save every 20
#                                           # steps): seconds from notice to saved, the save's blocked and total time
#   bench/h200_runs.sh lora OUTDIR   # 1 GPU (~8 min): LoRA beside full fine-tuning (1.5B) and beside peft on a plain
#                                    # Hugging Face model (7B shape): tokens/s, MFU, peak allocated and reserved memory
#   WHEELS=DIR bench/h200_runs.sh qlora OUTDIR  # 1 GPU (~9 min): QLoRA beside LoRA and full fine-tuning (1.5B), 7B and
#                                    # 14B QLoRA (torchao's wheel in DIR): tokens/s, MFU, peak memory; the function itself
#   WHEELS=DIR bench/h200_runs.sh qlora-check OUTDIR  # 1 GPU (~5 min): LoRA and QLoRA without checkpointing beside full
#                                    # fine-tuning (1.5B); the function with QLoRA from saved safetensors to a checked export
#   bench/h200_runs.sh conformance OUTDIR  # 1 GPU (~4 min): the start-up conformance check's losses and seconds, 1.5B
#                                          # full fine-tuning and the 7B shape with LoRA
#   bench/h200_runs.sh step-times OUTDIR   # 1 GPU (~3 min): every step's reported time and rate against the wall
#                                         # clock (bench/step_times.py), checkpoints every 10 steps and an export at
#                                         # the end; then the step timer's GPU unit test
#   bench/h200_runs.sh health OUTDIR  # 1 GPU: the bundled function with spec.health's timings, watchdog and flight
#                                     # recorder off and on, interleaved (off, on, off, on), tokens/s of each
#   WHEELS=DIR [PRECISION=fp8] bench/h200_runs.sh headline OUTDIR  # 1 GPU, one call (~8 min): torchtitan, the bench's best recipe
#                                     # and the training function itself side by side (one MFU formula), the document
#                                     # mask's ratio with compile on (on FlashAttention-4 with FA4SITE, FA4WHEELS as
#                                     # for round10), a checkpoint's blocked and total time
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
py=${PYTHON:-python3}

# Qwen2.5-7B's and Qwen2.5-14B's shapes (their published configs) over the 1.5B model's name, for OVERRIDES
QWEN7B='{"hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"vocab_size":152064,"tie_word_embeddings":false}'
QWEN14B='{"hidden_size":5120,"intermediate_size":13824,"num_hidden_layers":48,"num_attention_heads":40,"num_key_value_heads":8,"vocab_size":152064,"tie_word_embeddings":false}'

with_overrides() {  # with_overrides CONFIG_JSON: the config with OVERRIDES (Hugging Face config fields) as model_overrides
    "$py" -c 'import json,sys; c=json.loads(sys.argv[1]); o=json.loads(sys.argv[2]); print(json.dumps({**c, "model_overrides": o} if o else c))' \
        "$1" "${OVERRIDES:-"{}"}"
}

bench() {  # bench NAME NPROC LIMIT_S ARGS...  (OVERRIDES=JSON: Hugging Face config fields)
    local name=$1 nproc=$2 limit=$3 start=$SECONDS overrides=${OVERRIDES:-"{}"}
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
    cfg=$(with_overrides "$cfg")
    env "$@" FSDP_TRAIN_NCCL_LOG_DIR="$out/logs/nccl-$name" timeout "$limit" "$py" -m torch.distributed.run \
        --standalone --nproc-per-node 2 -m fsdp_train --config-json "$cfg" >>"$out/logs/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >>"$out/logs/$name.log"
    tail -n 1 "$out/logs/$name.log"
    "$py" bench/summarize_events.py "$out/logs/$name.log" | tail -n 1
}

first_steps() {  # the training function twice with one compile cache: cold, then warm
    starts ttfs "$PWD/training" 2
}

starts() {  # starts NAME PACKAGE_DIR RUNS: the training function RUNS times with one compile cache, empty before the first
    local name=$1 package=$2 runs=$3 cache="$out/compile-cache-$1" cfg
    rm -rf "$cache"
    cfg='{"seq_len":2048,"batch_size_per_rank":8,"steps":3,"lr_schedule":"constant","compile":true,"reshard_after_forward":false,"probe_size_bytes":0,"compile_cache_dir":"'$cache'"}'
    cfg=$(with_overrides "$cfg")
    for run in $(seq 1 "$runs"); do
        local start=$SECONDS log="$out/logs/start-$name-$run.log"
        echo "\$ PYTHONPATH=$package torchrun --nproc-per-node 1 -m fsdp_train --config-json '$cfg'   # $name, run $run" >"$log"
        PYTHONPATH="$package" timeout 200 "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m fsdp_train \
            --config-json "$cfg" >>"$log" 2>&1
        echo "# start $name run $run: exit $?, $((SECONDS - start)) s wall, $(du -sm "$cache" | cut -f1) MB cache"
        grep -h '"kind":"timings"' "$log" | sed 's/^.*FSDP_EVENT //'
    done
    rm -rf "$cache"
}

startup_profile() {  # the training function as one process under cProfile and -X importtime: cold, then warm cache
    local cache="$out/compile-cache-profile" cfg
    rm -rf "$cache"
    cfg='{"seq_len":2048,"batch_size_per_rank":8,"steps":2,"lr_schedule":"constant","compile":true,"reshard_after_forward":false,"probe_size_bytes":0,"compile_cache_dir":"'$cache'"}'
    cfg=$(with_overrides "$cfg")
    for run in cold warm; do
        local start=$SECONDS
        RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 timeout 120 \
            "$py" -X importtime -m cProfile -o "$out/logs/startup-$run.prof" -m fsdp_train --config-json "$cfg" \
            >"$out/logs/startup-$run.log" 2>"$out/logs/importtime-$run.txt"
        echo "# startup-$run: exit $?, $((SECONDS - start)) s"
        grep -h '"kind":"timings"' "$out/logs/startup-$run.log" "$out/logs/importtime-$run.txt" | sed 's/^.*FSDP_EVENT //'
        "$py" -c 'import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats("cumulative").print_stats(45)' \
            "$out/logs/startup-$run.prof" | grep -E '^ +[0-9]' | awk '$4 > 0.25' | cut -c1-160
        grep -h '^import time:' "$out/logs/importtime-$run.txt" | sort -t'|' -k2 -n -r | head -n 22 | cut -c1-120
    done
    rm -rf "$cache"
}

wheel_site() {  # wheel_site DIR PACKAGE WHEEL...: the wheels (no index, no deps) into DIR, unless DIR/PACKAGE is there
    local site=$1 package=$2
    shift 2
    [ -d "$site/$package" ] && return 0
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$@" \
        >"$out/logs/$package-install.log" 2>&1 || { echo "# $package install failed"; tail -n 5 "$out/logs/$package-install.log"; return 1; }
}

titan() {  # titan NAME LIMIT_S ARGS...: torchtitan's trainer on the Qwen2.5-1.5B shape (bench/titan_qwen.py), 1 GPU
    local name=$1 limit=$2 start=$SECONDS site=${TITAN_SITE:-/tmp/titan-site}
    shift 2
    wheel_site "$site" torchtitan "${WHEELS:?WHEELS: torchtitan and its wheels}"/*.whl || return
    echo "\$ torchrun --nproc-per-node 1 bench/titan_qwen.py --job.config_file bench/titan_qwen.toml $*" | tee "$out/logs/$name.log"
    PYTHONPATH="$site:$PYTHONPATH" timeout "$limit" "$py" -m torch.distributed.run --standalone --nproc-per-node 1 \
        bench/titan_qwen.py --job.config_file bench/titan_qwen.toml --job.dump_folder "/tmp/titan-$name" \
        --x.json "$out/logs/$name.json" "$@" >>"$out/logs/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >>"$out/logs/$name.log"
    grep -hE '^(\||# done|\(exit)' "$out/logs/$name.log"
    grep -h 'step: *[0-9]' "$out/logs/$name.log" | tail -n 2 | cut -c1-200
}

fn1() {  # fn1 NAME LIMIT_S CONFIG_JSON: the training function itself on 1 GPU; its Summary and checkpoint lines
    local name=$1 limit=$2 cfg start=$SECONDS
    cfg=$(with_overrides "$3")
    echo "\$ torchrun --nproc-per-node 1 -m fsdp_train --config-json '$3'" | tee "$out/logs/$name.log"
    timeout "$limit" "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m fsdp_train --config-json "$cfg" \
        >>"$out/logs/$name.log" 2>&1
    echo "(exit $?, $((SECONDS - start)) s)" >>"$out/logs/$name.log"
    echo "# $name: $(grep -c 'Recompiling\|recompil' "$out/logs/$name.log") recompilation lines, $(grep -c 'lru_cache' "$out/logs/$name.log") lru_cache warnings"
    grep -hE '^fsdp_train: (checkpoint|data)' "$out/logs/$name.log"
    grep -h '"kind":"checkpoint"' "$out/logs/$name.log" | sed 's/^.*FSDP_EVENT //' | cut -c1-300
    grep -h '"kind":"summary"' "$out/logs/$name.log" | sed 's/^.*FSDP_EVENT //' | cut -c1-400
    grep -h '"kind":"step"' "$out/logs/$name.log" | sed 's/^.*FSDP_EVENT //' | "$py" -c 'import json, sys; print("# step seconds:", " ".join(f"{json.loads(l)["step_seconds"]:.3f}" for l in sys.stdin))'
    "$py" bench/summarize_events.py "$out/logs/$name.log" | tail -n 1
    tail -n 1 "$out/logs/$name.log"
}

liger_site() {  # liger_site DIR: liger-kernel's wheel from WHEELS (no deps: Triton is torch's) into DIR, on PYTHONPATH
    wheel_site "$1" liger_kernel "${WHEELS:?WHEELS: the liger-kernel wheel}"/liger_kernel-*.whl || return 1
    export PYTHONPATH="$PYTHONPATH:$1"
    "$py" -c 'import importlib.metadata as m; from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss; print("liger-kernel", m.version("liger-kernel"))' 2>&1 \
        | tail -n 3
}

ratio() {  # ratio A B: B's Summary tokens/s over A's
    "$py" - "$out/logs/$1.log" "$out/logs/$2.log" <<'PY'
import json, sys
def tps(path):
    for line in open(path):
        if '"kind":"summary"' in line:
            return json.loads(line.split("FSDP_EVENT ", 1)[1])["tokens_per_second"]
a, b = (tps(p) for p in sys.argv[1:3])
print(f"# Summary tokens/s: {sys.argv[2].rsplit('/', 1)[-1]} {b} / {sys.argv[1].rsplit('/', 1)[-1]} {a} = {b / a:.3f}x" if a and b else "# ratio: a run has no Summary")
PY
}

fa4_site() {  # fa4_site DIR: flash-attn-4 and its CuTe DSL unpacked into DIR (FA4SITE: a tar.xz, FA4WHEELS: wheels), on PYTHONPATH
    [ -d "$1" ] || { mkdir -p "$1" && "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        "${FA4SITE:?FA4SITE: flash-attn-4 and its CuTe DSL as a tar.xz}" "$1" && \
        "$py" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$1" ${FA4WHEELS:-}; } || return 1
    # PYTHONPATH reads no .pth file: the CuTe DSL's package folder (its .pth) is named here
    export PYTHONPATH="$PYTHONPATH:$1:$1/nvidia_cutlass_dsl/dsl_packages"
    "$py" -c 'import torch, flash_attn.cute, fsdp_train.models.fa4 as f; print("FlashAttention-4:", f.available(torch.device("cuda")))' 2>&1 \
        | tail -n 3
}

round5_speed() {
    [ -n "${NO_TITAN:-}" ] || titan titan-native 200 --training.steps 30 --x.warmup 10 ${TITAN_ARGS:-}
    bench r5-speed 1 330 --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window \
        --recipes "${RECIPES:-ours-final,ours-r5,ours-r5-nofsdp,ours-lazy-gc}"
}

round5_data() {
    round5_data_runs
    round5_checkpoint
}

round5_data_runs() {  # the document mask with compile on Python sources against random tokens, one ratio
    local assets=${ASSETS:-/tmp/fsdp-python-sources} base
    TORCH_LOGS=recompiles "$py" bench/data_pipeline.py python-sources "$assets" 2>&1 | tee "$out/logs/assets.log"
    base='"seq_len":2048,"batch_size_per_rank":8,"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":2e-5'"${R5_EXTRA:-}"
    TORCH_LOGS=recompiles fn1 r5-random "${MASK_LIMIT:-150}" "{$base,\"steps\":${STEPS:-30},\"model\":\"Qwen/Qwen2.5-1.5B\",\"model_init\":\"random\"}"
    TORCH_LOGS=recompiles fn1 r5-python "${MASK_LIMIT:-170}" "{$base,\"steps\":${STEPS:-30},\"model\":\"Qwen/Qwen2.5-1.5B\",\"model_init\":\"random\",\"data\":\"$assets/corpus\",\"tokenizer\":\"$assets/tokenizer\",\"shuffle_seed\":1}"
    ratio r5-random r5-python
}

round5_checkpoint() {
    local base='"seq_len":2048,"batch_size_per_rank":8,"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":2e-5'"${R5_EXTRA:-}"
    rm -rf /tmp/fsdp-r5-ckpt
    fn1 r5-checkpoint 200 "{$base,\"steps\":${CKPT_STEPS:-60},\"model\":\"Qwen/Qwen2.5-1.5B\",\"model_init\":\"random\",\"checkpoint_path\":\"/tmp/fsdp-r5-ckpt\",\"checkpoint_interval\":${CKPT_EVERY:-30}}"
    du -sh /tmp/fsdp-r5-ckpt/* 2>/dev/null
    rm -rf /tmp/fsdp-r5-ckpt
}

notice_run() {  # one GPU: a node's notice mid-run, after a periodic save: notice -> saved, and the save's blocked time
    local base='"seq_len":2048,"batch_size_per_rank":8,"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":2e-5'"${NOTICE_EXTRA:-}"
    local dir=/tmp/fsdp-notice-bench ckpt=/tmp/fsdp-notice-ckpt at=${NOTICE_AT_STEP:-35}
    rm -rf "$dir" "$ckpt" && mkdir -p "$dir"
    # The preStop hook's side (render.worker_notice_hook): the notice once step $at ran (the step-20 save measured).
    ( while ! grep -q "\"kind\":\"step\".*\"step\":$at[,}]" "$out/logs/notice.log" 2>/dev/null; do sleep 0.2; done
      echo "$(date +%s.%N | cut -c1-14) 120 bench" > "$dir/.notice" && mv "$dir/.notice" "$dir/notice" ) &
    local writer=$!
    ( export FSDP_NOTICE_DIR="$dir"
      fn1 notice "${NOTICE_LIMIT:-400}" "{$base,\"steps\":${NOTICE_STEPS:-200},\"model\":\"Qwen/Qwen2.5-1.5B\",\"model_init\":\"random\",\"checkpoint_path\":\"$ckpt\",\"checkpoint_interval\":20}" )
    kill "$writer" 2>/dev/null
    echo "# notice: $(cat "$dir/notice" 2>/dev/null); done: $(cat "$dir/done" 2>/dev/null) (unix time, step, saved)"
    grep -h '"kind":"interruption"' "$out/logs/notice.log" | sed 's/^.*FSDP_EVENT //' | cut -c1-400
    du -sh "$ckpt"/* 2>/dev/null
    rm -rf "$dir" "$ckpt"
}

# Qwen2.5-7B's shape (hidden 3584, MLP 18944, 28 query / 4 KV heads, untied head) with 8 of its 28 layers.
QWEN7B_8L='{"hidden_size":3584,"intermediate_size":18944,"num_attention_heads":28,"num_key_value_heads":4,"tie_word_embeddings":false,"num_hidden_layers":8}'

date -u
nvidia-smi --query-gpu=name,memory.total,power.limit,driver_version --format=csv,noheader 2>/dev/null
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'

sockets=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 FSDP_TRAIN_RANKS_PER_NODE=1)
gathered='"reshard_after_forward":false'
slow='"seq_len":2048,"batch_size_per_rank":8,"grad_accum":4,"steps":3,"lr_schedule":"constant","compile":true,"probe_size_bytes":268435456'
health_overhead() {  # ROUNDS (2) pairs of runs, one compile cache: health off, then on; tokens/s each and the mean
    local cache="$out/compile-cache-health" cfg rounds=${ROUNDS:-2} log
    rm -rf "$cache"
    # SEQ, BATCH and COMPILE shrink it for a CPU smoke run of this script (with OVERRIDES).
    cfg='{"seq_len":'${SEQ:-2048}',"batch_size_per_rank":'${BATCH:-8}',"steps":'${STEPS:-80}',"lr_schedule":"constant","compile":'${COMPILE:-true}',"reshard_after_forward":false,"probe_size_bytes":0,"compile_cache_dir":"'$cache'"}'
    cfg=$(with_overrides "$cfg")
    for round in $(seq 1 "$rounds"); do
        for health in 0 1; do
            local start=$SECONDS fr=0
            [ "$health" = 1 ] && fr=2000
            log="$out/logs/health-$health-$round.log"
            echo "\$ FSDP_TRAIN_HEALTH=$health TORCH_FR_BUFFER_SIZE=$fr torchrun --nproc-per-node 1 -m fsdp_train --config-json '$cfg'" >"$log"
            FSDP_TRAIN_HEALTH=$health TORCH_FR_BUFFER_SIZE=$fr timeout 400 "$py" -m torch.distributed.run --standalone \
                --nproc-per-node 1 -m fsdp_train --config-json "$cfg" >>"$log" 2>&1
            echo "(exit $?, $((SECONDS - start)) s)" >>"$log"
        done
    done
    rm -rf "$cache"
    "$py" - "$out"/logs/health-*.log <<'PY'
import sys
from collections import defaultdict
from fsdp_train.contract.events import Summary, parse_lines
from fsdp_train.contract.health_events import RankHealth
rates = defaultdict(list)
for path in sorted(sys.argv[1:]):
    events = list(parse_lines(open(path, errors="replace")))
    summary = next((e for e in events if isinstance(e, Summary) and e.rank == 0), None)
    reports = sum(isinstance(e, RankHealth) for e in events)
    mode = "on" if "/health-1-" in path else "off"
    rate = summary.tokens_per_second if summary is not None else None
    print(f"# health {mode:3} {path.rsplit('/', 1)[-1]}: {rate if rate is None else round(rate)} tokens/s, {reports} health reports")
    if rate:
        rates[mode].append(rate)
if rates["off"] and rates["on"]:
    off, on = sum(rates["off"]) / len(rates["off"]), sum(rates["on"]) / len(rates["on"])
    print(f"# health overhead: off {off:.0f} tokens/s, on {on:.0f} tokens/s: {100 * (off - on) / off:+.2f} % (positive: slower with health on)")
PY
}

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
round2-bf16)  # one GPU: bf16 levers on top of ours-final, a kernel profile, time to first step
    first_steps
    bench r2-bf16 1 280 --seq-len 2048 --batch 8 --warmup 3 --steps 6 \
        --recipes ours-final,ours-cudnn,ours-liger,ours-final@b16,ours-final@b24
    timeout 80 "$py" -m torch.distributed.run --standalone --nproc-per-node 1 bench/profile_step.py --batch 8 \
        --config '{"compile":true,"loss_chunk_tokens":4096,"reshard_after_forward":false}' >"$out/logs/profile.log" 2>&1
    grep -hE '^(\||GPU kernel| +[0-9.]+ ms)' "$out/logs/profile.log"
    ;;
round2-fp8)  # one GPU: fp8 recipes against bf16 on Qwen2.5-1.5B and on a Qwen2.5-7B-shaped model (8 layers)
    bench r2-fp8-1.5b 1 200 --seq-len 2048 --batch 8 --warmup 3 --steps 6 \
        --recipes ours-final,ours-fp8,ours-fp8-mlp,ours-fp8-rw-mlp
    OVERRIDES=$QWEN7B_8L bench r2-fp8-7b 1 300 --seq-len 2048 --batch 8 --warmup 3 --steps 6 \
        --recipes ours-final,ours-fp8,ours-fp8-mlp,ours-fp8-rw
    ;;
round2-final)  # one GPU: fp8 against bf16 (both models, seed recipe first), fp8's loss on text, batch, start
    bench r3-1.5b 1 150 --seq-len 2048 --batch 8 --warmup 3 --steps 6 \
        --recipes seed,ours-final,ours-fp8,ours-fp8-mlp,ours-fp8-rw-mlp,ours-final@b8a4
    OVERRIDES=$QWEN7B_8L bench r3-7b 1 150 --seq-len 2048 --batch 8 --warmup 3 --steps 6 \
        --recipes ours-final,ours-fp8,ours-fp8-mlp,ours-fp8-rw
    # Loss on real text: byte tokens of $TEXT (carried with the call), 300 steps, lr 3e-4 after 30 warm-up steps.
    OVERRIDES=$QWEN7B_8L bench r3-7b-text 1 200 --seq-len 2048 --batch 2 --warmup 0 --steps 300 \
        --recipes ours-final,ours-fp8 --text "$TEXT" --lr 3e-4 --lr-warmup 30
    first_steps
    ;;
round3-probe)  # one GPU: where the start goes (cold and warm cache), then each round-three bf16 lever alone and together
    startup_profile
    bench r3-levers 1 360 --seq-len 2048 --batch 8 --warmup 3 --steps 8 \
        --recipes ours-final,ours-rbf16,ours-clip,ours-gateup,ours-cdt,ours-levers,ours-levers@b16
    ;;
round3-verify)  # one GPU: time to first step, the training package before (BASE) and now, side by side; bf16 levers
    "$py" -c 'import sys, torch, os; print("dont_write_bytecode", sys.flags.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"), "torch pycache beside sources", os.path.isdir(os.path.join(os.path.dirname(torch.__file__), "__pycache__")), "writable", os.access(os.path.dirname(torch.__file__), os.W_OK))'
    starts before "${BASE:?BASE: the training package to compare with}/training" 2
    starts now "$PWD/training" 3
    starts before-again "$BASE/training" 1
    bench r3-verify 1 330 --seq-len 2048 --batch 8 --warmup 3 --steps 8 \
        --recipes ours-final,ours-cdt,ours-rbf16,ours-final,ours-cdt,ours-rbf16
    ;;
round3-text)  # one GPU: fp8's loss on text for Qwen2.5-1.5B against bf16, 300 steps (round two's run was cut off)
    bench r5-1.5b-text 1 420 --seq-len 2048 --batch 2 --warmup 0 --steps 300 \
        --recipes ours-final,ours-fp8 --text "${TEXT:?TEXT: a text file}" --lr 3e-4 --lr-warmup 30
    ;;
round2-verify)  # one GPU: fp8's loss on text for Qwen2.5-1.5B; the training function with precision auto vs bf16
    bench r4-1.5b-text 1 150 --seq-len 2048 --batch 2 --warmup 0 --steps 300 \
        --recipes ours-final,ours-fp8 --text "$TEXT" --lr 3e-4 --lr-warmup 30
    for precision in bf16 auto; do
        cfg='{"seq_len":2048,"batch_size_per_rank":8,"steps":10,"lr_schedule":"constant","compile":true,"reshard_after_forward":false,"probe_size_bytes":0,"precision":"'$precision'"}'
        echo "\$ torchrun --nproc-per-node 1 -m fsdp_train --config-json '$cfg'" | tee "$out/logs/fn-$precision.log"
        timeout 90 "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m fsdp_train --config-json "$cfg" \
            >>"$out/logs/fn-$precision.log" 2>&1
        echo "(exit $?)" >>"$out/logs/fn-$precision.log"
        grep -h '"kind":"summary"' "$out/logs/fn-$precision.log" | sed 's/^.*FSDP_EVENT //'
        tail -n 1 "$out/logs/fn-$precision.log"
    done
    ;;
round5-speed)  # one GPU: torchtitan beside the bundled function's round-five levers, window timing, one MFU formula
    round5_speed
    ;;
round6)  # one GPU: varlen attention's grouped heads, flight-recorder dumps, checkpoints with lasting host buffers, the mask
    timeout 90 "$py" bench/varlen_gqa.py 2>&1 | tee "$out/logs/varlen-gqa.log" | grep -v Warning
    timeout 90 "$py" -m torch.distributed.run --standalone --nproc-per-node 1 bench/fr_dump.py "$out/fr" \
        >"$out/logs/fr-dump.log" 2>&1
    tail -n 4 "$out/logs/fr-dump.log"
    CKPT_STEPS=${CKPT_STEPS:-100} CKPT_EVERY=${CKPT_EVERY:-30} round5_checkpoint
    round5_data_runs
    ;;
mask)  # one GPU: the document mask with compile on Python sources against random tokens (their Summary ratio)
    round5_data_runs
    ;;
round5-data)  # one GPU: the document mask with compile on a real corpus against random tokens; async checkpoints
    round5_data
    ;;
round5-checkpoint)  # one GPU: asynchronous checkpoints of the 1.5B run, blocked and total time
    round5_checkpoint
    ;;
lora)  # one GPU (~8 min): LoRA (training.lora, rank 16 on every linear layer of the blocks) beside full fine-tuning on
      # Qwen2.5-1.5B's shape, then on Qwen2.5-7B's shape (its real config, random weights) beside the peer, peft on
      # a plain Hugging Face model (peft-plain-ac), seq 2048. MFU counts LoRA's work as 4N + 6A + 12Lds.
    bench lora-1.5b 1 200 --seq-len 2048 --batch 1 --steps 20 --warmup 3 --recipes ours-final,ours-lora,ours-lora-ac
    OVERRIDES='{"hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"vocab_size":152064,"tie_word_embeddings":false}' \
        bench lora-7b 1 340 --seq-len 2048 --batch 1 --steps 20 --warmup 3 \
        --recipes peft-plain-ac,ours-lora-ac,ours-lora,ours-lora-ac@b2
    ;;
qlora)  # one GPU (~9 min): QLoRA (training.lora.quantizeBase nf4; torchao's wheel in WHEELS) beside LoRA and full
       # fine-tuning on Qwen2.5-1.5B's shape, then LoRA and QLoRA on Qwen2.5-7B's shape and QLoRA on Qwen2.5-14B's
       # (their real configs, random weights), seq 2048, batch 1; then the function itself with QLoRA on the 7B shape
    wheel_site /tmp/torchao-site torchao "${WHEELS:?WHEELS: torchao}"/torchao-*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/torchao-site"
    bench qlora-1.5b 1 150 --seq-len 2048 --batch 1 --steps 20 --warmup 3 --recipes ours-final,ours-lora-ac,ours-qlora-ac
    OVERRIDES=$QWEN7B bench qlora-7b 1 150 --seq-len 2048 --batch 1 --steps 20 --warmup 3 --recipes ours-lora-ac,ours-qlora-ac
    OVERRIDES=$QWEN14B bench qlora-14b 1 110 --seq-len 2048 --batch 1 --steps 20 --warmup 3 --recipes ours-qlora-ac
    OVERRIDES=$QWEN7B fn1 qlora-7b-function 120 '{"seq_len":2048,"batch_size_per_rank":1,"probe_size_bytes":0,"compile":true,"learning_rate":2e-5,"steps":10,"model":"Qwen/Qwen2.5-1.5B","model_init":"random","lora_rank":16,"lora_quantize_base":"nf4","activation_checkpointing":true,"loss_chunk_tokens":1024}'
    grep -h '^fsdp_train: conformance' "$out/logs/qlora-7b-function.log"
    ;;
qlora-check)  # one GPU (~5 min): LoRA and QLoRA without checkpointing beside full fine-tuning (1.5B shape); then the
             # function end to end with QLoRA on a saved model of the 1.5B shape (4 blocks): the base read from its
             # safetensors into NF4 shards, 20 steps, the adapter and merged export with their self-check
             # (EXPORT_ONLY=1: that part alone)
    wheel_site /tmp/torchao-site torchao "${WHEELS:?WHEELS: torchao}"/torchao-*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/torchao-site"
    [ -n "${EXPORT_ONLY:-}" ] || bench qlora-1.5b-noac 1 150 --seq-len 2048 --batch 1 --steps 20 --warmup 3 \
        --recipes ours-final,ours-lora,ours-qlora
    model=/tmp/fsdp-qlora-base export=/tmp/fsdp-qlora-export
    rm -rf "$model" "$export"
    "$py" -c 'import sys, torch; from transformers import Qwen2Config, Qwen2ForCausalLM; torch.manual_seed(0); Qwen2ForCausalLM(Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=4, num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)).to(torch.bfloat16).save_pretrained(sys.argv[1])' "$model"
    fn1 qlora-export 240 '{"seq_len":2048,"batch_size_per_rank":1,"probe_size_bytes":0,"compile":true,"learning_rate":2e-4,"steps":20,"model":"'$model'","model_init":"pretrained","lora_rank":16,"lora_quantize_base":"nf4","activation_checkpointing":true,"loss_chunk_tokens":1024,"output_path":"'$export'","export_merged":true}'
    grep -h '"kind":"export"' "$out/logs/qlora-export.log" | sed 's/^.*FSDP_EVENT //'
    ls -la "$export" "$export/merged" 2>&1 | grep -v '^total'
    "$py" -c 'import sys; from safetensors import safe_open; f = safe_open(sys.argv[1], "pt"); k = list(f.keys()); print(f"# adapter file: {len(k)} tensors, {sorted({f.get_slice(n).get_dtype() for n in k})}")' \
        "$export/adapter_model.safetensors"
    rm -rf "$model" "$export"
    ;;
conformance)  # one GPU (~4 min): the training function's start-up check (its two losses and its seconds) on the
             # Qwen2.5-1.5B shape, full fine-tuning, and on the Qwen2.5-7B shape with LoRA and checkpointing
    base='"seq_len":2048,"batch_size_per_rank":1,"probe_size_bytes":0,"compile":true,"learning_rate":2e-5,"steps":10,"model":"Qwen/Qwen2.5-1.5B","model_init":"random"'
    fn1 conformance-1.5b 200 "{$base}"
    grep -h '^fsdp_train: conformance' "$out/logs/conformance-1.5b.log"
    OVERRIDES='{"hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"vocab_size":152064,"tie_word_embeddings":false}' \
        fn1 conformance-7b-lora 300 "{$base,\"lora_rank\":16,\"activation_checkpointing\":true,\"loss_chunk_tokens\":1024}"
    grep -h '^fsdp_train: conformance' "$out/logs/conformance-7b-lora.log"
    ;;
step-times)  # one GPU: the step events' times and rates against the wall clock, around checkpoints and the last step
    cfg='{"seq_len":2048,"batch_size_per_rank":8,"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":2e-5,"steps":'${STEPS:-40}',"model":"Qwen/Qwen2.5-1.5B","model_init":"random","checkpoint_path":"/tmp/fsdp-step-times","checkpoint_interval":10}'
    cfg=$(with_overrides "$cfg")
    rm -rf /tmp/fsdp-step-times
    echo "\$ python bench/step_times.py --log $out/logs/step-times.log -- torchrun --nproc-per-node 1 -m fsdp_train --config-json '$cfg'"
    timeout "${STEP_TIMES_LIMIT:-300}" "$py" bench/step_times.py --log "$out/logs/step-times.log" -- \
        "$py" -m torch.distributed.run --standalone --nproc-per-node 1 -m fsdp_train --config-json "$cfg"
    rm -rf /tmp/fsdp-step-times
    echo "\$ python -m pytest --noconftest -q tests/unit/training/test_steps.py"
    timeout 120 "$py" -m pytest --noconftest -q -p no:cacheprovider tests/unit/training/test_steps.py 2>&1 | tail -n 3
    ;;
notice)  # one GPU: a node's notice during the 1.5B run (fsdp_train.watch.notice): notice -> saved, blocked and total save
    notice_run
    ;;
headline)  # one GPU, one call: the three figures of docs/performance.md's headline, side by side; PRECISION=fp8: every
           # row in fp8 (torchtitan's float8 converter, ours-r12-fp8, the function with precision fp8 and
           # lossChunkTokens 0; torchao's wheel in WHEELS)
    recipes=ours-r5 titan_args=()
    if [ "${PRECISION:-bf16}" = fp8 ]; then
        wheel_site /tmp/torchao-site torchao "${WHEELS:?WHEELS: torchtitan, torchao}"/torchao-*.whl || exit 1
        export PYTHONPATH="$PYTHONPATH:/tmp/torchao-site" R5_EXTRA=',"precision":"fp8","loss_chunk_tokens":0'
        recipes=ours-r12-fp8 titan_args=(--model.converters quantize.linear.float8 --quantize.linear.float8.filter_fqns output)
    fi
    titan titan-native 170 --training.steps 30 --x.warmup 10 "${titan_args[@]}"
    bench headline-speed 1 "${HEADLINE_BENCH_LIMIT:-240}" --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window --recipes "${RECIPES:-$recipes}"
    # the mask's ratio on FlashAttention-4 where FA4SITE gives it (round ten), else on torch's varlen kernel
    ( [ -z "${FA4SITE:-}" ] || fa4_site /tmp/fa4site; round5_data_runs )
    CKPT_STEPS=${CKPT_STEPS:-60} CKPT_EVERY=${CKPT_EVERY:-30} round5_checkpoint
    ;;
round8)  # one GPU, one call: the document mask's attention kernels, then torchtitan beside round eight's recipes
    echo "\$ python bench/doc_attention.py"
    timeout 240 "$py" bench/doc_attention.py 2>&1 | tee "$out/logs/doc-attention.log" | grep -v Warning
    titan titan-native 170 --training.steps 30 --x.warmup 10
    bench round8-speed 1 300 --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window \
        --recipes "${RECIPES:-ours-r5,ours-r8,ours-r8-nofsdp}"
    ;;
round9)  # one GPU, one call: torchtitan beside round eight's best recipes and round nine's (CUDA graphs, whole stack)
    titan titan-native 170 --training.steps 30 --x.warmup 10
    bench round9-speed 1 420 --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window \
        --recipes "${RECIPES:-ours-r8,ours-r9-graphs}"
    # the stack compiled whole (ours-r9-whole) in its own invocation: its compile alone outlasted 200 s once
    [ -n "${WHOLE:-}" ] && bench round9-whole 1 400 --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window \
        --recipes ours-r9-whole
    ;;
round11)  # one GPU, one call: torchtitan beside ours-r9-graphs and round eleven's losses (Liger's fused linear
          # cross-entropy, torchtitan's way); limits: 170 s + 360 s and ~30 s around them, inside a 600 s call
    liger_site /tmp/liger-site  # a failed install costs ours-r11-flce's row only
    titan titan-native 170 --training.steps 30 --x.warmup 10
    bench round11-speed 1 360 --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window \
        --recipes "${RECIPES:-ours-r9-graphs,ours-r11-titanloss,ours-r11-flce}"
    # each recipe's step-1 loss (same weights and tokens: the losses should agree to about 1e-3)
    [ -f "$out/logs/round11-speed.json" ] && "$py" -c 'import json, sys; [print("# step-1 loss", r["recipe"], "%.6f" % r["losses"][0]) for r in json.load(open(sys.argv[1]))]' \
        "$out/logs/round11-speed.json"
    ;;
round12)  # one GPU, one call (~7 min): torchtitan in bf16 and with its fp8 converter (torchao's float8, the lm_head
          # left in bf16 as ours is; NO_TITAN=1 skips both), then the training function itself in bf16 and with
          # precision fp8 for each SHAPES entry (SEQxBATCH, default 2048x8), lossChunkTokens 0, 30 steps.
          # WHEELS=DIR holds torchtitan's wheels and torchao's.
    wheel_site /tmp/torchao-site torchao "${WHEELS:?WHEELS: torchtitan, torchao}"/torchao-*.whl || exit 1
    if [ -z "${NO_TITAN:-}" ]; then
        titan titan-bf16 170 --training.steps 30 --x.warmup 10
        titan titan-fp8 170 --training.steps 30 --x.warmup 10 --model.converters quantize.linear.float8 \
            --quantize.linear.float8.filter_fqns output
    fi
    for shape in ${SHAPES:-2048x8}; do
        base='"seq_len":'${shape%x*}',"batch_size_per_rank":'${shape#*x}',"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":2e-5,"model":"Qwen/Qwen2.5-1.5B","model_init":"random","loss_chunk_tokens":0'
        for precision in bf16 fp8; do
            PYTHONPATH="$PYTHONPATH:/tmp/torchao-site" fn1 "$precision-$shape" 150 "{$base,\"steps\":${STEPS:-30},\"precision\":\"$precision\"}"
        done
        ratio "bf16-$shape" "fp8-$shape"
    done
    ;;
round12-loss)  # one GPU (~3 min): bf16 against fp8 on Python sources over 50 steps, lossChunkTokens 0: the loss step
               # by step and the means of the last steps. WHEELS=DIR holds torchao's wheel.
    wheel_site /tmp/torchao-site torchao "${WHEELS:?WHEELS: torchao}"/torchao-*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/torchao-site"
    assets=${ASSETS:-/tmp/fsdp-python-sources}
    "$py" bench/data_pipeline.py python-sources "$assets" >"$out/logs/assets.log" 2>&1 || { tail -n 5 "$out/logs/assets.log"; exit 1; }
    base='"seq_len":2048,"batch_size_per_rank":8,"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":'${LR:-3e-4}',"warmup_steps":10,"model":"Qwen/Qwen2.5-1.5B","model_init":"random","loss_chunk_tokens":0,"shuffle_seed":1,"data":"'$assets/corpus'","tokenizer":"'$assets/tokenizer'"'
    for precision in bf16 fp8; do
        fn1 "text-$precision" 170 "{$base,\"steps\":${STEPS:-50},\"precision\":\"$precision\"}"
    done
    "$py" - "$out/logs/text-bf16.log" "$out/logs/text-fp8.log" <<'PY'
import json, sys
def losses(path):
    return [json.loads(l.split("FSDP_EVENT ", 1)[1])["loss"] for l in open(path) if '"kind":"step"' in l]
bf16, fp8 = (losses(p) for p in sys.argv[1:3])
print("# step  bf16 loss  fp8 loss  fp8/bf16")
for i, (a, b) in enumerate(zip(bf16, fp8), 1):
    if i <= 5 or i % 5 == 0:
        print(f"# {i:4d}  {a:9.4f}  {b:8.4f}  {b / a:.4f}")
if bf16 and len(bf16) == len(fp8):
    print(f"# largest step gap: {max(abs(b / a - 1) for a, b in zip(bf16, fp8)) * 100:.2f} %")
for k in (10, 20):
    if len(bf16) >= k and len(fp8) >= k:
        a, b = sum(bf16[-k:]) / k, sum(fp8[-k:]) / k
        print(f"# mean of the last {k}: bf16 {a:.4f}, fp8 {b:.4f}: {100 * (b - a) / a:+.2f} %")
PY
    ratio text-bf16 text-fp8
    ;;
round12-bench)  # one GPU (~5 min): round twelve's bench recipes in one invocation (window timing): round eleven's FSDP
                # path in bf16, with fp8, with fp8 and FSDP's fp8 all-gather. WHEELS=DIR holds torchao's wheel.
    wheel_site /tmp/torchao-site torchao "${WHEELS:?WHEELS: torchao}"/torchao-*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/torchao-site"
    bench round12-speed 1 500 --seq-len 2048 --batch 8 --warmup 6 --steps 20 --timing window \
        --recipes "${RECIPES:-ours-r12-fp8,ours-r12-fp8-ag,ours-r11-fsdp-titanloss}"
    ;;
round11-loss)  # one GPU: the training function itself with each loss: chunks of 4096 tokens (the default), no chunks
               # and the compiled cross-entropy (0 with compile on), one chunk of the whole batch (16384); with
               # BASELINE=DIR (an earlier commit's training package: `git archive REV training | tar -x -C DIR`) each
               # run on that package first, interleaved
    base='"seq_len":2048,"batch_size_per_rank":8,"probe_size_bytes":0,"compile":true,"reshard_after_forward":false,"learning_rate":2e-5,"model":"Qwen/Qwen2.5-1.5B","model_init":"random"'
    for chunk in ${CHUNKS:-4096 0 16384}; do
        cfg="{$base,\"steps\":${STEPS:-30},\"loss_chunk_tokens\":$chunk}"
        [ -n "${BASELINE:-}" ] && PYTHONPATH="$BASELINE/training" fn1 "baseline-loss-$chunk" 150 "$cfg"
        fn1 "loss-$chunk" 150 "$cfg"
    done
    ;;
round10)  # one GPU: FlashAttention-4 for the document mask (fsdp_train.models.fa4): attention table, the mask's ratio
    site=/tmp/fa4site
    fa4_site "$site" || exit 1
    echo "\$ python bench/doc_attention.py"
    timeout 240 "$py" bench/doc_attention.py 2>&1 | tee "$out/logs/doc-attention.log" | grep -v Warning
    for steps in 30 ${LONG_STEPS:-200}; do
        (out=$out/fa4-$steps && mkdir -p "$out/logs" && STEPS=$steps MASK_LIMIT=300 round5_data_runs)
    done
    # the same pair on torch's varlen kernel (the package off the path), last: a cut-off call loses only this
    PYTHONPATH=${PYTHONPATH%%:$site*} && (out=$out/torch-30 && mkdir -p "$out/logs" && STEPS=30 round5_data_runs)
    ;;
health)  # one GPU: spec.health's overhead, off and on side by side
    health_overhead
    ;;
round5)  # both halves in one call (about 15 minutes)
    round5_speed
    round5_data
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
