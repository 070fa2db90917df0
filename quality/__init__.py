"""The course's own quality tools, kept out of the package students install.

    mistakes/     the catalog of realistic student mistakes and correct alternatives, per stage
    mutations     mechanical mutants of the reference solutions (the yardstick of the checks)
    behaviour     whether a mutant behaves like the reference (equivalent mutants are left out)
    measure       how many mutants the grade cells reject and name (scripts/measure_checks.py)
    inprocess     grade cells run the way the grader runs them, for the tests and the catalog
    execution     a notebook run cell by cell in a fresh kernel (tests, lesson authors)
    examples      the example classes (correct, blank, buggy, hostile, ...) and `make demo`'s class
    demo          `make demo`: build the notebooks and grade the example class

Run from the repository root (`python -m quality.demo`); the tests put the root on the path.
"""
