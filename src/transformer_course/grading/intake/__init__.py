"""Taking submissions in: a downloads folder as an LMS or Colab gives it (`submissions`), who each
file belongs to (`identities`), and the static scan of lines a student added (`scan`).

Imports nothing of the grading package but `cells`.
"""
