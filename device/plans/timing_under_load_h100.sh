# Timing under load, one H100 with 16 cores (~24 min held): the set idle, in a cold batch with 40 programs compiling,
# warm, and (scenario 4) while a JAX sampler generates on the same GPU (docs/LOG.md, "gated timing": its
# timing-under-load paragraph).
# First call: `source device/setup.sh && export KEVIN_SKIP_BUILD=1 && bash device/background.sh plan <this file>`,
# carry [".whl"]; then keep one `bash device/background.sh wait 560` call in flight until "all done".
timeout 1800 python3 benchmarks/timing_under_load.py --with-sampler --out $OUT/timing_under_load.json
