#!/usr/bin/env bash
# Kevin-32B at QwQ-32B's full size on one node of 4 GPUs (4 x H100 80 GB, 512 GB host RAM, 235 GB disk; the layout
# comes from configs/kevin32b.py), the optimiser state in host memory, the real KernelBench tasks and the real
# cuda_eval sharing the GPUs. With random weights (the checkpoint stage writes them) no answer parses as a kernel:
# every answer gets a format verdict and every phase still runs.
#   bash runs/kevin32b.sh                          # checkpoint sampler steps resume, in this order
#   bash runs/kevin32b.sh steps resume             # some of them
#   bash runs/kevin32b.sh checkpoint sampling replay update    # the full-shape phases, one stage each (~25 min max)
# Stages:
#   checkpoint  a QwQ-32B-format HF directory with random bf16 weights (scripts/write_hf_checkpoint.py: 14 shards,
#               65.5 GB, QwQ's config and tokenizer with its chat template); skipped when HF_DIR already holds one.
#   sampler     the tensor-parallel sampler at 32B over the node's GPUs: decode tokens/s at B = 32, 64, 128 against
#               the bandwidth roofline, prefill tokens/s (benchmarks/sampler.py --gpus N).
#   steps       `python launch/train.py --config=configs/kevin32b.py` at full depth, capped to fit half an hour (CAPS
#               below: 2 steps x 2 tasks x 4 trajectories x 2 turns, 1024-token responses, each step both gradient
#               updates of its batch), no checkpoint: the full state (393 GB: float32 master + AdamW moments) fits
#               neither the 235 GB disk next to the 65.5 GB HF directory nor /dev/shm next to the 393 GB it holds in
#               RAM. Logs per phase: sampling tokens/s, evaluation, gradient MFU, the host optimiser step, peak HBM
#               per GPU, host RAM.
#   resume      kill and resume through the same code paths at an eighth of the depth (shape qwq_32b_depth8: QwQ-32B's
#               layers, vocabulary and sharding, 8 of 64 layers, 5.47B parameters, a 65.7 GB checkpoint): run A
#               checkpoints step 1 into /dev/shm and is SIGKILLed while writing step 2; run B resumes from step 1 (the
#               master weights and moments restored straight into host memory), redoes step 2, and must produce the
#               same step-2 trajectories (tokens) and update statistics (loss, gradient norm, update norm) as A.
#   sampling    one full sampler round at 32B in the replay mode (rl.replay=builtin: NOT training; the sampler
#               ignores its stop tokens, the evaluator judges replayed real answers of the built-in tasks in place of
#               the sampled ones, kevin_jax/env/replay.py): 4 tasks x 16 trajectories = 64 live sequences in one
#               sampler call, every response SAMPLING_TOKENS (16384) long; then their 64 replayed kernels evaluated
#               and one update over the 64 full-length samples. A phase table (time, tokens/s, MFU) from metrics.jsonl.
#   replay      evaluation of 128 replayed kernels beside sampling: 4 tasks x 16 trajectories x 2 turns, two
#               pipeline groups of 32 sequences (one samples while the other's kernels are built, checked and timed
#               on the GPUs; the second turn's prompts carry the first's verdicts), responses REPLAY_TOKENS (4096)
#               long, one update over the 128 samples. 4 tasks rather than 8 keep the distinct kernels to build
#               (~8 per task; a repeated answer is a build-cache hit, still run and timed) within the stage's time
#               on a node that builds one at a time. The phase table adds the kernels compiled and correct.
#   update      the update's gradient step at a full batch's shape (benchmarks/update_mfu.py): 512 samples of
#               prompts 1-4k and responses 2-16k tokens, QwQ-32B's shape with random weights in the trainer's layout,
#               the bucketed rows (a row length per micro-batch) and the old one-row-length layout; every shape
#               compiled once, then one micro-batch per shape timed; the batch's gradient time and MFU projected from
#               those rates (the host optimiser step is the steps stage's). Prints the padding table and the timing
#               table.
# Knobs: HF_DIR (/tmp/qwq32b_random), KB_DIR (a KernelBench checkout, required for steps and resume), WORK
# (/tmp/kevin32b), OUT (workdirs/kevin32b: logs, metrics, summary.txt), SHM (/dev/shm/kevin32b_ckpt), and a time
# limit per stage in seconds: CHECKPOINT_S, SAMPLER_S, STEPS_S, RESUME_S, SAMPLING_S, REPLAY_S, UPDATE_S (1500 each
# for the last three); SAMPLING_TOKENS, REPLAY_TOKENS.
# Each stage appends its outcome to $OUT/summary.txt as it ends.
# Measured on 4 x H100 and 4 x H200 (docs/LOG.md, "Kevin-32B's first full-size updates" and the entries it cites):
# checkpoint 52-64 s; steps on 4 x H200: load 12-13 s, the host state 127 s, step 1 148 s (sampling 107 s with its
# compiles, update 41 s), step 2 95 s (sampling 72 s, update 23 s), 476 s in all (the first runs, before the host's
# memory was counted, ran out of it); resume 282-298 s for both runs; sampler: the end to end 91 s on 4 x H100,
# decode at B = 32, 64, 128 with the step's parts ~110 s on 4 x H200 (each from a process of its own: ~20-35 s of
# start-up, roofline and weights).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-workdirs/kevin32b}
HF_DIR=${HF_DIR:-/tmp/qwq32b_random}
WORK=${WORK:-/tmp/kevin32b}
SHM=${SHM:-/dev/shm/kevin32b_ckpt}
KB_DIR=${KB_DIR:-}
STAGES=${*:-checkpoint sampler steps resume}
for stage in $STAGES; do
  case "$stage" in
    checkpoint|sampler|steps|resume|sampling|replay|update) ;;
    *) echo "unknown stage $stage (checkpoint | sampler | steps | resume | sampling | replay | update)"; exit 2 ;;
  esac
