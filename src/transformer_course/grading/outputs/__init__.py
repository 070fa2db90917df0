"""What instructors read: scores from the gradebook (`scores`), feedback without hidden tests
(`feedback`), the class report (`report`), the written answers (`answers`), files for an LMS (`lms`).

Imports `gradebook`, `intake` and `cells` of the grading package.
"""
