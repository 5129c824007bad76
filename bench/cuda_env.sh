# Sourced by the bench/cuda_*.sh scripts on the GPU machine (run from the repository root): $OUT
# (default /tmp/out) made, the host libraries carried in .devlibs on the loader's path, Python
# unbuffered, and the wheels carried in .whl (gguf, pyyaml, tqdm) installed under /tmp/site, one at
# a time: .whl may hold a compiled wheel for several Python versions, and pip refuses the others.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.devlibs:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
for whl in .whl/*.whl; do
  [ -f "$whl" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$whl" 2>/dev/null
done
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
true
