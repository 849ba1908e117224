"""Keep numba-cuda 0.30.4 importable beside NumPy >= 2.4, which removed ``np.row_stack``.

numba-cuda registers an overload for ``np.row_stack`` at import time; on the H100 image (newer NumPy) every
kernel compilation then fails with AttributeError. ``vstack`` is what ``row_stack`` always was.
"""
import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
