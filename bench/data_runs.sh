#!/usr/bin/env bash
# Data pipeline on a GPU host (issue: user data in, a model out): tokens/s/GPU with the JSONL corpus
# against random tokens, same model shape and settings; and the time to load the safetensors.
#
#   bash bench/data_runs.sh OUT [GPUS] [TOKENS]
#
# OUT gets assets.log, random.log, data.log, data-causal.log, summary.md and load.log. The data run
# also exports its model and self-checks the export (the Export event in data.log: AutoTokenizer and
# AutoModelForCausalLM on the exported directory against the training run's tokenizer and loss). Needs torch, transformers,
# tokenizers, pyarrow, safetensors (no Ray: the same loop runs under torchrun).
set -uo pipefail
out=${1:?OUT directory}
gpus=${2:-1}
tokens=${3:-200000000}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/training${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
assets=${ASSETS:-/tmp/fsdp-data-bench}
mkdir -p "$out"

python3 "$here/bench/data_pipeline.py" assets "$assets" --tokens "$tokens" 2>&1 | tee "$out/assets.log"

common='"seq_len":2048,"batch_size_per_rank":8,"steps":'"${STEPS:-30}"',"probe_size_bytes":0,"compile":'"${COMPILE:-false}"',"learning_rate":2e-5'
run() {  # name, extra config
  torchrun --nproc-per-node "$gpus" -m fsdp_train --config-json "{$common,$2}" >"$out/$1.log" 2>&1
  echo "$1: exit $?"; grep -E "^fsdp_train: data" "$out/$1.log" || true
}
run random '"model":"Qwen/Qwen2.5-1.5B","model_init":"random"'
# The data runs: attention kept inside documents (the default: varlen flash attention over the document
# bounds, fsdp_train.models.attention), and plain causal.
data='"model":"'"$assets/model"'","model_init":"pretrained","data":"'"$assets/corpus"'","shuffle_seed":1'
run data "$data,\"document_mask\":true,\"output_path\":\"${EXPORT_DIR:-$assets/export}\""
run data-causal "$data,\"document_mask\":false"
python3 "$here/bench/summarize_events.py" "$out/random.log" "$out/data.log" "$out/data-causal.log" | tee "$out/summary.md"
grep -ho '"kind":"export".*' "$out/data.log" | tee -a "$out/summary.md"
[ -n "${SKIP_LOAD:-}" ] && exit 0
# Last: the load timings (the training runs above matter more when time is short).
torchrun --nproc-per-node "$gpus" "$here/bench/data_pipeline.py" load "$assets/model" 2>&1 | grep -v Warning | tee "$out/load.log"
