"""Stages 01-03 (Numba): which thread computes which output, which lane stages which byte, the banks of a
padded shared tile, a thread's micro-tile. Drawn from the stages' own index functions."""
from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import lessons
from lessons.figures.drawing import draw_box, draw_cells, new_figure, python_function


def thread_output_map(number: int, m: int, n: int) -> dict[str, np.ndarray]:
    """Which thread of which block computes each element of an m x n D, as stage ``number`` (1 or 2) launches
    it: ``launch_config`` gives the grid, the stage's ``output_element`` the element of each thread (threads
    past the edge are the ones the kernel's guard returns). Arrays of shape (m, n): ``block`` (linear block id,
    x fastest), ``tx``, ``ty``, and ``count`` (threads writing the element: 1 everywhere)."""
    stage = lessons.stage(number)
    element = python_function(stage.output_element)
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
    fig = new_figure(13, 3.6)
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
    staged_k = python_function(stage.staged_k)
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
    fig = new_figure(15, 8.4)
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
    draw_cells(ax, np.repeat(np.arange(steps)[:, None], width, 1), colormaps["Pastel1"], -0.5, 8.5, labels=k_of,
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
        draw_box(ax, 0, 0, 1, stage.TILE, color="red", lw=2.2)
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
    offset = python_function(stage.micro_offset)
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
    offset = python_function(stage.micro_offset)
    data = micro_tile_map()
    fig = new_figure(15, 7.2)
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
    draw_cells(ax, groups, colormaps["tab20"], -0.5, 19.5, labels=groups, fontsize=8)
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
