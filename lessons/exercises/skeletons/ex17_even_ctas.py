"""Exercise 17 (stage 17, even waves): the fewest CTAs that take as many waves.

Objective: count the fewest CTAs a persistent walk needs for as many waves as one CTA per SM.

Stage 17 launches a persistent walk with the fewest CTAs that take as many waves as one CTA per SM: each CTA then
walks the same number of tiles (or one fewer), and each wave starts on whole blocks of the raster. At 4096 x 4096
x 7168 (512 tiles of 256 x 128 on 132 SMs) that is 128 CTAs of four tiles, not 116 of four and 16 of three.

Fill in, in your copy of lessons/exercises/skeletons/ex17_even_ctas.py:
  * even_ctas(tiles, sms, cluster) -> int: the fewest CTAs that finish `tiles` tiles in as many waves as `sms`
    CTAs would (a wave: one tile per CTA; one CTA per SM), as a whole number of clusters of `cluster` CTAs (stage
    09's pairs: 2), and never more than `sms`. Mind the rounding: rounding a count down to whole clusters adds a
    wave.
Stage 17 launches that many CTAs where it evens the waves (lessons/17_even_waves.py, evened).

Grade it: ``python -m lessons grade 17 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 4096 x 2112 x 7168 with production's 128 x 192 tiles (352 tiles), how many CTAs, and how many tiles does
#    each walk?
#    Check with gemm.kernel.launch.grid and production's config (gemm.heuristics.choose_config), or the figure
#    17_even_waves.
# 2. The kernel's SASS changes how, from stage 16 to 17?
#    Check with `python -m lessons diff 16 17` (the walk steps by %nctaid: only the launch changes).
# 3. At 128 x 32768 x 512 (256 tiles: 2 waves either way) is 128 CTAs faster than 132?
#    Check with results/sweep_even_waves_paired.json (K = 512: every round slower).
# 4. Where does even waves launch 132 CTAs still, so that it changes nothing?
#    Check with 8192^3 in results/sweep_even_waves_paired.json (2752 tiles: 21 waves of 131.05).


def even_ctas(tiles: int, sms: int, cluster: int) -> int:
    """The fewest CTAs (whole clusters of ``cluster``, at most ``sms``) that finish ``tiles`` tiles in as many waves
    as ``sms`` CTAs would."""
    raise NotImplementedError("even_ctas: how many waves does one CTA per SM take, and how few CTAs take as many?")
