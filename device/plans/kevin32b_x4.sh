#!/usr/bin/env bash
# Kevin-32B's RL step at QwQ-32B's full size on one node of 4 x H100 (80 GB each, 512 GB host RAM, 235 GB disk), the
# optimiser state in host memory (configs/kevin32b.py, layout h100x4), with the real KernelBench tasks and the real
# cuda_eval sharing the GPUs. Random weights write no parseable kernel: every answer gets a format verdict, and every
# phase still runs.
#
#   bash device/plans/kevin32b_x4.sh            # from the repo root; results in $OUT (default /tmp/out)
#   (or in the background: bash device/background.sh start "bash device/plans/kevin32b_x4.sh")
#
# Environment: KB_DIR (KernelBench checkout, default .carry/kernelbench), HF_DIR (a QwQ-32B-format HF directory;
# written with random bf16 weights by scripts/write_hf_checkpoint.py when it does not exist), WORK (run dirs),
# SKIP_FULL=1 / SKIP_RESUME=1 to leave a stage out.
#
# Stages, each appending its outcome to $OUT/summary.txt as it ends:
#   1. the HF directory (65.5 GB of bf16 safetensors shards + QwQ's config, tokenizer and chat template).
#   2. full depth: `python launch/train.py --config=configs/kevin32b.py` capped to fit the machine's time (CAPS
#      below: 2 steps x 2 tasks x 4 trajectories x 2 turns, 1024-token responses, each step both gradient updates
#      of its batch), no checkpoint: the full state (393 GB: float32 master + AdamW moments) fits neither the 235 GB
#      disk next to the 65.5 GB HF directory nor /dev/shm next to the 393 GB it shadows in RAM. Measures per phase
#      (sampling tokens/s, evaluation, gradients MFU, the host optimiser step), peak HBM per GPU, host RAM.
#   3. kill and resume, the same code paths at an eighth of the depth (shape qwq_32b_depth8: QwQ-32B's layers,
#      vocabulary and sharding, 8 of 64 layers, 5.47B parameters; its checkpoint is 65.7 GB): run A checkpoints
#      step 1 into /dev/shm and is SIGKILLed while writing step 2; run B resumes from step 1 (the master weights and
#      moments restored straight into host memory), redoes step 2, and must produce the same step-2 trajectories
#      (tokens) and the same update statistics (loss, gradient norm, update norm, exact) as A. Measures the
#      checkpoint's save and restore times (disk-free: /dev/shm).
#
# Budget on 4 x H100 (plan, before measurement): setup 1 min; HF directory 3-5 min (written once, then reused);
# stage 2 ~12 min (start and load ~3, compiles ~5 with an empty cache, 2 steps ~4); stage 3 ~9 min (A: init,
# compiles, 2 steps; B: restore and 1 step, compiles from the persistent cache); summary <1 min. Total ~25-30 min.
# Memory (docs/LOG.md, the memory plan with offload): stage 2 holds 393 GB of pinned host RAM and ~33 GB per GPU of
# weights + gradients, the update's peak for rows of 4-8k tokens well under the JAX pool (0.9 x 80 GB); stage 3
# holds 65.7 GB pinned + up to 3 checkpoints of 65.7 GB in /dev/shm (197 GB; checked before the run).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
KB_DIR=${KB_DIR:-.carry/kernelbench}
HF_DIR=${HF_DIR:-/tmp/qwq32b_random}
WORK=${WORK:-/tmp/kevin32b}
SHM=${SHM:-/dev/shm/kevin32b_ckpt}
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
note() { echo "$(date +%T) $*" | tee -a "$SUMMARY"; }
T0=$SECONDS

