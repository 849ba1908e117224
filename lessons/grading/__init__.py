"""The course's autograder, ``python -m lessons grade N solution.py`` (docs/course.md).

The parent and the command:

* :mod:`lessons.grading.grader`: :func:`~lessons.grading.grader.grade`, the parent: scans the source, starts the
  judge, reads its framed answer; the report's summary;
* :mod:`lessons.grading.command`: the command's arguments and output;
* :mod:`lessons.grading.source_scan`: vendor GEMM, tampering and imports of the stage's code, read in the source;
* :mod:`lessons.grading.plan`: the seeds, the exercise, the performance thresholds;
* :mod:`lessons.grading.rubric`: a check's record, the score, PASSED or FAILED.

The judge (``python -m lessons.grading.judge --child``, trusted code only) and its checks:

* :mod:`lessons.grading.judge`: builds the candidate from the oracle's answers and runs every check;
* :mod:`lessons.grading.correctness`, :mod:`lessons.grading.technique`, :mod:`lessons.grading.performance`.

The trust boundary:

* :mod:`lessons.grading.oracle`: the sandboxed child that loads a student's file and answers questions about its
  holes with plain data;
* :mod:`lessons.grading.sandbox`: the judge's side: the stripped project copy, the process, the hole functions
  rebuilt from the oracle's answers;
* :mod:`lessons.grading.traced`: arithmetic traced into trees and PTX emission recorded (both sides);
* :mod:`lessons.grading.copies`: is a hole the stage's own code, names and formatting aside;
* :mod:`lessons.grading.gradebook`: a class folder graded into a CSV gradebook, Gradescope and JUnit files.
"""
