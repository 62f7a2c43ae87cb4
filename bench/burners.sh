#!/bin/sh
# `flare run` and llama-server at 1 and 16 streams while another process competes for the cores
# (issue 46): no burner, then a single-threaded busy loop at the lowest priority
# (`nice -n 19 sh -c 'while :; do :; done'`), then a multi-threaded numpy matrix product at the
# lowest priority (OpenBLAS, one thread per core). Both servers run throughout; each condition runs
# bench/serving.py --loads 1,16 against both (peer first, then flare), with the burner started 3 s
# before and killed after.
#
# Run from the repository root:
#   bench/burners.sh /path/to/llama.cpp/build/bin/llama-server [FLARE_PORT] [LLAMA_PORT] [REPEATS]
# (docs/server.md shows how to build llama-server; the GGUF is the embedded SmolLM2 Q4_1.)
set -eu
LLAMA_SERVER=${1:?usage: bench/burners.sh LLAMA_SERVER [FLARE_PORT] [LLAMA_PORT] [REPEATS]}
FLARE_PORT=${2:-18460}
LLAMA_PORT=${3:-18461}
REPEATS=${4:-1}
PY=${PYTHON:-.venv/bin/python}
CORES=$(nproc)
GGUF=$($PY -c "from helios.engine.model import default_model_path; print(default_model_path())")
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

"$LLAMA_SERVER" -m "$GGUF" -t "$CORES" --parallel 16 -c 16384 --port "$LLAMA_PORT" >/dev/null 2>&1 &
pids="$pids $!"
$PY -m helios.cli run --port "$FLARE_PORT" >/dev/null 2>&1 &
pids="$pids $!"
for url in "http://127.0.0.1:$LLAMA_PORT/v1/models" "http://127.0.0.1:$FLARE_PORT/v1/models"; do
  until curl -sf "$url" >/dev/null; do sleep 2; done
done

first=0
run() {  # $1: label; the burner (if any) is already running
  echo "== $1 (load average $(cut -d' ' -f1 /proc/loadavg))"
  # Each condition sends new prompts: the servers keep running, and llama-server's slots would
  # otherwise answer a later condition's prompts from their prompt caches.
  $PY bench/serving.py --flare-url "http://127.0.0.1:$FLARE_PORT/v1" --peer-url "http://127.0.0.1:$LLAMA_PORT/v1" \
    --loads 1,16 --repeats "$REPEATS" --first-repeat "$first" | grep -E '^\[|^flare/peer|^load'
  first=$((first + REPEATS))
}

run "no burner"
nice -n 19 sh -c 'while :; do :; done' &
burner=$!
sleep 3
run "one single-threaded burner at nice 19"
kill "$burner"
nice -n 19 "$PY" -c "
import numpy as np
a = np.random.rand(2048, 2048)
while True:
    a @ a
" &
burner=$!
sleep 3
run "a multi-threaded numpy burner at nice 19 (OpenBLAS, $CORES threads)"
kill "$burner"
