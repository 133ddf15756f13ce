#!/usr/bin/env bash
# Jobs pinned to one GPU each, for leases of several GPUs: runs of the one-GPU config side by side (each process sees
# only its GPU through CUDA_VISIBLE_DEVICES; cuda_eval's workers inherit it). Meant for lines of a background plan.
#   [CPUS=0-15] bash device/gpus.sh start NAME GPU "CMD"   # detached; OUT=$JOBS/NAME, log in $JOBS/NAME.log;
#                                                        # CPUS pins it to those cores (taskset)
#   bash device/gpus.sh wait NAME...           # until each job has written $JOBS/NAME.rc (WAIT_S: 1500)
#   bash device/gpus.sh kill NAME              # its whole process group; rc 137 so that waits go on
# Never `pkill -f` a job's command line: the plan runner's own command line holds every plan line, so it would die too.
# JOBS defaults to $BG/jobs, so that background.sh packs the jobs' outputs with everything else.
set -u
export JOBS=${JOBS:-${BG:-/tmp/kevin_bg}/jobs}     # exported: a job can wait for another's $JOBS/NAME.rc
mkdir -p "$JOBS"
case "${1:-}" in
  start)
    name=${2:?name} gpu=${3:?gpu} cmd=${4:?command}
    [ -f "$JOBS/$name.started" ] && ! [ -f "$JOBS/$name.rc" ] && { echo "job $name is already running"; exit 1; }
    rm -f "$JOBS/$name.rc"; mkdir -p "$JOBS/$name"; date +%T > "$JOBS/$name.started"
    CUDA_VISIBLE_DEVICES=$gpu OUT="$JOBS/$name" setsid ${CPUS:+taskset -c "$CPUS"} bash -c "( $cmd ); echo \$? > '$JOBS/$name.rc'" \
      > "$JOBS/$name.log" 2>&1 < /dev/null &
    echo $! > "$JOBS/$name.pid"     # setsid runs in the background job's process: pid = process group id
    echo "$(date +%T) job $name on GPU $gpu: $cmd" | tee -a "$JOBS/jobs.txt" ;;
  wait)
    shift; t0=$SECONDS; limit=${WAIT_S:-1500}; rc=0
    for name in "$@"; do
      [ -f "$JOBS/$name.started" ] || { echo "no job $name"; rc=1; continue; }
      while [ ! -f "$JOBS/$name.rc" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
      if [ -f "$JOBS/$name.rc" ]; then
        echo "$(date +%T) job $name rc=$(cat "$JOBS/$name.rc")" | tee -a "$JOBS/jobs.txt"
      else
        echo "$(date +%T) job $name still running after ${limit}s" | tee -a "$JOBS/jobs.txt"; rc=1
      fi
    done
    exit $rc ;;
  kill)
    name=${2:?name}
    [ -f "$JOBS/$name.pid" ] || { echo "no job $name"; exit 1; }
    [ -f "$JOBS/$name.rc" ] && { echo "job $name already ended rc=$(cat "$JOBS/$name.rc")"; exit 0; }
    kill -TERM -- "-$(cat "$JOBS/$name.pid")" 2>/dev/null; sleep 5; kill -KILL -- "-$(cat "$JOBS/$name.pid")" 2>/dev/null
    echo 137 > "$JOBS/$name.rc"; echo "$(date +%T) job $name killed" | tee -a "$JOBS/jobs.txt" ;;
  *) echo "usage: gpus.sh start NAME GPU CMD | wait NAME... | kill NAME"; exit 2 ;;
esac
