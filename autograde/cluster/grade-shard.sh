#!/usr/bin/env bash
# One task of a job array: grade this task's slice of the class (the instructor's guide on the course
# website, "Grading on a cluster"). Every task runs the same command; `--shard auto` reads the scheduler's
# own variables (Slurm's SLURM_ARRAY_TASK_ID/MIN/MAX/STEP/COUNT, or Kubernetes' JOB_COMPLETION_INDEX with
# JOB_COMPLETIONS).
# With --scores-only as its first argument it grades nobody and writes the class's complete scores.csv and
# report.html from the gradebook: the final step, run once after every task has ended. It refuses to write
# a scores.csv in which nobody is graded, and names the tasks that failed and why.
#
#   SUBMISSIONS    folder of student notebooks as downloaded (shared, read-only is fine)
#   CLASS_DIR      the class folder on shared storage: release, records, autograded copies, feedback, scores.csv
#   GRADEBOOK_URL  the shared PostgreSQL gradebook, e.g. postgresql://grader@dbhost/gradebook
#   SECRET_FILE    the class's secret, which the hidden tests' inputs are drawn from: one file every task reads
#                  (shared storage outside CLASS_DIR and SUBMISSIONS; on Kubernetes the Secret hidden-inputs,
#                  mounted). Required: a task without it grades nobody. Where the file does not exist yet, the
#                  first task makes it and the others, started at the same moment, read that one
#   MULTI30K_DIR   a folder on shared storage with Multi30k's six .gz files: a task that grades a stage reading
#                  them (0, 5, 6, 7; the sandboxes have no network) stops without them (unset: the user's
#                  download cache, downloaded into where the node has network)
#   JOBS           students graded at once by this task (default: the task's CPUs)
#   MEMORY_GB      memory each notebook's sandbox may use, all its processes together (--memory-gb; default 3)
#   PYTHON         the course's Python (default: the course's virtualenv .venv/bin/python, as `make setup`
#                  makes it, when there is one; else python3 on PATH, as in the container image)
#   GRADE_OPTIONS  more options for the batch command, split at spaces (e.g. "--assignment 02_attention
#                  --timeout 60"); so are extra arguments of this script
#
# Every task leaves a line in CLASS_DIR/cluster-tasks/RUN/TASK.{running,ok,failed} (RUN: the Slurm array's
# job id or the Kubernetes Job's name); the final step reads them to say which tasks failed and why.
set -uo pipefail
: "${SUBMISSIONS:?set SUBMISSIONS to the folder of student notebooks}"
: "${CLASS_DIR:?set CLASS_DIR to the shared class folder}"
: "${GRADEBOOK_URL:?set GRADEBOOK_URL to the shared PostgreSQL gradebook}"

read -ra options <<< "${GRADE_OPTIONS:-}"
course=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$course/.venv/bin/python" ]; then
        PYTHON="$course/.venv/bin/python"
    else
        PYTHON=$(command -v python3 || command -v python || echo python3)
    fi
