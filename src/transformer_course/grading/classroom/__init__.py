"""Grading a class with one command: the batch command (`batch`) and the process that grades one
student (`worker`). May import every other folder of the grading package.
"""

SANDBOX_PROBLEM = "sandbox_problem"  # the key of a worker's report when its sandbox did not start (worker.grade)