done
case " $STAGES " in *" steps "*|*" resume "*)
  [ -d "$KB_DIR" ] || { echo "KB_DIR must name a KernelBench checkout (its root or its KernelBench/ folder)"; exit 2; } ;;
esac
mkdir -p "$OUT" "$WORK"
SUMMARY=$OUT/summary.txt
note() { echo "$(date +%T) $*" | tee -a "$SUMMARY"; }
limit() { local v="${1^^}_S"; echo "${!v:-$2}"; }
T0=$SECONDS
$PY -c "import cuda_eval._native" 2>/dev/null || $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
# One compilation cache for every stage: the resumed run reuses run A's programs.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/kevin_jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee -a "$SUMMARY"
free -g | tee -a "$SUMMARY"; df -h / /dev/shm | tee -a "$SUMMARY"; git rev-parse HEAD 2>/dev/null | tee -a "$SUMMARY"

# Memory seen from outside the process (cuda_eval's workers included), one line per second per GPU; appended, so
# that a second call of this script (other stages, the same OUT) keeps the first one's lines.
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader -lms 1000 >> "$OUT/gpu_memory.csv" &
SMI_PID=$!
# Host memory: seconds, bytes in use, bytes available (MemAvailable); every 10 s the largest processes by RSS.
( while sleep 2; do echo "$(date +%s) $(free -b | awk '/Mem:/ {print $3, $7}')"; done ) >> "$OUT/host_memory.txt" &
FREE_PID=$!
( while sleep 10; do echo "== $(date +%s)"; ps -eo rss=,pid=,comm= --sort=-rss | head -8; done ) \
  >> "$OUT/host_processes.txt" &
PS_PID=$!
trap 'kill $SMI_PID $FREE_PID $PS_PID 2>/dev/null' EXIT