fi
case "$PYTHON" in  # as `activate` does: the virtualenv's commands first (nbgrader runs its `alembic`)
    */*) PATH="$(dirname "$PYTHON"):$PATH"; export PATH ;;
esac
tasks="$CLASS_DIR/cluster-tasks"

if [ "${1:-}" = "--scores-only" ]; then
    shift
    # Nobody graded (every task failed, or none ran): writing scores.csv now would replace the class's
    # file with one that reads "pending" for everyone. Say which tasks failed instead, and stop.
    run="${GRADING_RUN:-}"
    if [ -z "$run" ] && [ -d "$tasks" ]; then
        run=$(find "$tasks" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %f\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
    fi
    if [ -n "$run" ] && [ -d "$tasks/$run" ]; then
        for file in "$tasks/$run"/*.failed "$tasks/$run"/*.running; do
            [ -e "$file" ] || continue
            case "$file" in
                *.failed) echo "task $(basename "$file" .failed) failed: $(cat "$file")" >&2 ;;
                *.running) echo "task $(basename "$file" .running) never reported an end (killed by a time or" \
                                "memory limit, or its node was lost): $(cat "$file")" >&2 ;;
            esac
        done
    fi
    graded=$("$PYTHON" - "$GRADEBOOK_URL" <<'EOF'
import sys
from transformer_course.grading.outputs import scores
print(sum(scores.scored(row) for row in scores.score_rows(sys.argv[1])))
EOF
    ) || { echo "error: cannot read the gradebook $GRADEBOOK_URL with $PYTHON (see above)" >&2; exit 1; }
    if [ "$graded" = 0 ]; then
        echo "error: no student is graded in the gradebook, so scores.csv would read pending for everyone:" \
             "it was not written. ${run:+The grading tasks of run $run are listed above. }Fix their cause and run" \
             "the grading again; then this step." >&2
        exit 3
    fi
    exec "$PYTHON" -m transformer_course.grading.batch "$SUBMISSIONS" --class-dir "$CLASS_DIR" \
        --db-url "$GRADEBOOK_URL" --scores-only ${options[@]+"${options[@]}"} "$@"
fi

# --- one grading task -----------------------------------------------------------------------------------
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
    run="${GRADING_RUN:-slurm-${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-job}}}" task="slurm-task-$SLURM_ARRAY_TASK_ID"
elif [ -n "${JOB_COMPLETION_INDEX:-}" ]; then
    run="${GRADING_RUN:-kubernetes-${JOB_NAME:-job}}" task="kubernetes-index-$JOB_COMPLETION_INDEX"
else
    run="${GRADING_RUN:-by-hand}" task="host-$(hostname)"
fi
mkdir -p "$tasks/$run" 2>/dev/null || echo "warning: cannot write $tasks/$run: this task's end is not recorded" >&2
status="$tasks/$run/$task"
where="node $(hostname), started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "$where" > "$status.running" 2>/dev/null
rm -f "$status.ok" "$status.failed"

fail() {  # fail EXIT_STATUS MESSAGE: say it loudly, record it for the final step, and stop
    echo "error: $2" >&2
    echo "exit status $1 on $where: $2" > "$status.failed" 2>/dev/null
    rm -f "$status.running"
    exit "$1"
}

problem=$("$PYTHON" -c 'import transformer_course.grading.batch' 2>&1 >/dev/null) \
    || fail 1 "the course's Python ($PYTHON) cannot import the course: ${problem##*$'\n'}. Set PYTHON to the python of the course's virtualenv (make setup makes .venv in the course's folder)"
if [ -z "${SECRET_FILE:-}" ]; then
    fail 1 "SECRET_FILE is not set: name the class's secret, the one file every task draws the hidden tests' inputs from (on shared storage outside CLASS_DIR and SUBMISSIONS; on Kubernetes the Secret hidden-inputs, mounted as the manifest does). Without it each task would draw its own"
fi
if [ ! -d "$SUBMISSIONS" ]; then
    fail 1 "SUBMISSIONS=$SUBMISSIONS is not a folder on this node"
fi

JOBS="${JOBS:-${SLURM_CPUS_PER_TASK:-$(nproc)}}"
errors=$(mktemp)
# the batch command's standard error goes to the task's log as ever, and is kept to name the cause
{ "$PYTHON" -m transformer_course.grading.batch "$SUBMISSIONS" --class-dir "$CLASS_DIR" \
    --db-url "$GRADEBOOK_URL" --shard auto --jobs "$JOBS" --memory-gb "${MEMORY_GB:-3}" --require-sandbox \
    --secret-file "$SECRET_FILE" --require-data ${options[@]+"${options[@]}"} "$@" \
    2>&1 1>&3 3>&- | tee "$errors" >&2; code=${PIPESTATUS[0]}; } 3>&1
cause=$(grep -m 1 '^error:' "$errors" || tail -n 1 "$errors")
cause="${cause#error: }"
rm -f "$errors"
if [ "$code" -ne 0 ]; then
    fail "$code" "the batch command stopped with exit status $code: ${cause%.}"
fi
echo "$where, ended $(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$status.ok" 2>/dev/null
rm -f "$status.running"
