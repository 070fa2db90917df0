"""What instructors read: scores from the gradebook (`scores`), feedback without hidden tests and without
anything that runs (`feedback`, `inert`), the class report (`report`), the written answers (`answers`) and
the hand grades that survive a regrade (`hand_grades`), files for an LMS (`lms`); CSV cells that no
spreadsheet runs and sheets read back from any spreadsheet (`spreadsheet`), files replaced whole (`files`).

Imports `gradebook`, `intake` and `cells` of the grading package.
"""
