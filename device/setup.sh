# Sourced by the device scripts: the carried ml_collections wheel (the GPU image lacks it) and the native extension.
# Both steps run once: parallel jobs of a plan (device/gpus.sh) must not reinstall a package another job is
# importing, nor rebuild the extension it has loaded; KEVIN_SKIP_BUILD=1 skips the build (done by an earlier call).
if [ ! -d /tmp/site/ml_collections ] && ls .whl/ml_collections*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/ml_collections*.whl
fi
[ -d /tmp/site/ml_collections ] && export PYTHONPATH=/tmp/site
if [ -z "${KEVIN_SKIP_BUILD:-}" ]; then
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
