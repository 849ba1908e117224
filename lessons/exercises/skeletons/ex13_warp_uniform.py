"""Exercise 13 (stage 13, the uniform datapath): which per-thread values to broadcast from lane 0.

Objective: tell the compiler which values a warp shares, so the wgmma descriptors stay on the uniform datapath.

Since stage 05 each math warpgroup finds its 64 rows of the A tile from %tid: wg_a = (tid >> 7) * 8192 bytes. A
math thread also keeps its lane (tid & 31), its warp (tid >> 5) and its first row of the accumulator fragment
(16 * warp + lane / 4). ptxas cannot prove any of them equal across a warp, because they come from %tid, so it
keeps them per thread, in R registers, and so is every wgmma descriptor built from one, moved to a uniform
register (R2UR) before each wgmma. A value read with shfl.sync from a fixed lane is provably warp-uniform.

Fill in, in your copy of lessons/exercises/skeletons/ex13_warp_uniform.py:
  * warp_uniform(values) -> tuple of names: which of `values` (the names above: "lane", "warp", "fragment_row",
    "warpgroup_offset") the generator broadcasts from lane 0 of each warp. Broadcast only what every lane of a
    warp shares; broadcast what the descriptors are made from.
The generator emits one shfl.sync.idx.b32 per name (gemm/kernel/math_warpgroups.py MathWarpgroups.__init__).

Grade it: ``python -m lessons grade 13 path/to/this_file.py``.
"""

# Predict, then check:
# 1. Which of lane, warp, fragment_row and warpgroup_offset are equal in all 32 lanes of a warp?
#    Check: tid = 32 * w + l for lane l of warp w; compute each for l = 0..31 (a warpgroup is 4 warps).
# 2. How many R2UR does the K loop of stage 12's SASS hold, and how many of stage 13's?
#    Check with `python -m lessons inspect 12` and `inspect 13`, or the notebook's count between the first and the
#    last QGMMA.
# 3. If fragment_row is broadcast too, which rows of D are right?
#    Check with the emulator (`EXERCISE.build(this_module).run_cpu(...)`).
# 4. Where does this stage gain, decode (M = 16) or prefill (M = 4096)?
#    Check with results/uniform_offsets.json.


def warp_uniform(values: tuple[str, ...]) -> tuple[str, ...]:
    """The names, among ``values``, of the per-thread values to broadcast from lane 0 of each warp (distinct, each
    one of ``values``; an empty tuple broadcasts nothing)."""
    raise NotImplementedError("warp_uniform: which of these values does every lane of a warp share, and which do "
                              "the wgmma descriptors need?")
