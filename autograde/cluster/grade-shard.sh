#!/usr/bin/env bash
# One task of a job array: grade this task's slice of the class (see README, "A class too big for one machine").
# Every task runs the same command; `--shard auto` reads the scheduler's own variables (Slurm's
# SLURM_ARRAY_TASK_ID/MIN/MAX/STEP/COUNT, or Kubernetes' JOB_COMPLETION_INDEX with JOB_COMPLETIONS).
# With --scores-only as its first argument it grades nobody and writes the class's complete scores.csv and
# report.html from the gradebook: the final step, run once after every task has ended.
#
#   SUBMISSIONS    folder of student notebooks as downloaded (shared, read-only is fine)
#   CLASS_DIR      the class folder on shared storage: release, records, autograded copies, feedback, scores.csv
#   GRADEBOOK_URL  the shared PostgreSQL gradebook, e.g. postgresql://grader@dbhost/gradebook
#   JOBS           students graded at once by this task (default: the task's CPUs)
#   MEMORY_GB      memory one student's notebooks may use together (default 3); JOBS x MEMORY_GB plus 2 GB
#                  for the grader itself must fit the task's memory (the recipes: 4 x 3 + 2 <= 16 GB)
#   PYTHON         the course's Python (default: python)
# Extra arguments are passed to the batch command (e.g. --assignment 02_attention, --timeout 60).
set -euo pipefail
: "${SUBMISSIONS:?set SUBMISSIONS to the folder of student notebooks}"
: "${CLASS_DIR:?set CLASS_DIR to the shared class folder}"
: "${GRADEBOOK_URL:?set GRADEBOOK_URL to the shared PostgreSQL gradebook}"
if [ "${1:-}" = "--scores-only" ]; then
    shift
    exec "${PYTHON:-python}" -m transformer_course.grading.batch "$SUBMISSIONS" --class-dir "$CLASS_DIR" \
        --db-url "$GRADEBOOK_URL" --scores-only "$@"
fi
JOBS="${JOBS:-${SLURM_CPUS_PER_TASK:-$(nproc)}}"
exec "${PYTHON:-python}" -m transformer_course.grading.batch "$SUBMISSIONS" --class-dir "$CLASS_DIR" \
    --db-url "$GRADEBOOK_URL" --shard auto --jobs "$JOBS" --memory-gb "${MEMORY_GB:-3}" --require-sandbox "$@"
