#!/bin/sh
# Issue 46's measure: `flare run` (no flags) against `llama-server -t <cores> -np 16` on the same
# GGUF, alternating peer, flare, peer, flare per load, with distinct prompts in every run
# (bench/serving.py --peer-url --repeats; it starts flare itself and prints flare/peer ratios per
# load with their range). Take it on an idle machine; the load average is printed at both ends.
#
# Run from the repository root:
#   bench/vs_llama_server.sh /path/to/llama.cpp/build/bin/llama-server [FLARE_PORT] [LLAMA_PORT] [REPEATS] [LOADS]
# (defaults 18460 18461 2 1,16,mixed; docs/server.md shows how to build llama-server.)
set -eu
LLAMA_SERVER=${1:?usage: bench/vs_llama_server.sh LLAMA_SERVER [FLARE_PORT] [LLAMA_PORT] [REPEATS] [LOADS]}
FLARE_PORT=${2:-18460}
LLAMA_PORT=${3:-18461}
REPEATS=${4:-2}
LOADS=${5:-1,16,mixed}
PY=${PYTHON:-.venv/bin/python}
GGUF=$($PY -c "from helios.engine.model import default_model_path; print(default_model_path())")

"$LLAMA_SERVER" -m "$GGUF" -t "$(nproc)" --parallel 16 -c 16384 --port "$LLAMA_PORT" >/dev/null 2>&1 &
llama=$!
trap 'kill $llama 2>/dev/null || true' EXIT INT TERM
until curl -sf "http://127.0.0.1:$LLAMA_PORT/v1/models" >/dev/null; do sleep 1; done
$PY bench/serving.py --port "$FLARE_PORT" --peer-url "http://127.0.0.1:$LLAMA_PORT/v1" --repeats "$REPEATS" --loads "$LOADS"
