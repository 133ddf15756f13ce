#!/usr/bin/env bash
# Runs device stages back to back in a background process session, so that a plan longer than one 10-minute device
# call runs without a gap between stages; each later call only waits and copies what is there (the machine stays held
# while a call runs, and a process that started its own session survives the call that started it).
#   bash device/background.sh start "bash device/stages.sh probe" "python3 x.py" ...
#   bash device/background.sh plan device/plans/NAME.sh   # the same, a command per line
#   bash device/background.sh wait 560     # until everything ended or 560 s passed; copies to $OUT
# Stage k runs with OUT=$BG/k and its stdout+stderr in $BG/k.log; $BG/progress has a line per start and end.
# Everything under $BG is packed into $OUT/background.tgz at every `wait`, so a machine lost mid-plan loses only the
# stage in flight (keep big outputs such as checkpoints out of $BG: a file over 16 MiB does not come back).
set -u
BG=${BG:-/tmp/kevin_bg}
OUT=${OUT:-/tmp/out}
case "${1:-}" in
  start)
    shift
    [ -f "$BG/pid" ] && kill -0 "$(cat "$BG/pid")" 2>/dev/null && { echo "a plan is already running"; exit 1; }
    rm -rf "$BG"; mkdir -p "$BG"
    printf '%s\n' "$@" > "$BG/plan"
    setsid bash -c '
      export BG=$1; shift; k=0
      for cmd in "$@"; do
        k=$((k + 1)); mkdir -p "$BG/$k"
        echo "$(date +%T) start $k: $cmd" >> "$BG/progress"
        OUT="$BG/$k" bash -c "$cmd" > "$BG/$k.log" 2>&1; rc=$?
        echo "$(date +%T) end $k rc=$rc" >> "$BG/progress"
      done
      echo "$(date +%T) all done" >> "$BG/progress"' _ "$BG" "$@" < /dev/null > /dev/null 2>&1 &
    echo $! > "$BG/pid"
    echo "started plan of $# stages (pid $(cat "$BG/pid"))" ;;
  plan)
    [ -f "${2:-}" ] || { echo "no plan file ${2:-}"; exit 2; }
    mapfile -t cmds < <(grep -v -E '^\s*(#|$)' "$2")
    exec bash "$0" start "${cmds[@]}" ;;
  wait)
    limit=${2:-560}; t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$limit" ] && ! grep -q "all done" "$BG/progress" 2>/dev/null; do sleep 5; done
    # one archive: the device tool brings back at most 8 files from $OUT
    mkdir -p "$OUT"; tar czf "$OUT/background.tgz" -C "$(dirname "$BG")" "$(basename "$BG")" 2>/dev/null
    cat "$BG/progress" 2>/dev/null
    current=$(ls -t "$BG"/*.log 2>/dev/null | head -1)
    [ -n "$current" ] && { echo "--- tail of $current"; tail -c 2500 "$current"; }
    if [ -f "$BG/jobs/jobs.txt" ]; then
      echo "--- GPU jobs (device/gpus.sh)"; cat "$BG/jobs/jobs.txt"
      for started in "$BG"/jobs/*.started; do
        job=${started%.started}; [ -f "$job.rc" ] || { echo "--- running: $(basename "$job")"; tail -c 600 "$job.log"; }
      done
    fi ;;
  *) echo "usage: background.sh start CMD... | plan FILE | wait SECONDS"; exit 2 ;;
esac
