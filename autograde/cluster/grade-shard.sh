#!/usr/bin/env bash
# One task of a job array: grade this task's slice of the class (see README, "A class too big for one machine").
# Every task runs the same command; `--shard auto` reads the scheduler's own variables (Slurm's
# SLURM_ARRAY_TASK_ID/MIN/MAX/STEP/COUNT, or Kubernetes' JOB_COMPLETION_INDEX with JOB_COMPLETIONS).
#
#   SUBMISSIONS    folder of student notebooks as downloaded (shared, read-only is fine)
#   CLASS_DIR      the class folder on shared storage: release, records, autograded copies, feedback, scores.csv
#   GRADEBOOK_URL  the shared PostgreSQL gradebook, e.g. postgresql://grader@dbhost/gradebook
#   JOBS           students graded at once by this task (default: the task's CPUs)
#   PYTHON         the course's Python (default: python)
# Extra arguments are passed to the batch command (e.g. --assignment 02_attention, --timeout 60).
set -euo pipefail
: "${SUBMISSIONS:?set SUBMISSIONS to the folder of student notebooks}"
: "${CLASS_DIR:?set CLASS_DIR to the shared class folder}"
: "${GRADEBOOK_URL:?set GRADEBOOK_URL to the shared PostgreSQL gradebook}"
JOBS="${JOBS:-${SLURM_CPUS_PER_TASK:-$(nproc)}}"
exec "${PYTHON:-python}" -m transformer_course.grading.batch "$SUBMISSIONS" --class-dir "$CLASS_DIR" \
    --db-url "$GRADEBOOK_URL" --shard auto --jobs "$JOBS" --require-sandbox "$@"
