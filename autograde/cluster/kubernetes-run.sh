#!/usr/bin/env bash
# Grade a class on Kubernetes from start to end: the grading Job (kubernetes-job.yaml), then, once it has
# ended (Complete, or Failed because an index used up its retries: the others' scores still count), the
# final scores Job (kubernetes-scores.yaml), run once. Kubernetes has no dependency between Jobs, so this
# script waits in between, as Slurm's --dependency=afterany does. From the course's folder:
#
#   bash autograde/cluster/kubernetes-run.sh [POLL_SECONDS]
#
# KUBECTL names the kubectl command (default: kubectl; e.g. "kubectl -n grading").
set -euo pipefail
cd "$(dirname "$0")"
kubectl=(${KUBECTL:-kubectl})
poll="${1:-30}"

ended() {  # the terminal condition of a Job (Complete or Failed), empty while it runs
    local state
    state=$("${kubectl[@]}" get job "$1" -o 'jsonpath={range .status.conditions[?(@.status=="True")]}{.type} {end}') \
        || return 1
    for condition in $state; do
        if [ "$condition" = Complete ] || [ "$condition" = Failed ]; then
            echo "$condition"
            return
        fi
    done
}

wait_for() {
    local state=""
    while [ -z "$state" ]; do
        state=$(ended "$1") || { echo "error: cannot read the state of job/$1" >&2; exit 1; }
        [ -n "$state" ] || sleep "$poll"
    done
    echo "job/$1: $state"
}

"${kubectl[@]}" apply -f kubernetes-job.yaml
wait_for grade-class
# a scores Job left from an earlier run would not start again: replace it
"${kubectl[@]}" delete job grade-class-scores --ignore-not-found
"${kubectl[@]}" apply -f kubernetes-scores.yaml
wait_for grade-class-scores
