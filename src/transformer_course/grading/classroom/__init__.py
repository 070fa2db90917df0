"""Grading a class with one command: the batch command (`batch`) and the process that grades one
student (`worker`). May import every other folder of the grading package.
"""

SANDBOX_PROBLEM = "sandbox_problem"  # the key of a worker's report when its sandbox did not start (worker.grade)
NOTEBOOK_TIMEOUT = 1800  # seconds one notebook may run in all: cells, replays, hidden parts (JudgedExecute's default)
GRADER_WORK = 300  # seconds of the grader's own work a notebook may add (its sandbox, nbgrader, its feedback page)