# Capped so that the steps and resume stages fit half an hour of the node; each step still runs both updates of its
# batch, and rl.skip_zero_advantage=False keeps the zero-advantage samples (random weights: every reward is 0) in the
# update. Prompts keep the h100x4 layout's 4096-token budget (KernelBench level 1-2 first-turn prompts: ~1.1k-1.5k
# tokens).
CAPS="--config.total_steps=2 --config.rl.tasks_per_step=2 --config.env.num_trajectories=4 --config.env.num_turns=2
  --config.env.max_response_tokens=1024 --config.rl.skip_zero_advantage=False --config.holdout.every_steps=0
  --config.holdout.at_end=False --config.log.progress=False --config.tasks.kernelbench_dir=$KB_DIR"
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
# The replay stages: one step on the built-in tasks (every one has replayable answers), no checkpoint, no held-out
# evaluation, one update.
REPLAY="--config.rl.replay=builtin --config.total_steps=1 --config.env.num_trajectories=16
  --config.rl.updates_per_batch=1 --config.holdout.every_steps=0 --config.holdout.at_end=False
  --config.log.progress=False --config.ckpt.enabled=False --config.model.hf_checkpoint=$HF_DIR"
# The phase table of a replay stage's step, from its metrics.jsonl (every key under replay/).
phase_table() {
  $PY - "$1" "$2" <<'PYEOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
path, stage = sys.argv[1:3]
try:
    rows = [json.loads(line) for line in open(path) if line.strip()]
except OSError as e:
    sys.exit(f"{stage}: no metrics ({e})")
m = {k.removeprefix("replay/"): v for k, v in rows[-1].items()}
get = lambda k, scale=1.0: m.get(k, float("nan")) * scale
print(f"[replay] {stage}: phase table of the step (replayed answers, NOT training)")
print(f"{'phase':34s} {'value':>12s}")
for label, key, scale, fmt in [
        ("start-up (load, host state) s", "time/startup", 1, ".0f"),
        ("sampling s", "time/sampling", 1, ".1f"),
        ("  generated tokens/s", "perf/generated_tokens_per_s", 1, ".0f"),
        ("  response length mean", "rollout/response_length_mean", 1, ".0f"),
        ("  MFU of sampling %", "perf/mfu_sampling", 100, ".1f"),
        ("evaluation (wall, outstanding) s", "time/evaluation", 1, ".1f"),
        ("episode s", "time/episode", 1, ".1f"),
        ("  episode / max(sampling, eval)", "perf/episode_wall_over_max", 1, ".2f"),
        ("  kernels compiled (rate)", "rollout/compiled_rate", 1, ".2f"),
        ("  kernels correct (rate)", "rollout/correct_rate", 1, ".2f"),
        ("  score mean", "rollout/score_mean", 1, ".3f"),
        ("  advantage std", "rollout/advantage_std", 1, ".3f"),
        ("update s (1 update)", "time/update", 1, ".1f"),
        ("  gradients s", "time/gradients", 1, ".1f"),
        ("  MFU of the gradients %", "perf/mfu_gradients", 100, ".1f"),
        ("  optimizer s", "time/optimizer", 1, ".1f"),
        ("  samples trained", "batch/samples_trained", 1, ".0f"),
        ("  micro-batches", "batch/micro_batches", 1, ".0f"),
        ("  padding %", "batch/padding_fraction", 100, ".1f"),
        ("  grad_norm", "update0/grad_norm", 1, ".3g"),
        ("step s", "time/step", 1, ".1f"),
        ("peak HBM per GPU GB", "mem/hbm_peak_gb", 1, ".1f"),
        ("host RSS peak GB", "mem/host_rss_peak_gb", 1, ".1f")]:
    print(f"{label:34s} {format(get(key, scale), fmt):>12s}")
PYEOF
}
rc=0
for stage in $STAGES; do
  echo "=== $(date +%T) $stage"
  case "$stage" in
    checkpoint)
      if [ -f "$HF_DIR/model.safetensors.index.json" ]; then
        note "checkpoint: reusing $HF_DIR"
      else
        T=$SECONDS
        timeout "$(limit checkpoint 900)" $PY scripts/write_hf_checkpoint.py --shape qwq_32b --out "$HF_DIR" \
          > "$OUT/write_hf.log" 2>&1 || { tail -20 "$OUT/write_hf.log"; note "checkpoint: writing failed"; exit 1; }
        note "checkpoint: HF directory written in $((SECONDS - T)) s ($(du -sh "$HF_DIR" | cut -f1))"
        tail -5 "$OUT/write_hf.log" | tee -a "$SUMMARY"
      fi ;;
    sampler)
      T=$SECONDS; lim=$(limit sampler 600)
      if [ "$lim" -lt 300 ]; then
        note "sampler: SAMPLER_S=$lim is too short (the end to end and the decode sections need 300 s or more)"
        rc=1; continue
      fi
      # The end to end (prefill) first, in a process of its own: run after the decode sections in one process, the
      # prefill found no room (4 x H200).
      timeout -k 30 "$((lim / 2))" $PY benchmarks/sampler.py --gpus "$NGPU" --tp-parts e2e \
        --cache-dir "$JAX_COMPILATION_CACHE_DIR" --budget-s $((lim / 2 - 30)) --out "$OUT/sampler_tp_e2e.json" \
        > "$OUT/sampler_e2e.log" 2>&1
      r1=$?
      left=$((lim - (SECONDS - T))); [ $left -lt 120 ] && left=120     # the middle batch runs whatever the budget
      timeout -k 30 "$left" $PY benchmarks/sampler.py --gpus "$NGPU" --tp-parts decode,shard \
        --cache-dir "$JAX_COMPILATION_CACHE_DIR" --budget-s $((left - 60)) \
        --out "$OUT/sampler_tp.json" > "$OUT/sampler.log" 2>&1
      r=$?; [ $r = 0 ] && [ $r1 = 0 ] || rc=1
      note "sampler: rc=$r1 (end to end), $r (decode) in $((SECONDS - T)) s"
      grep "^end to end" "$OUT/sampler_e2e.log" | tee -a "$SUMMARY"
      grep -v "^\s*$" "$OUT/sampler.log" | tail -40 | tee -a "$SUMMARY" ;;
    steps)
      T=$SECONDS
      rm -rf "$WORK/full"
      timeout "$(limit steps 1500)" $PY launch/train.py --config=configs/kevin32b.py --workdir="$WORK/full" \
        --config.model.hf_checkpoint="$HF_DIR" $CAPS --config.ckpt.enabled=False > "$OUT/steps.log" 2>&1
      r=$?; [ $r = 0 ] || rc=1
      cp "$WORK/full/metrics.jsonl" "$OUT/steps_metrics.jsonl" 2>/dev/null
      note "steps (full depth): rc=$r in $((SECONDS - T)) s"
      grep -E "layout|train state:|loaded|step [0-9]+/|update [01]:|Traceback|Error" "$OUT/steps.log" | tail -40 |
        tee -a "$SUMMARY" ;;
    resume)
      rm -rf "$WORK/depth8" "$SHM"
      free_shm=$(df -B1 --output=avail /dev/shm | tail -1)
      if [ "$free_shm" -lt $((200 * 1000 ** 3)) ]; then
        SHM=$WORK/depth8_checkpoints
        note "/dev/shm has $((free_shm / 1000 ** 3)) GB free (< 200): checkpoints on disk at $SHM instead"
      fi
      RESUME="--config.model.shape=qwq_32b_depth8 --config.tokenizer.path=$HF_DIR $CAPS --config.ckpt.dir=$SHM
        --config.ckpt.max_to_keep=1"
      lim=$(limit resume 1200)
      T=$SECONDS
      # run A: launch/train.py's own main, SIGKILLed while step 2's checkpoint is being written
      timeout "$lim" $PY tests/kevin_jax/kill_at_phase.py --kill_at_phase=checkpoint --kill_at_step=2 \
        --config=configs/kevin32b.py --workdir="$WORK/depth8" $RESUME > "$OUT/resume_A.log" 2>&1
      note "resume, run A: rc=$? (137 = SIGKILLed as asked) in $((SECONDS - T)) s"
      cp "$WORK/depth8/trajectories/step_000002.jsonl" "$WORK/step2_killed.jsonl" 2>/dev/null
      T=$SECONDS
      timeout "$lim" $PY launch/train.py --config=configs/kevin32b.py --workdir="$WORK/depth8" $RESUME \
        > "$OUT/resume_B.log" 2>&1
      note "resume, run B (resumed): rc=$? in $((SECONDS - T)) s"
      grep -E "checkpoint restored|checkpoint was written|last checkpoint written|train state:|Traceback" \
        "$OUT/resume_A.log" "$OUT/resume_B.log" | tee -a "$SUMMARY"
      $PY - "$OUT/resume_A.log" "$OUT/resume_B.log" "$WORK/step2_killed.jsonl" \
          "$WORK/depth8/trajectories/step_000002.jsonl" <<'PYEOF' 2>&1 | tee -a "$SUMMARY"
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
sys.exit(0 if ok and same else 1)
PYEOF
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1
      cp "$WORK/depth8/metrics.jsonl" "$OUT/resume_metrics.jsonl" 2>/dev/null
      rm -rf "$SHM" ;;
    sampling|replay)
      # sampling: 64 sequences of SAMPLING_TOKENS in one sampler call; replay: 128 kernels evaluated beside sampling
      if [ "$stage" = sampling ]; then
        SHAPE="--config.rl.tasks_per_step=4 --config.env.num_turns=1 --config.env.pipeline_groups=1
          --config.env.max_response_tokens=${SAMPLING_TOKENS:-16384}"
      else
        SHAPE="--config.rl.tasks_per_step=4 --config.env.num_turns=2 --config.env.pipeline_groups=2
          --config.env.max_response_tokens=${REPLAY_TOKENS:-4096}"
      fi
      T=$SECONDS
      rm -rf "$WORK/$stage"
      timeout "$(limit "$stage" 1500)" $PY launch/train.py --config=configs/kevin32b.py --workdir="$WORK/$stage" \
        $REPLAY $SHAPE > "$OUT/$stage.log" 2>&1
      r=$?; [ $r = 0 ] || rc=1
      cp "$WORK/$stage/metrics.jsonl" "$OUT/${stage}_metrics.jsonl" 2>/dev/null
      cp -r "$WORK/$stage/replay" "$OUT/${stage}_replayed" 2>/dev/null
      note "$stage (replay, not training): rc=$r in $((SECONDS - T)) s"
      grep -E "layout|train state:|NOT TRAINING|round [0-9]|episode of step|step 1 update|step [0-9]+/|Traceback|Error" \
        "$OUT/$stage.log" | tail -30 | tee -a "$SUMMARY"
      phase_table "$WORK/$stage/metrics.jsonl" "$stage" ;;
    update)
      T=$SECONDS; lim=$(limit update 1500)
      timeout -k 30 "$lim" $PY benchmarks/update_mfu.py --config configs/kevin32b.py --set model.shape=qwq_32b \
        --layouts bucketed,uniform --per-shape 1 --budget-s $((lim - 240)) --out "$OUT/update_mfu.json" \
        > "$OUT/update.log" 2>&1
      r=$?; [ $r = 0 ] || rc=1
      note "update (gradient step at 512 samples of the length mix): rc=$r in $((SECONDS - T)) s"
      grep -E "^\[update benchmark\]|^layout|^uniform|^fixed|^packed|^bucketed|compile and first|Traceback|Error" \
        "$OUT/update.log" | tail -45 | tee -a "$SUMMARY" ;;
  esac
done
note "done in $((SECONDS - T0)) s"
exit $rc
