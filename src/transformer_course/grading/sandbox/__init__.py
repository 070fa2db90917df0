"""The security boundary: everything that touches a student's processes.

`isolation` confines them (bubblewrap, limits), `runner` is the process that runs a student's notebooks,
`seal` its in-process defences, `executor` the grader's side of the channel (nbgrader's Execute step),
`profiling` where the time goes. Imports nothing of the grading package but `cells`.
"""
