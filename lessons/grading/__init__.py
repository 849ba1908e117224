"""The grader's trust boundary (``python -m lessons grade``; the judge itself is :mod:`lessons.grade`).

* :mod:`lessons.grading.oracle`: the sandboxed child that loads a student's file and answers questions about its
  holes with plain data;
* :mod:`lessons.grading.sandbox`: the judge's side: the stripped project copy, the process, the hole functions
  rebuilt from the oracle's answers;
* :mod:`lessons.grading.traced`: arithmetic traced into trees and PTX emission recorded (both sides);
* :mod:`lessons.grading.copies`: is a hole the stage's own code, names and formatting aside;
* :mod:`lessons.grading.gradebook`: a class folder graded into a CSV gradebook, Gradescope and JUnit files.
"""