# --- setup: the native extension; one compilation cache for every stage (the resumed run reuses run A's programs)
source device/setup.sh
export KEVIN_SKIP_BUILD=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/kevin_jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
[ -d "$KB_DIR" ] || { note "no KernelBench at $KB_DIR (cp -r ../shared/kernelbench .carry/kernelbench)"; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$SUMMARY"
free -g | tee -a "$SUMMARY"; df -h / /dev/shm | tee -a "$SUMMARY"

# Memory seen from outside the process (cuda_eval's workers included), one line per second per GPU.
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader -lms 1000 > "$OUT/gpu_memory.csv" &
SMI_PID=$!
( while sleep 2; do echo "$(date +%s) $(free -b | awk '/Mem:/ {print $3}')"; done ) > "$OUT/host_memory.txt" &
FREE_PID=$!
trap 'kill $SMI_PID $FREE_PID 2>/dev/null' EXIT

# Capped so that the whole plan fits half an hour of the node; each step still runs both updates of its batch, and
# rl.skip_zero_advantage=False keeps the zero-advantage samples (random weights: every reward is 0) in the update.
# Prompts keep the h100x4 layout's 4096-token budget (KernelBench level 1-2 first-turn prompts: ~1.1k-1.5k tokens).
CAPS="--config.total_steps=2 --config.rl.tasks_per_step=2 --config.env.num_trajectories=4 --config.env.num_turns=2
  --config.env.max_response_tokens=1024 --config.rl.skip_zero_advantage=False --config.holdout.every_steps=0
  --config.holdout.at_end=False --config.log.progress=False --config.tasks.kernelbench_dir=$KB_DIR"

# --- 1. the HF directory
if [ ! -f "$HF_DIR/model.safetensors.index.json" ]; then
  T=$SECONDS
  python3 scripts/write_hf_checkpoint.py --shape qwq_32b --out "$HF_DIR" > "$OUT/write_hf.log" 2>&1 \
    || { tail -20 "$OUT/write_hf.log"; note "writing the HF directory failed"; exit 1; }
  note "stage 1: HF directory written in $((SECONDS - T)) s ($(du -sh "$HF_DIR" | cut -f1))"
else
  note "stage 1: reusing $HF_DIR"
fi

# --- 2. full depth, no checkpoint
if [ -z "${SKIP_FULL:-}" ]; then
  T=$SECONDS
  rm -rf "$WORK/full"
  timeout 1500 python3 launch/train.py --config=configs/kevin32b.py --workdir="$WORK/full" \
    --config.model.hf_checkpoint="$HF_DIR" $CAPS --config.ckpt.enabled=False > "$OUT/full.log" 2>&1
  rc=$?
  cp "$WORK/full/metrics.jsonl" "$OUT/full_metrics.jsonl" 2>/dev/null
  note "stage 2 (full depth): rc=$rc in $((SECONDS - T)) s"
  grep -E "layout|train state:|step [0-9]+/|update [01]:" "$OUT/full.log" | tee -a "$SUMMARY"
fi

# --- 3. kill and resume at an eighth of the depth
if [ -z "${SKIP_RESUME:-}" ]; then
  rm -rf "$WORK/depth8" "$SHM"
  free_shm=$(df -B1 --output=avail /dev/shm | tail -1)
  if [ "$free_shm" -lt $((200 * 1000 ** 3)) ]; then
    SHM=$WORK/depth8_checkpoints
    note "/dev/shm has $((free_shm / 1000 ** 3)) GB free (< 200): checkpoints on disk at $SHM instead"
  fi
  RESUME="--config.model.shape=qwq_32b_depth8 --config.tokenizer.path=$HF_DIR $CAPS --config.ckpt.dir=$SHM
    --config.ckpt.max_to_keep=1"
  T=$SECONDS
  # run A: launch/train.py's own main, SIGKILLed while step 2's checkpoint is being written
  timeout 1200 python3 tests/kevin_jax/kill_at_phase.py --kill_at_phase=checkpoint --kill_at_step=2 \
    --config=configs/kevin32b.py --workdir="$WORK/depth8" $RESUME > "$OUT/resume_A.log" 2>&1
  rc=$?
  note "stage 3 run A: rc=$rc (137 = SIGKILLed as asked) in $((SECONDS - T)) s"
  cp "$WORK/depth8/trajectories/step_000002.jsonl" "$WORK/step2_killed.jsonl" 2>/dev/null
  T=$SECONDS
  timeout 1200 python3 launch/train.py --config=configs/kevin32b.py --workdir="$WORK/depth8" $RESUME \
    > "$OUT/resume_B.log" 2>&1
  rc=$?
  note "stage 3 run B (resumed): rc=$rc in $((SECONDS - T)) s"
  grep -E "checkpoint restored|checkpoint was written|last checkpoint written|train state:" \
    "$OUT/resume_A.log" "$OUT/resume_B.log" | tee -a "$SUMMARY"
  python3 - "$OUT/resume_A.log" "$OUT/resume_B.log" "$WORK/step2_killed.jsonl" \
      "$WORK/depth8/trajectories/step_000002.jsonl" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, re, sys
log_a, log_b, traj_a, traj_b = sys.argv[1:5]
pattern = re.compile(r"step 2 update (\d): (loss .*?); gradients")
updates = lambda path: dict(pattern.findall(open(path).read()))
a, b = updates(log_a), updates(log_b)
ok = bool(a) and all(b.get(u) == v for u, v in a.items())
print(f"resume check, step 2 updates: killed run {a or 'none'}; resumed run {b or 'none'} -> "
      f"{'identical' if ok else 'DIFFERENT'}")
def tokens(path):
    rows = [json.loads(line) for line in open(path)]
    return sorted((r["task_id"], r["traj_index"], [(t["prompt_tokens"], t["response_tokens"]) for t in r["turns"]])
                  for r in rows)
try:
    same = tokens(traj_a) == tokens(traj_b)
    print(f"resume check, step 2 trajectories (prompt and response tokens): {'identical' if same else 'DIFFERENT'}")
except OSError as e:
    same = False
    print(f"resume check, step 2 trajectories: missing ({e})")
print("RESUME CHECK " + ("PASSED" if ok and same else "FAILED"))
EOF
  cp "$WORK/depth8/metrics.jsonl" "$OUT/resume_metrics.jsonl" 2>/dev/null
  rm -rf "$SHM"
fi

note "plan done in $((SECONDS - T0)) s"
