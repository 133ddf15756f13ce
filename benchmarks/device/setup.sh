# Sourced by the device scripts: the carried ml_collections wheel (the GPU image lacks it) and the native extension.
if ls .whl/ml_collections*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/ml_collections*.whl && export PYTHONPATH=/tmp/site
fi
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
