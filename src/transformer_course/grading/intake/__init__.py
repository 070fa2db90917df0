"""Taking submissions in: a downloads folder as an LMS or Colab gives it (`submissions`), who each
file belongs to (`identities`), a file too large or too deep to parse read without its outputs
(`trim`, run as a process of its own).

Imports nothing of the grading package but `cells` (`trim` imports nothing but the standard library).
"""
