"""nbgrader's gradebook and class folder (`class_folder`) and the course's nbgrader configuration for a
class (`config`). Imports nothing of the grading package but `cells`.
"""
