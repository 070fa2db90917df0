"""Grading a class with one command: the batch command (`batch`) and the process that grades one
student (`worker`). May import every other folder of the grading package.
"""
