"""The ladder's figures, drawn by code from the layout functions the kernels themselves use.

Every figure is one function returning a :class:`matplotlib.figure.Figure` (no pyplot: nothing global, any
backend; tools/make_figures.py writes the PNGs with Agg). Each is drawn from a *data* function that
tests/test_figures.py checks, and each data function calls what the kernel calls, or what the generated PTX is
proven (by the tests, on the emulator) to compute:

=============================  ===========================================================================
figure                         drawn from
=============================  ===========================================================================
01_naive_thread_map            ``output_element``, ``launch_config`` of lessons/01_naive.py
02_smem_tile_banks             ``output_element``, ``staged_k``, ``shared_word`` of lessons/02_smem_tiling.py
03_micro_tile                  ``micro_offset`` of lessons/03_register_tiling.py
04_mma_fragments               ``a/b/c_fragment_coords`` (ptx.vocab.mma_sync: the ISA's m16n8k32 maps)
04_ldmatrix_swizzle            ``a/b_ldmatrix_source`` (ptx.vocab.mma_sync), ``swizzled_offset``, stage 04's
                               ``a_fragment_offset``
05_wgmma_descriptor            ``DESCRIPTOR_FIELDS``, ``descriptor_value``, ``descriptor_fields`` (ptx.vocab.wgmma)
05_sw128_atom                  ``sw128_offset`` (ptx.vocab.wgmma)
05_wgmma_accumulator           ``accumulator_coords`` (ptx.vocab.wgmma)
06_tma_ring_timeline           stage 06's PTX run by the CPU emulator, its mbarrier/TMA/wgmma events traced
07_producer_consumer_timeline  stage 07's generator config run by the emulator (gemm.testing.emulated), traced
08_tile_raster                 ``schedule`` / ``tile_coords`` (gemm.kernel.tile_scheduler)
09_cluster_multicast           ``schedule`` + the pair rule of ``TileScheduler.pair_flags``
10_ffma_yield_bits             stage 09 / 10 cubins, ``is_yield``, ``reuse_b``, ``ffma_runs`` (ptx.passes)
moe_grouped_layouts            ``dispatch``, ``contiguous_tiles``, ``masked_tiles`` of lessons/moe_grouped.py (the
                               scheduler's ``schedule`` / ``masked_schedule``; a topic figure, not a stage's)
=============================  ===========================================================================

The two timelines are real traces with modelled durations. :func:`trace_barriers` wraps the emulator's
mbarrier, TMA and wgmma instructions while a kernel runs and records each event with its warpgroup's own
instruction count. The emulator runs one warpgroup at a time and completes a copy at issue, so the order of each
warpgroup's events and every parity are the kernel's; :func:`replay` then gives them times under a
:class:`Timing` model (warpgroups in parallel, one step per instruction, a TMA latency, tensor-core time per
wgmma) that keeps every dependency the trace shows.

``python tools/make_figures.py`` writes them all to docs/figures/NN_name.png (docs/figures.md lists them).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from itertools import zip_longest

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

import lessons

LADDER_SHAPE = (4096, 4096, 7168)  # the ladder's benchmark shape: the configs the figures show are this shape's


def _py(function):
    """The Python function behind a Numba device function (in the CUDA simulator it already is one)."""
    return getattr(function, "py_func", function)


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _cells(ax, values, cmap, vmin=None, vmax=None, labels=None, fontsize=6, extent=None):
    """imshow of a 2-D array with an optional text label per cell (row, col order)."""
    ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest", extent=extent)
    if labels is not None:
        for (r, c), text in np.ndenumerate(labels):
            if text is not None and text != "" and not (isinstance(text, (int, np.integer)) and text < 0):
                ax.text(c, r, text, ha="center", va="center", fontsize=fontsize)


def _box(ax, x0, y0, width, height, color="black", lw=2.0, ls="-"):
    ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), width, height, fill=False, lw=lw, ec=color, ls=ls))


# ============================================================================ stages 01-03: Numba threads
def thread_output_map(number: int, m: int, n: int) -> dict[str, np.ndarray]:
    """Which thread of which block computes each element of an m x n D, as stage ``number`` (1 or 2) launches
    it: ``launch_config`` gives the grid, the stage's ``output_element`` the element of each thread (threads
    past the edge are the ones the kernel's guard returns). Arrays of shape (m, n): ``block`` (linear block id,
    x fastest), ``tx``, ``ty``, and ``count`` (threads writing the element: 1 everywhere)."""
    stage = lessons.stage(number)
    element = _py(stage.output_element)
    (grid_x, grid_y), (block_x, block_y) = stage.launch_config(m, n)
    out = {key: np.full((m, n), -1) for key in ("block", "tx", "ty")}
    out["count"] = np.zeros((m, n), int)
    for by in range(grid_y):
        for bx in range(grid_x):
            for ty in range(block_y):
                for tx in range(block_x):
                    row, col = element(bx, by, tx, ty)
                    if row < m and col < n:
                        out["block"][row, col], out["tx"][row, col], out["ty"][row, col] = by * grid_x + bx, tx, ty
                        out["count"][row, col] += 1
    return out


def _thread_map_panel(ax, data, title):
    block, ty = data["block"], data["ty"]
    palette = np.array([colormaps["tab10"](i)[:3] for i in range(10)])
    image = palette[block % 10] * np.where(ty % 2 == 0, 1.0, 0.75)[..., None]  # warps alternate in shade
    ax.imshow(image, aspect="auto", interpolation="nearest")
    rows, cols = block.shape
    ax.vlines(np.arange(cols - 1) + 0.5, -0.5, rows - 0.5, color="white", lw=0.3)  # one cell = one thread
    ax.hlines(np.arange(rows - 1) + 0.5, -0.5, cols - 0.5, color="white", lw=0.3)
    for r in range(0, rows, max(1, rows // 16)):
        ax.text(-1, r, f"w{ty[r, 0]}", ha="right", va="center", fontsize=6)
    for c in range(0, cols, 4):
        ax.text(c, -1, str(data["tx"][0, c]), ha="center", va="bottom", fontsize=6)
    ax.set_title(title, fontsize=9, pad=18)
    ax.set_xlabel("n (column of D); numbers on top: threadIdx.x")
    ax.set_ylabel("m (row of D); w = warp (threadIdx.y)", labelpad=16)
    ax.set_xticks([])
    ax.set_yticks([])


def naive_thread_map() -> Figure:
    stage = lessons.stage(1)
    m, n = 2 * stage.BLOCK_M, 3 * stage.BLOCK_N
    data = thread_output_map(1, m, n)
    fig = _figure(13, 3.6)
    ax = fig.add_subplot()
    _thread_map_panel(ax, data, f"Stage 01: a {stage.BLOCK_N} x {stage.BLOCK_M} block per {stage.BLOCK_M} x "
                      f"{stage.BLOCK_N} tile of D (colour = block, shade = warp); thread (tx, ty) of block (bx, by) "
                      f"computes D[{stage.BLOCK_M}by + ty, {stage.BLOCK_N}bx + tx]:\na warp is 32 consecutive "
                      "columns of one row, and walks all of K for them (output_element)")
    return fig


# -- stage 02 -------------------------------------------------------------------------------------------------
def smem_banks(pitch: int, rows: int, cols: int) -> np.ndarray:
    """Bank of every word of a (rows x cols) window of a float32 shared tile with row pitch ``pitch``."""
    stage = lessons.stage(2)
    return np.array([[stage.shared_word(r, k, pitch) % stage.BANKS for k in range(cols)] for r in range(rows)])


def staging_lanes() -> np.ndarray:
    """(step, k) -> threadIdx.x that decodes byte k of a tile row in staging step ``step`` (-1: not that step)."""
    stage = lessons.stage(2)
    staged_k = _py(stage.staged_k)
    lanes = np.full((stage.BLOCK_K // stage.TILE, stage.BLOCK_K), -1)
    for step in range(lanes.shape[0]):
        for tx in range(stage.TILE):
            lanes[step, staged_k(step, tx)] = tx
    return lanes


def _bank_image(banks: np.ndarray) -> np.ndarray:
    """A light, cyclic colour per bank (32 hues), so that equal banks look alike."""
    return 0.45 + 0.55 * np.array(colormaps["hsv"](banks / 32.0))[..., :3]


def smem_tile_banks() -> Figure:
    stage = lessons.stage(2)
    fig = _figure(15, 8.4)
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.35], width_ratios=[1, 1.25])
    ax = fig.add_subplot(grid[0, 0])
    _thread_map_panel(ax, thread_output_map(2, 2 * stage.TILE, 2 * stage.TILE),
                      f"Stage 02: a {stage.TILE} x {stage.TILE} block per {stage.TILE} x {stage.TILE} tile of D "
                      "(colour = block, shade = warp):\nthread (tx, ty) computes D[32by + ty, 32bx + tx] "
                      "(output_element); a warp is one row")
    ax = fig.add_subplot(grid[0, 1])
    lanes = staging_lanes()
    steps, width = lanes.shape[0], stage.TILE
    k_of = np.full((steps, width), -1)
    for step in range(steps):
        for k in np.flatnonzero(lanes[step] >= 0):
            k_of[step, lanes[step, k]] = k
    _cells(ax, np.repeat(np.arange(steps)[:, None], width, 1), colormaps["Pastel1"], -0.5, 8.5, labels=k_of,
           fontsize=6)
    ax.set_xticks(range(0, width, 4))
    ax.set_yticks(range(steps))
    ax.set_xlabel("threadIdx.x (lane) of warp ty")
    ax.set_ylabel("staging step")
    ax.set_title("staging a K group: in step s lane tx decodes byte k = staged_k(s, tx) = 32 s + tx (number)\n"
                 "of row ty of A and of B: a warp reads 32 consecutive bytes per load (coalesced)", fontsize=9)
    window = 12
    for col, (pitch, what) in enumerate([(stage.BLOCK_K, f"row pitch {stage.BLOCK_K} (unpadded)"),
                                         (stage.B_PITCH, f"row pitch B_PITCH = {stage.B_PITCH} (the kernel's)")]):
        ax = fig.add_subplot(grid[1, col])
        banks = smem_banks(pitch, stage.TILE, window)
        ax.imshow(_bank_image(banks), aspect="auto", interpolation="nearest")
        for (r, k), bank in np.ndenumerate(banks):
            ax.text(k, r, bank, ha="center", va="center", fontsize=5)
        _box(ax, 0, 0, 1, stage.TILE, color="red", lw=2.2)
        distinct = len(set(banks[:, 0]))
        verdict = "conflict-free" if distinct == stage.BANKS else f"a {stage.BANKS // distinct}-way bank conflict"
        ax.set_title(f"b_tile, {what}: the warp reads b_tile[tx, k] for tx = 0..31 at once (red):\n"
                     f"{distinct} bank{'s' if distinct > 1 else ''}, {verdict}", fontsize=9)
        ax.set_xlabel("k (float32 word of the row)")
        ax.set_ylabel("row = threadIdx.x of the reader")
    fig.suptitle("Stage 02's shared tiles; bottom: the bank (shared_word(row, k, pitch) % 32) of each float32. "
                 "a_tile[ty, k] needs no padding: a warp reads one word of it, a broadcast", fontsize=10)
    return fig


# -- stage 03 -------------------------------------------------------------------------------------------------
def micro_tile_map() -> dict[str, np.ndarray]:
    """Owner (tx, ty) of each element of stage 03's BLOCK_M x BLOCK_N block tile, from ``micro_offset``: thread
    (tx, ty) owns rows micro_offset(i, ty) and columns micro_offset(j, tx), i, j < 8. ``count`` is 1 everywhere."""
    stage = lessons.stage(3)
    offset = _py(stage.micro_offset)
    out = {key: np.full((stage.BLOCK_M, stage.BLOCK_N), -1) for key in ("tx", "ty")}
    out["count"] = np.zeros((stage.BLOCK_M, stage.BLOCK_N), int)
    for ty in range(stage.THREADS_M):
        rows = [int(offset(i, ty)) for i in range(stage.THREAD_M)]
        for tx in range(stage.THREADS_N):
            cols = [int(offset(j, tx)) for j in range(stage.THREAD_N)]
            for r in rows:
                for c in cols:
                    out["tx"][r, c], out["ty"][r, c] = tx, ty
                    out["count"][r, c] += 1
    return out


def micro_tile() -> Figure:
    stage = lessons.stage(3)
    offset = _py(stage.micro_offset)
    data = micro_tile_map()
    fig = _figure(15, 7.2)
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 1.25], height_ratios=[0.55, 1])
    ax = fig.add_subplot(grid[:, 0])
    warp = (data["ty"] * stage.THREADS_N + data["tx"]) // 32
    palette = np.array([colormaps["Set3"](i)[:3] for i in range(12)])
    image = palette[warp] * np.where((data["tx"] + data["ty"]) % 2 == 0, 1.0, 0.8)[..., None]
    ax.imshow(image, interpolation="nearest")
    tx, ty = 1, 2
    for i0 in (0, 4):
        for j0 in (0, 4):
            r, c = int(offset(i0, ty)), int(offset(j0, tx))
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 4, 4, fill=False, lw=1.8, ec="black"))
            ax.text(c + 1.5, r - 1.2, f"i{i0}-{i0 + 3}\nj{j0}-{j0 + 3}", fontsize=6, ha="center", va="bottom")
    ax.set_title(f"Stage 03: owner of each element of the {stage.BLOCK_M} x {stage.BLOCK_N} block tile\n(colour = "
                 f"warp, shade = thread); boxed: the 8 x 8 micro-tile of thread\n(tx={tx}, ty={ty}): rows "
                 f"micro_offset(i, ty), columns micro_offset(j, tx),\ntwo runs of 4, {stage.HALF_M} apart", fontsize=9)
    ax.set_xlabel("column of the block tile (n)")
    ax.set_ylabel("row of the block tile (m)")

    ax = fig.add_subplot(grid[0, 1])
    half = stage.BLOCK_N // 2
    groups = np.full((2, half // 4), -1)  # 16-byte groups of 4 words: who reads each
    for t in range(stage.THREADS_N):
        for j in range(stage.THREAD_N):
            c = int(offset(j, t))
            groups[c // half, c % half // 4] = t
    _cells(ax, groups, colormaps["tab20"], -0.5, 19.5, labels=groups, fontsize=8)
    ax.set_yticks([0, 1], ["load 1 (j 0-3)", "load 2 (j 4-7)"])
    ax.set_xticks(range(half // 4), [f"w{4 * g + 64 * 0}-{4 * g + 3}" for g in range(half // 4)], fontsize=6,
                  rotation=90)
    ax.set_xlabel("16 bytes (4 float32 words, 4 banks) of b_tile[k, :]; load 2 is the same 64 words further")
    ax.set_title("one k: the half-warp tx = 0..15 (number = tx) loads b_frag with two 128-bit loads:\n"
                 "tx reads words micro_offset(j, tx) = 4 tx + j (+ 64): 256 contiguous bytes per load,\n"
                 "each bank twice: the two wavefronts 256 bytes need, no more", fontsize=9)
    ax = fig.add_subplot(grid[1, 1])
    ax.axis("off")
    rows_of = [int(offset(i, 2)) for i in range(stage.THREAD_M)]
    cols_of = [int(offset(j, 1)) for j in range(stage.THREAD_N)]
    ax.text(0, 1, "\n".join([
        "per k of a 32-deep tile, thread (tx=1, ty=2):",
        f"  a_frag[i] = a_tile[k, micro_offset(i, 2)],  i = 0..7  -> rows {rows_of}",
        f"  b_frag[j] = b_tile[k, micro_offset(j, 1)],  j = 0..7  -> columns {cols_of}",
        "  partial[i][j] += a_frag[i] * b_frag[j]      64 FFMAs for 16 values read",
        "",
        "the tiles are stored k-major (A^T, B^T), so each run of 4 is one 128-bit shared load;",
        "a warp is 2 values of ty x 16 of tx: its two half-warps read the same b words (broadcast)",
        "and a_tile words 4 ty .. 4 ty + 3 (+ 64), one per half-warp.",
    ]), va="top", ha="left", fontsize=9, family="monospace")
    return fig


# ============================================================================ stage 04: mma.sync, ldmatrix
def fragment_owner(coords, rows: int, cols: int, regs: int, per_reg: int) -> dict[str, np.ndarray]:
    """Invert a fragment map: ``coords(lane, reg, e)`` -> (row, col) of element e of register ``reg``. Returns
    (rows, cols) arrays ``lane``, ``reg``, ``count`` (how many (lane, reg, e) hold the element)."""
    out = {"lane": np.full((rows, cols), -1), "reg": np.full((rows, cols), -1), "count": np.zeros((rows, cols), int)}
    for lane in range(32):
        for reg in range(regs):
            for e in range(per_reg):
                r, c = coords(lane, reg, e)
                out["lane"][r, c], out["reg"][r, c] = lane, reg
                out["count"][r, c] += 1
    return out


def mma_fragment_maps() -> dict[str, dict[str, np.ndarray]]:
    """A (16 x 32 bytes), B (8 n x 32 k bytes, as stored: N rows of K) and C (16 x 8 f32) of mma.m16n8k32."""
    from ptx.vocab import mma_sync
    return {"A": fragment_owner(mma_sync.a_fragment_coords, 16, 32, 4, 4),
            "B": fragment_owner(mma_sync.b_fragment_coords, 8, 32, 2, 4),
            "C": fragment_owner(lambda lane, reg, _: mma_sync.c_fragment_coords(lane, reg), 16, 8, 4, 1)}


def _fragment_panel(ax, owner, name, group):
    lanes, regs = owner["lane"][:, ::group], owner["reg"][:, ::group]
    labels = np.array([[f"T{lane}" for lane in row] for row in lanes])
    _cells(ax, regs, colormaps["Pastel1"], -0.5, 8.5, labels=labels, fontsize=6)
    ax.set_xticks(range(lanes.shape[1]), [f"{group * c}" + (f"-{group * c + group - 1}" if group > 1 else "")
                                          for c in range(lanes.shape[1])], fontsize=6)
    ax.set_yticks(range(lanes.shape[0]))
    ax.tick_params(labelsize=6)
    regs_seen = sorted(set(regs.ravel().tolist()))
    ax.legend(handles=[Patch(color=colormaps["Pastel1"]((r + 0.5) / 9), label=f"{name}{r}") for r in regs_seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)


def mma_fragments() -> Figure:
    maps = mma_fragment_maps()
    fig = _figure(15, 5.6)
    grid = fig.add_gridspec(2, 3, width_ratios=[1.25, 1.25, 0.9], height_ratios=[1, 0.55])
    ax = fig.add_subplot(grid[:, 0])
    _fragment_panel(ax, maps["A"], "a", 4)
    ax.set_title("A: 16 x 32 e4m3, row-major\n(T = lane; each register 4 consecutive k bytes)", fontsize=9)
    ax.set_xlabel("k bytes")
    ax.set_ylabel("row m")
    ax = fig.add_subplot(grid[0, 1])
    _fragment_panel(ax, maps["B"], "b", 4)
    ax.set_title("B: 32 x 8 e4m3, 'col' = stored as 8 n rows of 32 k bytes", fontsize=9)
    ax.set_xlabel("k bytes")
    ax.set_ylabel("column n")
    ax = fig.add_subplot(grid[1, 1])
    ax.axis("off")
    ax.text(0, 1, "g = lane // 4, t = lane % 4; every .b32 register holds 4\nconsecutive k bytes, lowest k in the "
            "lowest byte:\n  a0: row g, k 4t..4t+3    a1: row g+8\n  a2, a3: the same rows at k + 16\n"
            "  b0: n g, k 4t..4t+3      b1: k + 16\n  c0, c1: row g, cols 2t, 2t+1    c2, c3: row g+8\n"
            "ldmatrix delivers exactly these (04_ldmatrix_swizzle)", va="top", fontsize=8, family="monospace")
    ax = fig.add_subplot(grid[:, 2])
    _fragment_panel(ax, maps["C"], "c", 1)
    ax.set_title("C / D: 16 x 8 f32", fontsize=9)
    ax.set_xlabel("column n")
    ax.set_ylabel("row m")
    fig.suptitle("Stage 04: mma.sync.m16n8k32 e4m3 fragments (PTX ISA 'Matrix Fragments for mma.m16n8k32'; "
                 "ptx.vocab.mma_sync a/b/c_fragment_coords): g = lane // 4 picks the row, lane % 4 the k (or column) "
                 "group", fontsize=10)
    return fig


def ldmatrix_roles() -> dict[str, np.ndarray]:
    """Which lane gives ldmatrix.x4 the address of each 16-byte row (A: 16 rows x 2 halves of k32; B: 16 n x 2),
    from a/b_ldmatrix_source; the matrix (= result register) is lane // 8."""
    from ptx.vocab import mma_sync
    out = {}
    for name, source in (("A", mma_sync.a_ldmatrix_source), ("B", mma_sync.b_ldmatrix_source)):
        lanes = np.full((16, 2), -1)
        for lane in range(32):
            row, k = source(lane)
            lanes[row, k // 16] = lane
        out[name] = lanes
    return out


def stage04_swizzle(k_steps: int | None = None) -> dict[str, np.ndarray]:
    """Stage 04's A tile rows 0..15 of warp_m 0, m-tile 0 as stored: for each (row, physical 16-byte chunk),
    the k step and the 16-byte half (0/1) of the k32 slice it holds, from ``a_fragment_offset``, the address the
    generated PTX gives ldmatrix (tests/test_figures.py checks it against the emulator's)."""
    stage = lessons.stage(4)
    steps = stage.K_STEPS if k_steps is None else k_steps
    k_step, half, lane_of = (np.full((16, 8), -1) for _ in range(3))
    for ks in range(steps):
        for lane in range(32):
            offset = stage.a_fragment_offset(0, lane, 0, ks)
            row, chunk = offset // 128, offset % 128 // 16
            k_step[row, chunk], half[row, chunk], lane_of[row, chunk] = ks, lane // 16, lane
    return {"k_step": k_step, "half": half, "lane": lane_of}


def ldmatrix_swizzle() -> Figure:
    roles = ldmatrix_roles()
    swz = stage04_swizzle()
    fig = _figure(15, 6.2)
    grid = fig.add_gridspec(1, 4, width_ratios=[0.55, 0.55, 1, 1])
    for col, name in enumerate(("A", "B")):
        ax = fig.add_subplot(grid[0, col])
        lanes = roles[name]
        _cells(ax, lanes // 8, colormaps["Pastel2"], -0.5, 7.5,
               labels=np.array([[f"L{x}" for x in row] for row in lanes]), fontsize=7)
        ax.set_xticks([0, 1], ["k 0-15", "k 16-31"], fontsize=7)
        ax.set_yticks(range(16))
        ax.tick_params(labelsize=7)
        ax.set_ylabel("row m" if name == "A" else "n (two n8 tiles)")
        ax.set_title(f"ldmatrix.x4 for {name}:\nlane L gives the address of\nthis 16-byte row; colour =\n"
                     "matrix L // 8 = result reg", fontsize=8)
    labels = np.array([[f"k{32 * s + 16 * h}" for s, h in zip(r1, r2)] for r1, r2 in zip(swz["k_step"], swz["half"])])
    logical = np.array([[c // 2 for c in range(8)] for _ in range(16)])
    ax = fig.add_subplot(grid[0, 2])
    _cells(ax, logical, colormaps["Set2"], -0.5, 7.5,
           labels=np.array([[f"k{16 * c}" for c in range(8)] for _ in range(16)]), fontsize=7)
    _box(ax, 0, 0, 1, 8, color="red")
    ax.set_title("unswizzled: byte k of row r at r * 128 + k;\nthe 8 rows of one ldmatrix phase (red) share\n"
                 "one 16-byte bank group: 8-way conflict", fontsize=8)
    ax.set_xlabel("16-byte chunk of the 128-byte row (= 4 banks)")
    ax.set_ylabel("row of the A tile")
    ax = fig.add_subplot(grid[0, 3])
    _cells(ax, swz["k_step"], colormaps["Set2"], -0.5, 7.5, labels=labels, fontsize=7)
    for lane in range(8):  # matrix 0 of k step 0: lanes 0..7 give rows 0..7, k bytes 0..15
        offset = lessons.stage(4).a_fragment_offset(0, lane, 0, 0)
        _box(ax, offset % 128 // 16, offset // 128, 1, 1, color="red")
    ax.set_title("stored (stage 04): chunk c of row r at c ^ (r % 8)\n(shared_memory.swizzled_offset, a_fragment_offset): "
                 "the same\nphase (red) hits 8 different bank groups", fontsize=8)
    ax.set_xlabel("physical 16-byte chunk (label: its logical k bytes)")
    ax.set_ylabel("row of the A tile")
    fig.suptitle("Stage 04: ldmatrix lane roles (ptx.vocab.mma_sync) and the XOR swizzle that makes its reads and the "
                 "cp.async writes conflict-free", fontsize=10)
    return fig


# ============================================================================ stage 05: wgmma
def descriptor_example() -> list[tuple[str, int, dict[str, int]]]:
    """Descriptors stage 05 builds for the A tile of ring stage 1, warpgroup 1 (shared base 0), k steps 0..3:
    (label, 64-bit value, decoded fields), from descriptor_value (the PTX's arithmetic) and the generator's
    k32 advance."""
    from ptx.vocab import wgmma as w
    stage = lessons.stage(5)
    address = 1 * stage.A_TILE + 1 * 64 * stage.BLOCK_K
    out = []
    for step in range(stage.BLOCK_K // w.K32_STEP_BYTES):
        value = w.descriptor_value(address) + (step * w.K32_STEP_BYTES >> 4)  # the generator's add.s64
        out.append((f"k step {step}: A tile of ring stage 1, warpgroup 1 (+{step * w.K32_STEP_BYTES} bytes), shared "
                    "base 0", value,
                    w.descriptor_fields(value)))
    return out


def wgmma_descriptor() -> Figure:
    from ptx.vocab import wgmma as w
    examples = descriptor_example()
    fig = _figure(15, 4.4)
    grid = fig.add_gridspec(2, 1, height_ratios=[1.1, 1])
    ax = fig.add_subplot(grid[0])
    colors = dict(zip(w.DESCRIPTOR_FIELDS, [colormaps["Set2"](i) for i in range(8)]))
    label, value, fields = examples[0]
    for bit in range(64):
        owner = next((name for name, (first, width) in w.DESCRIPTOR_FIELDS.items() if first <= bit < first + width),
                     None)
        x = 63 - bit
        ax.add_patch(Rectangle((x, 0), 1, 1, fc=colors[owner] if owner else "0.92", ec="white", lw=0.8))
        ax.text(x + 0.5, 0.5, str(value >> bit & 1), ha="center", va="center", fontsize=7)
        if bit % 8 == 0 or owner and bit == w.DESCRIPTOR_FIELDS[owner][0]:
            ax.text(x + 0.5, -0.25, str(bit), ha="center", va="top", fontsize=6)
    for name, (first, width) in w.DESCRIPTOR_FIELDS.items():
        shown = fields[name]
        stored = value >> first & ((1 << width) - 1)
        unit = f"{shown} bytes" if name in ("start_address", "leading_byte_offset", "stride_byte_offset") else \
            (f"{shown}B" if name == "swizzle" else str(shown))
        ax.text(63 - first - width / 2 + 1, 1.2, f"{name}\nbits {first}-{first + width - 1}\n= {stored} -> {unit}",
                ha="center", va="bottom", fontsize=7)
    ax.set_xlim(-0.5, 64.5)
    ax.set_ylim(-1.0, 2.6)
    ax.axis("off")
    ax.set_title(f"wgmma matrix descriptor (PTX ISA 'Matrix Descriptor Format'; ptx.vocab.wgmma.DESCRIPTOR_FIELDS): "
                 f"{label}, value {value:#018x}", fontsize=9)
    ax = fig.add_subplot(grid[1])
    ax.axis("off")
    constant = w.descriptor_constant_part()
    lines = [f"constant part (every field but the start address, computed once by the generator): {constant:#018x} = "
             + ", ".join(f"{k} {v}" for k, v in w.descriptor_fields(constant).items() if k != "start_address"),
             "run time (wgmma_descriptor's shr/and/cvt/or, mirrored by descriptor_value): "
             "((shared address >> 4) & 0x3fff) | constant; each k32 step adds 32 bytes = 2 to the descriptor:", ""]
    for label, value, fields in examples:
        lines.append(f"    {value:#018x}   start address {fields['start_address']:6d} = {fields['start_address']:#07x}"
                     f"   ({label})")
    lines += ["", "stride byte offset 1024: the next 8-row swizzle atom (rows 8..15 of the tile); the leading byte "
              "offset is unused for a K-major 128B-swizzled tile whose K (128 bytes) is one swizzle row;",
              "the hardware XORs address bits 4-6 with bits 7-9, so the tile must be 1024-byte aligned and a k step "
              "is a plain +32 on the start address (see 05_sw128_atom)."]
    ax.text(0, 1, "\n".join(lines), va="top", ha="left", fontsize=8, family="monospace")
    return fig


def sw128_layout() -> np.ndarray:
    """(row 0..7, physical 16-byte chunk) -> logical chunk it stores, from sw128_offset (one 1024-byte atom)."""
    from ptx.vocab import wgmma as w
    logical = np.full((8, 8), -1)
    for row in range(8):
        for chunk in range(8):
            physical = w.sw128_offset(row, 16 * chunk)
            logical[physical // w.SW128_ROW_BYTES, physical % w.SW128_ROW_BYTES // 16] = chunk
    return logical


def sw128_atom() -> Figure:
    from ptx.vocab import wgmma as w
    logical = sw128_layout()
    fig = _figure(14, 4.6)
    axes = fig.subplots(1, 2)
    _cells(axes[0], np.tile(np.arange(8), (8, 1)) // 2, colormaps["Set2"], -0.5, 7.5,
           labels=np.array([[f"c{c}" for c in range(8)] for _ in range(8)]), fontsize=8)
    axes[0].set_title("logical: row r of K bytes, chunk c = bytes 16c..16c+15;\ncolour = the wgmma k32 step "
                      "that reads it (2 chunks per step)", fontsize=9)
    _cells(axes[1], logical // 2, colormaps["Set2"], -0.5, 7.5,
           labels=np.array([[f"c{c}" for c in row] for row in logical]), fontsize=8)
    for row in range(8):
        physical = w.sw128_offset(row, 0) % w.SW128_ROW_BYTES // 16
        _box(axes[1], physical, row, 1, 1, color="red", lw=1.6)
    axes[1].set_title("stored (sw128_offset; TMA writes it, wgmma reads it): chunk c of row r at c ^ (r % 8);\n"
                      "red: chunk 0 of each row, 8 rows in 8 different 16-byte bank groups", fontsize=9)
    for ax in axes:
        ax.set_xlabel("16-byte chunk of the 128-byte row")
        ax.set_ylabel("row (of the 8-row, 1024-byte atom)")
    fig.suptitle(f"Stage 05: the 128-byte swizzle atom ({w.SW128_ATOM_BYTES} bytes; rows 8.. repeat it, "
                 "the descriptor's stride byte offset is one atom)", fontsize=10)
    return fig


def accumulator_map(n: int = 128) -> dict[str, np.ndarray]:
    """(64 x n) arrays ``warp``, ``lane``, ``index``, ``count`` of wgmma m64nNk32's f32 accumulator fragment."""
    from ptx.vocab import wgmma as w
    out = {key: np.full((64, n), -1) for key in ("warp", "lane", "index")}
    out["count"] = np.zeros((64, n), int)
    for warp in range(4):
        for lane in range(32):
            for index in range(n // 2):
                r, c = w.accumulator_coords(warp, lane, index)
                out["warp"][r, c], out["lane"][r, c], out["index"][r, c] = warp, lane, index
                out["count"][r, c] += 1
    return out


def wgmma_accumulator() -> Figure:
    n = 128
    data = accumulator_map(n)
    fig = _figure(15, 5.8)
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 1.15])
    ax = fig.add_subplot(grid[0])
    palette = np.array([colormaps["Pastel1"](i)[:3] for i in range(4)])
    shade = np.where((data["index"] // 4) % 2 == 0, 1.0, 0.82)
    ax.imshow(palette[data["warp"]] * shade[..., None], aspect="auto", interpolation="nearest")
    for warp in range(4):
        ax.text(n / 2, 16 * warp + 7.5, f"warp {warp}: rows {16 * warp}-{16 * warp + 15}", ha="center", fontsize=8)
    _box(ax, 0, 0, 16, 16, color="red")
    ax.set_title(f"m64n{n}k32 f32 accumulators of one warpgroup: {n // 2} registers a thread;\nwarp w owns rows "
                 "16w..16w+15, each 8-column group is 4 registers (shade)", fontsize=9)
    ax.set_xlabel("column n")
    ax.set_ylabel("row m")
    ax = fig.add_subplot(grid[1])
    labels = np.array([[f"T{lane}\nd{i}" for lane, i in zip(lr, ir)]
                       for lr, ir in zip(data["lane"][:16, :16], data["index"][:16, :16])])
    _cells(ax, data["index"][:16, :16] % 4, colormaps["Pastel2"], -0.5, 7.5, labels=labels, fontsize=5)
    ax.set_xticks(range(16))
    ax.set_yticks(range(16))
    ax.tick_params(labelsize=6)
    ax.set_title("zoom (red box): warp 0, columns 0-15. d[i] of lane l sits at row l/4 + 8((i/2)%2),\n"
                 "column 8(i/4) + 2(l%4) + i%2 (ISA 'Register Fragments'): mma.sync's C layout,\n"
                 "repeated for every 8 columns", fontsize=9)
    fig.suptitle("Stage 05: the wgmma accumulator fragment (ptx.vocab.wgmma.accumulator_coords)", fontsize=10)
    return fig


# ============================================================================ stages 06-07: traced rings
@dataclass(frozen=True)
class Event:
    """One traced instruction. ``step``: the CTA's instruction count just after it (the emulator's clock, which
    interleaves the warpgroups as its cooperative scheduler ran them); ``local``: the instructions its own
    warpgroup had executed by then."""
    step: int
    local: int
    cta: tuple
    warpgroup: int
    kind: str  # expect_tx | arrive | wait (a try_wait that passed) | block (one that did not) | complete (a phase
    #            completed) | tma (a TMA load) | mma (wgmma.mma_async) | wgmma_wait (wgmma.wait_group)
    address: int | None = None  # the mbarrier's shared offset
    parity: int | None = None  # waited parity; for "complete", the parity of the phase that completed
    threads: int = 0


@contextlib.contextmanager
def trace_barriers():
    """Record the mbarrier, TMA-load and wgmma events of every kernel the emulator (ptx.emulate) runs inside the
    ``with`` (a list of :class:`Event`): wraps :class:`ptx.emulate.Warpgroup`'s methods, restored on exit."""
    from ptx.emulate.warpgroup import Warpgroup
    events: list[Event] = []
    original = {name: getattr(Warpgroup, name) for name in ("advance", "mbarrier", "bulk", "wgmma")}
    local, entry = {}, {}  # per warpgroup: instructions before this turn, CTA step at the start of this turn

    def record(self, kind, address=None, parity=None, threads=0):
        key = id(self)
        own = local.get(key, 0) + self.cta.steps - entry.get(key, self.cta.steps)
        events.append(Event(self.cta.steps, own, self.cta.ctaid, self.index, kind, address, parity, threads))

    def completions(self, before):
        for address, barrier in self.cta.barriers.items():
            for phase in range(before.get(address, 0), barrier.phase):
                record(self, "complete", address, phase % 2)

    def advance(self):
        key = id(self)
        entry[key] = self.cta.steps
        try:
            return original["advance"](self)
        finally:
            local[key] = local.get(key, 0) + self.cta.steps - entry.pop(key)

    def mbarrier(self, opcode, kind, ops, mask):
        if not mask.any() or kind == "init":
            return original["mbarrier"](self, opcode, kind, ops, mask)
        operands = ops if kind == "expect_tx" else ops[1:]
        address = int(self.address(operands[0])[mask][0])
        waits = kind in ("try_wait", "test_wait")
        parity = int(self.value(operands[1])[mask][0]) & 1 if waits else None
        before = {a: b.phase for a, b in self.cta.barriers.items()}
        original["mbarrier"](self, opcode, kind, ops, mask)
        name = ("block" if self.wait is not None else "wait") if waits else \
            ("expect_tx" if "expect_tx" in opcode else kind)
        record(self, name, address, parity, int(mask.sum()))
        completions(self, before)

    def bulk(self, parts, ops, mask, *args, **kwargs):
        before = {a: b.phase for a, b in self.cta.barriers.items()}
        result = original["bulk"](self, parts, ops, mask, *args, **kwargs)
        if mask.any() and parts[3:5] == ["tensor", "2d"] and parts[5].startswith("shared"):
            record(self, "tma", int(self.address(ops[2])[mask][0]), threads=int(mask.sum()))
        completions(self, before)
        return result

    def wgmma(self, parts, ops, mask):
        result = original["wgmma"](self, parts, ops, mask)
        if parts[1] in ("mma_async", "wait_group"):
            record(self, "mma" if parts[1] == "mma_async" else "wgmma_wait")
        return result

    Warpgroup.advance, Warpgroup.mbarrier, Warpgroup.bulk, Warpgroup.wgmma = advance, mbarrier, bulk, wgmma
    try:
        yield events
    finally:
        for name, method in original.items():
            setattr(Warpgroup, name, method)


@dataclass(frozen=True)
class Timing:
    """The model a trace is replayed with: every traced instruction takes one step of its own warpgroup
    (warpgroups run in parallel), a TMA load lands ``tma`` steps after it is issued, and each wgmma.mma_async
    holds the SM's tensor cores for ``wgmma`` steps (the warpgroups' wgmmas queue for them). Defaults: about an
    H100's cycles (a m64n128k32 e4m3 wgmma is 524,288 FLOP at ~8,192 FLOP per cycle per SM; an L2 hit ~600)."""
    tma: int = 600
    wgmma: int = 64


def replay(events, timing: Timing = Timing()) -> tuple[list[float], list[float]]:
    """(time of each event, time its warpgroup reached it) under ``timing``: each warpgroup keeps its own
    instruction counts between its events (``Event.local``) and every dependency the trace shows holds: a passed
    wait is no earlier than the completion of the phase it waited for (it was *reached* earlier when it had to
    wait), a full phase completes when its last TMA load lands, an empty phase at its last arrival, and
    wgmma.wait_group when its warpgroup's wgmmas are done."""
    times, arrivals, clock, last_local = [], [], {}, {}
    completed: dict = {}  # (cta, address) -> completion times of its phases, in order
    tensor_cores_free, in_flight = 0.0, {}
    cause = {}  # warpgroup -> (time, kind) of its last non-completion event
    for e in events:
        key = (e.cta, e.warpgroup)
        if e.kind == "complete":
            when, kind = cause[key]
            completed.setdefault((e.cta, e.address), []).append(when + (timing.tma if kind == "tma" else 0))
            times.append(completed[(e.cta, e.address)][-1])
            arrivals.append(times[-1])
            continue
        t = clock.get(key, 0.0) + e.local - last_local.get(key, 0)
        arrivals.append(t)
        if e.kind == "wait":
            phases = completed.get((e.cta, e.address), [])
            index = len(phases) - 1 if (len(phases) - 1) % 2 == e.parity else len(phases) - 2
            if index >= 0:  # else the fresh barrier's phase "-1", complete from the start
                t = max(t, phases[index])
        elif e.kind == "mma":
            tensor_cores_free = max(t, tensor_cores_free) + timing.wgmma
            in_flight.setdefault(key, []).append(tensor_cores_free)
        elif e.kind == "wgmma_wait":
            t = max([t, *in_flight.pop(key, [])])
        clock[key], last_local[key] = t, e.local
        cause[key] = (t, e.kind)
        times.append(t)
    return times, arrivals


@dataclass(frozen=True)
class RingTrace:
    """A traced run of one CTA's TMA ring: ``stages`` stages whose full/empty mbarriers sit at
    ``full_region + 8 s`` / ``empty_region + 8 s``; ``producer`` is the warpgroup of the TMA-issuing thread."""
    title: str
    stages: int
    k_blocks: int
    producer: int
    math: tuple[int, ...]
    full_region: int
    empty_region: int
    events: tuple[Event, ...]

    def barrier(self, address: int) -> tuple[str, int]:
        for kind, region in (("full", self.full_region), ("empty", self.empty_region)):
            if region <= address < region + 8 * self.stages:
                return kind, (address - region) // 8
        raise ValueError(f"shared offset {address} is no barrier of the ring")


def _ring_input(m: int, n: int, k: int):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x38, (m, k), dtype=np.uint8)  # small positive e4m3 values
    b = rng.integers(0, 0x38, (n, k), dtype=np.uint8)
    return a, np.ones((m, k // 128), np.float32), b, np.ones((-(-n // 128), k // 128), np.float32)


def stage06_trace(k_blocks: int = 10) -> RingTrace:
    """Stage 06's kernel with the ladder shape's plan (128 x 128 blocks and its stage count), run by the emulator
    on one tile with K = ``k_blocks`` x 128, traced."""
    from gemm.fp8 import align
    from ptx.emulate import FakeTensorMap, run_kernel
    stage = lessons.stage(6)
    ladder = stage.Plan(*LADDER_SHAPE)
    m, n, k = ladder.block_m, ladder.block_n, k_blocks * 128
    plan = stage.Plan(m, n, k, (ladder.block_m, ladder.block_n))
    a, sa, b, sb = _ring_input(m, n, k)
    storage = np.zeros((k // 128, align(m, 4)), np.float32)
    storage[:, :m] = sa.T
    arrays = {"tmap_a": a, "tmap_b": b, "tmap_sa": storage}
    maps = {name: FakeTensorMap(arrays[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in stage.tensor_map_specs(plan, align(m, 4)).items()}
    with trace_barriers() as events:
        run_kernel(stage.generate_for(plan), stage.KERNEL, plan.grid, plan.threads, plan.shared_bytes,
                   dict(**maps, sb=sb, d=np.zeros((m, n), np.uint16)))
    return RingTrace(f"Stage 06: {plan.block_m} x {plan.block_n} tile, {plan.stages} stages, thread 0 of warpgroup "
                     f"0 produces inline, {plan.ahead} K blocks ahead", plan.stages, k_blocks, 0,
                     tuple(range(plan.block_m // 64)), plan.full_region, plan.empty_region,
                     tuple(e for e in events if e.cta == (0, 0)))


def stage07_trace(k_blocks: int = 10) -> RingTrace:
    """Stage 07's config at the ladder shape, run by gemm.testing.emulated.run_gemm on one tile with K = k_blocks x 128."""
    from gemm.testing.emulated import run_gemm
    from gemm.kernel import SharedPlan
    config = lessons.stage(7).config(*LADDER_SHAPE)
    m, n, k = config.block_m, config.block_n, k_blocks * 128
    with trace_barriers() as events:
        run_gemm(config, *_ring_input(m, n, k), sm_count=1)
    plan = SharedPlan(config, n, k)
    return RingTrace(f"Stage 07: {config.describe()}", config.stages, k_blocks, config.math_warpgroups,
                     tuple(range(config.math_warpgroups)), plan.full_region, plan.empty_region,
                     tuple(e for e in events if e.cta == (0, 0)))


def ring_schedule(trace: RingTrace, replayed=None) -> dict[str, list[dict]]:
    """The trace read as the ring's bookkeeping, at the times of ``replayed`` (:func:`replay`'s result; default
    the emulator's steps). ``loads``: per K block j in issue order, {j, stage, issue (its arrive.expect_tx),
    full_parity (of the phase its bytes complete), released (its empty phase completed), producer_parity (the
    empty parity waited on before it; None for the prologue's unwaited loads), producer_blocked (when the
    producer reached that wait, if it had to wait)}. ``uses``: per math warpgroup and K block i, {warpgroup, i,
    stage, parity (the full parity waited on), reached (the wait), start (passed), wgmma_done, release}."""
    times, arrivals = replayed if replayed is not None else ([e.step for e in trace.events],) * 2
    loads, uses, reached, pending = [], {w: [] for w in trace.math}, {}, None
    full_done = {s: [] for s in range(trace.stages)}
    empty_done = {s: [] for s in range(trace.stages)}
    for e, t, arrived in zip(trace.events, times, arrivals):
        if e.kind in ("mma", "tma"):
            continue
        if e.kind == "wgmma_wait":
            if e.warpgroup in uses and uses[e.warpgroup]:
                uses[e.warpgroup][-1]["wgmma_done"] = t
            continue
        kind, stage = trace.barrier(e.address)
        key = (e.warpgroup, e.address)
        if e.kind == "block":
            reached.setdefault(key, arrived)
        elif e.kind == "wait" and kind == "empty" and e.warpgroup == trace.producer:
            pending = (e.parity, reached.pop(key, arrived), t, stage)
        elif e.kind == "wait" and kind == "full" and e.warpgroup in uses:
            uses[e.warpgroup].append(dict(warpgroup=e.warpgroup, i=len(uses[e.warpgroup]), stage=stage,
                                          parity=e.parity, reached=reached.pop(key, arrived), start=t,
                                          wgmma_done=None, release=None))
        elif e.kind == "expect_tx":
            parity, since, passed, waited = pending if pending else (None, None, None, stage)
            if waited != stage:
                raise ValueError(f"the producer waited on stage {waited} and loaded stage {stage}")
            loads.append(dict(j=len(loads), stage=stage, issue=t, producer_parity=parity,
                              producer_blocked=since if since is not None and passed > since else None,
                              full_parity=None, released=None))
            pending = None
        elif e.kind == "arrive" and kind == "empty" and e.warpgroup in uses and uses[e.warpgroup]:
            uses[e.warpgroup][-1]["release"] = t
        elif e.kind == "complete":
            (full_done if kind == "full" else empty_done)[stage].append((t, e.parity))
    for load in loads:
        nth = load["j"] // trace.stages  # the n-th use of its stage
        if nth < len(full_done[load["stage"]]):
            load["full_parity"] = full_done[load["stage"]][nth][1]
        if nth < len(empty_done[load["stage"]]):
            load["released"] = empty_done[load["stage"]][nth][0]
    return {"loads": loads, "uses": [u for w in trace.math for u in uses[w]]}


def _ring_timeline(trace: RingTrace, note: str, timing: Timing = Timing()) -> Figure:
    schedule = ring_schedule(trace, replay(trace.events, timing))
    loads, uses = schedule["loads"], schedule["uses"]
    end = max([u["release"] or u["start"] for u in uses] + [x["released"] or x["issue"] for x in loads])
    fig = _figure(15, 2.4 + 0.5 * (trace.stages + len(trace.math) + 1))
    ax = fig.add_subplot()
    rows = {f"producer (warpgroup {trace.producer})": 0,
            **{f"math warpgroup {w}": 1 + i for i, w in enumerate(trace.math)}}
    rows.update({f"stage {s}": len(rows) + s for s in range(trace.stages)})
    parity_color = {0: "tab:blue", 1: "tab:purple", None: "0.6"}
    h = 0.34
    blocked = dict(fc="none", ec="tab:red", hatch="////", lw=0.6)
    y = 0
    for load in loads:
        if load["producer_blocked"] is not None:
            ax.broken_barh([(load["producer_blocked"], load["issue"] - load["producer_blocked"])], (y - h, 2 * h),
                           **blocked)
        ax.plot(load["issue"], y, marker="v", color=parity_color[load["full_parity"]], ms=7)
    groups = []  # loads issued close together share one label
    for load in loads:
        if groups and load["issue"] - groups[-1][0]["issue"] < end / 40:
            groups[-1].append(load)
        else:
            groups.append([load])
    for group in groups:
        parities = {x["producer_parity"] for x in group}
        waited = "no wait" if parities == {None} else ("E" + "/".join(str(p) for p in sorted(parities - {None})))
        ks = f"k{group[0]['j']}" + (f"-k{group[-1]['j']}" if len(group) > 1 else "")
        ax.text(group[0]["issue"], y - 0.42, f"{ks}\n{waited}", ha="center" if len(group) == 1 else "left",
                va="bottom", fontsize=6)
    for use in uses:
        y = rows[f"math warpgroup {use['warpgroup']}"]
        if use["start"] > use["reached"]:
            ax.broken_barh([(use["reached"], use["start"] - use["reached"])], (y - h, 2 * h), **blocked)
        done = use["wgmma_done"] or use["start"]
        ax.broken_barh([(use["start"], done - use["start"])], (y - h, 2 * h), fc="tab:orange")
        following = [u["reached"] for u in uses if u["warpgroup"] == use["warpgroup"] and u["i"] == use["i"] + 1]
        stop = following[0] if following else max(done, use["release"] or done)
        ax.broken_barh([(done, stop - done)], (y - h, 2 * h), fc="tab:green", alpha=0.6)
        if use["release"] is not None:
            ax.plot([use["release"]] * 2, [y - 0.45, y + 0.45], color="black", lw=1.6)
        ax.text(use["start"] + end / 400, y, f"k{use['i']}\nF{use['parity']}", va="center", fontsize=6)
    for load in loads:
        y = rows[f"stage {load['stage']}"]
        stop = load["released"] if load["released"] is not None else end
        color = parity_color[load["full_parity"]]
        ax.broken_barh([(load["issue"], timing.tma)], (y - h, 2 * h), fc="none", ec=color, hatch="....", lw=0.6)
        ax.broken_barh([(load["issue"] + timing.tma, max(stop - load["issue"] - timing.tma, 0))], (y - h, 2 * h),
                       fc=color, alpha=0.35, ec=color)
        ax.text(load["issue"] + end / 300, y, f"k{load['j']}: full phase parity {load['full_parity']}", va="center",
                fontsize=6)
    ax.set_yticks(list(rows.values()), list(rows))
    ax.set_ylim(len(rows) - 0.4, -0.9)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(f"modelled time (steps ~ cycles): each traced instruction 1 step of its warpgroup, a TMA load "
                  f"lands {timing.tma} steps after issue, a wgmma holds the tensor cores {timing.wgmma} steps "
                  "(lessons.figures.Timing)")
    ax.legend(handles=[Patch(fc="none", ec="tab:blue", hatch="....", label="TMA in flight"),
                       Patch(fc="tab:blue", alpha=0.35, label="stage holds K block k (full parity 0) .. released"),
                       Patch(fc="tab:purple", alpha=0.35, label="... full parity 1 (it flips at every wrap)"),
                       Patch(fc="tab:orange", label="wgmma: full wait passed .. wait_group"),
                       Patch(fc="tab:green", alpha=0.6, label="promotion FFMAs, rest of the iteration"),
                       Patch(**blocked, label="waiting on an mbarrier")],
              loc="upper center", bbox_to_anchor=(0.5, -0.09), fontsize=7, ncol=6)
    ax.set_title(f"{trace.title}; {trace.k_blocks} K blocks.\n{note}\n▼ k: the producer's arrive.expect_tx + "
                 "TMA for K block k, E = the empty parity it waited on; F = the full parity a math warpgroup waited "
                 "on; | = its release (arrive on empty).\nEvents, their order per warpgroup and the parities are "
                 "the emulated kernel's (ptx.emulate, traced); the times are that trace replayed with the model "
                 "below.", fontsize=8)
    return fig


def tma_ring_timeline() -> Figure:
    return _ring_timeline(stage06_trace(), "Thread 0 refills stage (i + S - 2) % S before its own K block i, once "
                          "both warpgroups released it; the release comes after the promotion.")


def producer_consumer_timeline() -> Figure:
    return _ring_timeline(stage07_trace(), "The producer warpgroup runs up to S K blocks ahead; the math "
                          "warpgroups release a stage before their promotion FFMAs.")


# ============================================================================ stage 08: the tile raster
def raster_map(m_blocks: int, n_blocks: int, grid: int, group: int) -> dict[str, np.ndarray]:
    """(m_blocks x n_blocks) arrays ``owner`` (CTA), ``step`` (its index in that CTA's walk), ``count`` (times the
    tile is computed), from gemm.kernel.tile_scheduler.schedule: the walk the persistent kernel's PTX computes."""
    from gemm.kernel.tile_scheduler import schedule
    out = {"owner": np.full((m_blocks, n_blocks), -1), "step": np.full((m_blocks, n_blocks), -1),
           "count": np.zeros((m_blocks, n_blocks), int)}
    for cta in range(grid):
        for step, (mb, nb) in enumerate(schedule(cta, grid, m_blocks, n_blocks, group)):
            out["owner"][mb, nb], out["step"][mb, nb] = cta, step
            out["count"][mb, nb] += 1
    return out


def wave_footprint(m_blocks: int, n_blocks: int, grid: int, group: int) -> float:
    """Mean over waves of (distinct A row blocks + distinct B column blocks) the wave's tiles read."""
    from gemm.kernel.tile_scheduler import tile_coords
    coords = [tile_coords(t, m_blocks, n_blocks, group) for t in range(m_blocks * n_blocks)]
    waves = [coords[w:w + grid] for w in range(0, len(coords), grid)]
    return float(np.mean([len({mb for mb, _ in wave}) + len({nb for _, nb in wave}) for wave in waves]))


def tile_raster(m_blocks: int = 12, n_blocks: int = 20, grid: int = 13, groups=(0, 4)) -> Figure:
    """The persistent schedule of a toy GPU: tiles coloured by CTA, labelled with the step; boxed, the first wave."""
    from gemm.kernel.tile_scheduler import tile_coords
    fig = _figure(7 * len(groups), 4.8)
    for ax, group in zip(np.atleast_1d(fig.subplots(1, len(groups))), groups):
        data = raster_map(m_blocks, n_blocks, grid, group)
        ax.imshow(data["owner"], cmap=colormaps["tab20"].resampled(20), vmin=-0.5, vmax=19.5, interpolation="nearest")
        for (mb, nb), step in np.ndenumerate(data["step"]):
            ax.text(nb, mb, step, ha="center", va="center", fontsize=7)
        for t in range(grid):
            mb, nb = tile_coords(t, m_blocks, n_blocks, group)
            _box(ax, nb, mb, 1, 1)
        name = "row-major (G = 0)" if group == 0 else f"grouped, G = {group}"
        ax.set_title(f"{name}: {wave_footprint(m_blocks, n_blocks, grid, group):.1f} A+B blocks read per wave",
                     fontsize=10)
        ax.set_xlabel("n block")
        ax.set_ylabel("m block")
    fig.suptitle(f"Stage 08: gemm.kernel.tile_scheduler.schedule, {m_blocks} x {n_blocks} tiles on {grid} CTAs "
                 "(colour = CTA, number = its step; boxed: the first wave, the tiles in flight together)", fontsize=10)
    return fig


# ============================================================================ stage 09: cluster multicast
def cluster_steps(grid: int, m_blocks: int, n_blocks: int, group: int) -> list[tuple]:
    """[(cluster, step, rank 0's tile, rank 1's tile or None, A multicast)]: CTAs 2c and 2c + 1 walk their
    ``schedule`` side by side; TileScheduler.pair_flags multicasts A when both have a tile and the tiles share
    their m block (the pair's tiles are t and t + 1, t even: the same rule from the pair's first tile)."""
    from gemm.kernel.tile_scheduler import schedule
    steps = []
    for cluster in range(grid // 2):
        walks = [schedule(2 * cluster + rank, grid, m_blocks, n_blocks, group) for rank in (0, 1)]
        for step, (first, second) in enumerate(zip_longest(*walks)):
            steps.append((cluster, step, first, second, second is not None and first[0] == second[0]))
    return steps


def census(steps) -> tuple[int, int, int]:
    """(pairs that multicast A, pairs split across rows, steps where rank 0 has no peer tile)."""
    shared = sum(s[4] for s in steps)
    lone = sum(s[3] is None for s in steps)
    return shared, len(steps) - shared - lone, lone


def cluster_multicast(cases=((6, 10), (5, 9)), grid: int = 8, group: int = 4) -> Figure:
    fig = _figure(15, 4.6)
    axes = fig.subplots(1, len(cases), gridspec_kw={"width_ratios": [n for _, n in cases]})
    colors = colormaps["tab10"]
    for ax, (m_blocks, n_blocks) in zip(np.atleast_1d(axes), cases):
        steps = cluster_steps(grid, m_blocks, n_blocks, group)
        image = np.ones((m_blocks, n_blocks, 3))
        for cluster, step, first, second, shared in steps:
            for rank, tile in enumerate((first, second)):
                if tile is not None:
                    color = np.array(colors(cluster)[:3])
                    image[tile] = color if rank == 0 else 0.55 * color + 0.45  # rank 1: the same hue, lighter
            if shared:
                left = min(first[1], second[1])
                ax.add_patch(Rectangle((left - 0.45, first[0] - 0.45), 1.9, 0.9, fill=False, lw=2.2, ec="black"))
            elif second is not None:
                ax.plot([first[1] + 0.3, second[1] + 0.3], [first[0], second[0]], "k--", lw=1.6)
            else:
                ax.add_patch(Rectangle((first[1] - 0.45, first[0] - 0.45), 0.9, 0.9, fill=False, lw=2, ls=":",
                                       ec="black"))
        ax.imshow(image, interpolation="nearest")
        for cluster, step, first, second, _ in steps:
            for rank, tile in enumerate((first, second)):
                if tile is not None:
                    ax.text(tile[1], tile[0] + 0.25, f"{rank}·{step}", ha="center", va="center", fontsize=7)
        shared, split, lone = census(steps)
        ax.set_title(f"{m_blocks} x {n_blocks} tiles, {grid} CTAs = {grid // 2} clusters, G = {group}:\n"
                     f"{shared} pairs multicast A, {split} split across rows, lone CTA steps: {lone}", fontsize=10)
        ax.set_xlabel("n block")
        ax.set_ylabel("m block")
    fig.suptitle("Stage 09: 2-CTA clusters (colour = cluster, lighter = rank 1, label rank·step). Boxed pair: same m "
                 "block, rank 0 multicasts A to both; dashed: rows differ, each loads its own A; dotted: no peer tile",
                 fontsize=10)
    return fig


# ============================================================================ stage 10: yield and reuse bits
DECODE_SHAPE = (64, 7168, 16384)  # one math warpgroup (256 threads): ptxas writes no yields there


def ffma_listings(shapes=(LADDER_SHAPE, DECODE_SHAPE)) -> dict:
    """{(m, n, k): (stage 09 SASS, stage 10 SASS, threads)}: the cubins assembled (ptxas/nvJitLink, no GPU) and
    disassembled (nvdisasm)."""
    from lessons.diff_stages import stage_cubin
    from ptx.sass import disassemble
    return {shape: (disassemble(stage_cubin(9, *shape)), disassemble(stage_cubin(10, *shape)),
                    lessons.stage(10).config(*shape).threads) for shape in shapes}


def ffma_bits(before, after) -> dict[str, np.ndarray]:
    """Per FFMA of the listings, in order: the yield and Rb-reuse bits before and after, and which changed."""
    from ptx.passes import is_yield, reuse_b
    old = [i for i in before if i.opcode == "FFMA"]
    new = [i for i in after if i.opcode == "FFMA"]
    if [(i.function, i.offset) for i in old] != [(i.function, i.offset) for i in new]:
        raise ValueError("the two listings do not have the same FFMAs at the same offsets")
    return {"yield_before": np.array([is_yield(i.encoding) for i in old], bool),
            "yield_after": np.array([is_yield(i.encoding) for i in new], bool),
            "reuse_before": np.array([reuse_b(i.encoding) for i in old], bool),
            "reuse_after": np.array([reuse_b(i.encoding) for i in new], bool),
            "changed": np.array([x.encoding != y.encoding for x, y in zip(old, new)], bool)}


def ffma_yield_bits(listings: dict | None = None) -> Figure:
    """``listings``: {(m, n, k): (before, after, threads)} (ffma_listings() when None)."""
    from ptx.passes import FLIP_MASK, NO_YIELD_BIT, REUSE_B_BIT, ffma_runs
    listings = ffma_listings() if listings is None else listings
    fig = _figure(15, 1.6 + 2.3 * len(listings))
    axes = fig.subplots(len(listings) + 1, 1, gridspec_kw={"height_ratios": [0.55] + [1] * len(listings)})
    ax = axes[0]
    for bit in range(64):
        special = {NO_YIELD_BIT: ("tab:green", "45: no-yield (inverted)"), REUSE_B_BIT: ("tab:orange", "59: Rb reuse")}
        color, label = special.get(bit, ("0.93", None))
        ax.add_patch(Rectangle((63 - bit, 0), 1, 1, fc=color, ec="white"))
        ax.text(63 - bit + 0.5, 0.5, str(FLIP_MASK >> bit & 1), ha="center", va="center", fontsize=6)
        if label:
            ax.text(63 - bit + 0.5, 1.15, label, ha="center", va="bottom", fontsize=7)
        elif bit % 8 == 0:
            ax.text(63 - bit + 0.5, -0.15, str(bit), ha="center", va="top", fontsize=6)
    ax.set_xlim(-0.5, 64.5)
    ax.set_ylim(-0.8, 2.0)
    ax.axis("off")
    ax.set_title(f"high 64-bit word of a Hopper instruction: the pass clears FLIP_MASK = {FLIP_MASK:#018x} "
                 "(1 = flipped): yield on, Rb reuse off", fontsize=9)
    on = {"yield": np.array([0.17, 0.63, 0.17]), "reuse": np.array([1.0, 0.5, 0.05])}
    for ax, ((m, n, k), (before, after, threads)) in zip(axes[1:], listings.items()):
        bits = ffma_bits(before, after)
        rows = [("yield, 09", "yield", bits["yield_before"]), ("yield, 10", "yield", bits["yield_after"]),
                ("Rb reuse, 09", "reuse", bits["reuse_before"]), ("Rb reuse, 10", "reuse", bits["reuse_after"])]
        count = bits["changed"].size
        image = np.full((len(rows), count, 3), 0.93)
        for r, (_, kind, values) in enumerate(rows):
            image[r, values] = on[kind]
        ax.imshow(image, aspect="auto", extent=(-0.5, count - 0.5, len(rows) - 0.5, -0.5), interpolation="nearest")
        ax.vlines(np.arange(count - 1) + 0.5, -0.5, len(rows) - 0.5, color="white", lw=0.5)
        ax.hlines(np.arange(len(rows) - 1) + 0.5, -0.5, count - 0.5, color="white", lw=0.8)
        for c in np.flatnonzero(bits["changed"]):
            ax.add_patch(Rectangle((c - 0.5, -0.5), 1, len(rows), fill=False, lw=1.5, ec="red"))
        ffma = [i for i in before if i.opcode == "FFMA"]
        column = {(i.function, i.offset): c for c, i in enumerate(ffma)}
        for run in ffma_runs(before):
            first, last = column[run[0].function, run[0].offset], column[run[-1].function, run[-1].offset]
            ax.plot([first - 0.4, last + 0.4], [len(rows) - 0.3] * 2, color="black", lw=3, clip_on=False)
            ax.plot([first - 0.4, first - 0.4 + len(run) * 9 // 16], [len(rows) - 0.15] * 2, color="0.5", lw=2,
                    clip_on=False)
        ax.set_yticks(range(len(rows)), [label for label, *_ in rows])
        ax.set_xticks(range(0, count, 8))
        ax.tick_params(labelsize=7)
        ax.set_title(f"M={m} N={n} K={k}, {threads} threads: {count} FFMAs in listing order (green: yields, orange: "
                     f"keeps Rb; red box: flipped by the pass, {int(bits['changed'].sum())})", fontsize=9)
    axes[-1].set_xlabel("FFMA index in the kernel (black bar: a run of >= 8; grey: its first 9/16, where DeepGEMM's "
                        "rule may flip)")
    fig.suptitle("Stage 10: the FFMA interleave pass (ptx.passes), stage 09's cubin before and stage 10's after",
                 fontsize=10)
    return fig


# ============================================================================ topic: MoE grouped GEMMs
MOE_EXAMPLE = dict(counts=(150, 0, 40, 90), block_m=64, n_blocks=3, grid=5, m_max=192)


def moe_walk_map(walks, m_blocks: int, n_blocks: int) -> dict[str, np.ndarray]:
    """(m_blocks x n_blocks) arrays ``owner`` (CTA, -1: no CTA visits it), ``step`` (its index in that CTA's walk),
    ``group`` (-1: a skipped padding tile, -2: not visited) and ``count`` (visits), from the walks of
    lessons.moe_grouped (contiguous: m blocks over sum M; masked: ``g * blocks per slab + m block``, pass the
    walks through :func:`_slab_rows` first)."""
    out = {"owner": np.full((m_blocks, n_blocks), -1), "step": np.full((m_blocks, n_blocks), -1),
           "group": np.full((m_blocks, n_blocks), -2), "count": np.zeros((m_blocks, n_blocks), int)}
    for cta, walk in enumerate(walks):
        for step, (g, mb, nb) in enumerate(walk):
            out["owner"][mb, nb], out["step"][mb, nb], out["group"][mb, nb] = cta, step, g
            out["count"][mb, nb] += 1
    return out


def _slab_rows(walks, slab_blocks: int):
    """Masked walks (group, m block in the group, n block) -> (group, row of blocks in the flattened slabs, n)."""
    return [[(g, g * slab_blocks + mb, nb) for g, mb, nb in walk] for walk in walks]


def moe_layouts(counts=MOE_EXAMPLE["counts"], block_m: int = MOE_EXAMPLE["block_m"],
                n_blocks: int = MOE_EXAMPLE["n_blocks"], grid: int = MOE_EXAMPLE["grid"],
                m_max: int = MOE_EXAMPLE["m_max"]) -> Figure:
    """Both grouped-GEMM layouts of one routing (``counts`` tokens per expert) and the tiles each CTA computes:
    lessons.moe_grouped.dispatch for the layouts, contiguous_tiles / masked_tiles (the kernel's scheduler
    functions) for the walks."""
    from gemm.fp8 import ceil_div
    from lessons import moe_grouped as mg
    layout = mg.dispatch(np.asarray(counts), len(counts), m_max=m_max)
    contiguous, masked = layout.contiguous, layout.masked
    group_colors = [colormaps["tab10"](g % 10) for g in range(len(counts))]
    cta_colors = colormaps["Pastel1"].resampled(9)
    fig = _figure(12, 9.5)
    axes = fig.subplots(2, 2, width_ratios=[1, 2.6])

    def rows_column(ax, groups_of_rows, boundaries, labels, title):
        """One bar of rows, coloured by group (hatched grey: padding / empty slot), a line per block."""
        for row, g in enumerate(groups_of_rows):
            ax.add_patch(Rectangle((0, row), 1, 1, facecolor=group_colors[g] if g >= 0 else "0.92", lw=0,
                                   hatch=None if g >= 0 else "///", edgecolor="0.7"))
        for y in boundaries:
            ax.axhline(y, color="black", lw=0.6)
        for y, text in labels:
            ax.text(1.08, y, text, fontsize=7.5, va="center", ha="left")
        ax.set_xlim(0, 2.6)
        ax.set_ylim(len(groups_of_rows), 0)
        ax.set_xticks([])
        ax.set_ylabel("row of A (and of out)")
        ax.set_title(title, fontsize=9.5)
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)

    def tile_grid(ax, data, row_height, title, blank):
        m_blocks = data["owner"].shape[0]
        for (mb, nb), cta in np.ndenumerate(data["owner"]):
            y = mb * row_height
            g = data["group"][mb, nb]
            if cta < 0:
                ax.add_patch(Rectangle((nb, y), 1, row_height, facecolor="white", edgecolor="0.8", lw=0.5))
                ax.text(nb + 0.5, y + row_height / 2, blank, ha="center", va="center", fontsize=7, color="0.6")
                continue
            skipped = g < 0
            ax.add_patch(Rectangle((nb, y), 1, row_height, facecolor="0.9" if skipped else cta_colors(cta % 9),
                                   edgecolor=group_colors[g] if g >= 0 else "0.6", lw=2 if g >= 0 else 0.8,
                                   hatch="xx" if skipped else None))
            text = f"CTA {cta}, step {data['step'][mb, nb]}" + (" (skip)" if skipped else f"\ngroup {g}")
            ax.text(nb + 0.5, y + row_height / 2, text, ha="center", va="center", fontsize=7.5)
        ax.set_xlim(0, n_blocks)
        ax.set_ylim(m_blocks * row_height, 0)
        ax.set_xticks([nb + 0.5 for nb in range(n_blocks)], [f"n block {nb}" for nb in range(n_blocks)])
        ax.set_yticks([])
        ax.set_title(title, fontsize=9.5)

    # contiguous: one A, groups back to back, each aligned to the layout's alignment and padded with -1
    m_blocks = ceil_div(contiguous.rows, block_m)
    labels = [(mb * block_m + block_m / 2, f"m_indices[{mb * block_m}] = {int(contiguous.m_indices[mb * block_m])}")
              for mb in range(m_blocks)]
    rows_column(axes[0, 0], contiguous.m_indices, [mb * block_m for mb in range(m_blocks + 1)], labels,
                f"contiguous A: {contiguous.rows} rows, groups\naligned to {contiguous.alignment} "
                f"({contiguous.padding} padding rows, hatched)")
    walks = mg.contiguous_tiles(contiguous.m_indices, block_m, n_blocks * 128, 128, grid=grid, skipped=True,
                                groups=len(counts))
    tile_grid(axes[0, 1], moe_walk_map(walks, m_blocks, n_blocks), block_m,
              f"contiguous walk: the dense schedule over sum M on {grid} CTAs;\na tile whose m_indices[m0] is -1 "
              "is skipped (hatched: the CTA spends the step on a load and a branch)", "")

    # masked: a slab of M_max rows per group, masked_m[g] of them real
    slab_blocks = ceil_div(m_max, block_m)
    slab = np.where(masked.source >= 0, np.arange(len(counts))[:, None], -1).ravel()
    labels = [(g * m_max + m_max / 2, f"group {g}: masked_m = {int(masked.masked_m[g])}") for g in range(len(counts))]
    rows_column(axes[1, 0], slab, [g * m_max for g in range(len(counts) + 1)], labels,
                f"masked A: G = {len(counts)} slabs of M_max = {m_max} rows\n(hatched: slots no token fills)")
    walks = mg.masked_tiles(masked.masked_m, m_max, block_m, n_blocks, grid)
    data = moe_walk_map(_slab_rows(walks, slab_blocks), len(counts) * slab_blocks, n_blocks)
    tile_grid(axes[1, 1], data, block_m, f"masked walk: CTA c takes virtual tiles c, c + {grid}, ... of the groups' "
              "tiles in order (masked_schedule);\nblocks past masked_m are not tiles, an empty group has none",
              "no tile")
    axes[1, 1].set_ylim(len(counts) * m_max, 0)
    for g in range(len(counts) + 1):
        axes[1, 1].axhline(g * m_max, color="black", lw=1.2)
    handles = [Patch(facecolor=group_colors[g], label=f"group (expert) {g}: {c} tokens") for g, c in enumerate(counts)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(counts), fontsize=8.5)
    fig.suptitle(f"MoE grouped GEMMs (lessons/moe_grouped.py): one routing, two layouts, BLOCK_M = {block_m}, "
                 f"{n_blocks} n blocks, {grid} CTAs (cell colour = CTA, outline = group)", fontsize=10.5)
    return fig


# ============================================================================ the registry
FIGURES = {
    "01_naive_thread_map": naive_thread_map,
    "02_smem_tile_banks": smem_tile_banks,
    "03_micro_tile": micro_tile,
    "04_mma_fragments": mma_fragments,
    "04_ldmatrix_swizzle": ldmatrix_swizzle,
    "05_wgmma_descriptor": wgmma_descriptor,
    "05_sw128_atom": sw128_atom,
    "05_wgmma_accumulator": wgmma_accumulator,
    "06_tma_ring_timeline": tma_ring_timeline,
    "07_producer_consumer_timeline": producer_consumer_timeline,
    "08_tile_raster": tile_raster,
    "09_cluster_multicast": cluster_multicast,
    "10_ffma_yield_bits": ffma_yield_bits,
    "moe_grouped_layouts": moe_layouts,
}

__all__ = ["FIGURES", "Event", "RingTrace", "Timing", "trace_barriers", "replay", "stage06_trace", "stage07_trace",
           "ring_schedule",
           "thread_output_map", "smem_banks", "staging_lanes", "micro_tile_map", "fragment_owner",
           "mma_fragment_maps", "ldmatrix_roles", "stage04_swizzle", "descriptor_example", "sw128_layout",
           "accumulator_map", "raster_map", "wave_footprint", "cluster_steps", "census", "ffma_listings", "ffma_bits",
           "moe_walk_map",
           *(function.__name__ for function in FIGURES.values())]
