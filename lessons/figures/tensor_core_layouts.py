"""Stages 04-05: the tensor cores' operand layouts. mma.sync fragments and ldmatrix sources with stage 04's
XOR swizzle (ptx.vocab.mma_sync, ptx.vocab.shared_memory); the wgmma descriptor, the 128B-swizzle atom and the accumulator fragment
(ptx.vocab.wgmma)."""
from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

import lessons
from lessons.figures.drawing import draw_box, draw_cells, new_figure


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
    draw_cells(ax, regs, colormaps["Pastel1"], -0.5, 8.5, labels=labels, fontsize=6)
    ax.set_xticks(range(lanes.shape[1]), [f"{group * c}" + (f"-{group * c + group - 1}" if group > 1 else "")
                                          for c in range(lanes.shape[1])], fontsize=6)
    ax.set_yticks(range(lanes.shape[0]))
    ax.tick_params(labelsize=6)
    regs_seen = sorted(set(regs.ravel().tolist()))
    ax.legend(handles=[Patch(color=colormaps["Pastel1"]((r + 0.5) / 9), label=f"{name}{r}") for r in regs_seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)


def mma_fragments() -> Figure:
    maps = mma_fragment_maps()
    fig = new_figure(15, 5.6)
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
    fig = new_figure(15, 6.2)
    grid = fig.add_gridspec(1, 4, width_ratios=[0.55, 0.55, 1, 1])
    for col, name in enumerate(("A", "B")):
        ax = fig.add_subplot(grid[0, col])
        lanes = roles[name]
        draw_cells(ax, lanes // 8, colormaps["Pastel2"], -0.5, 7.5,
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
    draw_cells(ax, logical, colormaps["Set2"], -0.5, 7.5,
           labels=np.array([[f"k{16 * c}" for c in range(8)] for _ in range(16)]), fontsize=7)
    draw_box(ax, 0, 0, 1, 8, color="red")
    ax.set_title("unswizzled: byte k of row r at r * 128 + k;\nthe 8 rows of one ldmatrix phase (red) share\n"
                 "one 16-byte bank group: 8-way conflict", fontsize=8)
    ax.set_xlabel("16-byte chunk of the 128-byte row (= 4 banks)")
    ax.set_ylabel("row of the A tile")
    ax = fig.add_subplot(grid[0, 3])
    draw_cells(ax, swz["k_step"], colormaps["Set2"], -0.5, 7.5, labels=labels, fontsize=7)
    for lane in range(8):  # matrix 0 of k step 0: lanes 0..7 give rows 0..7, k bytes 0..15
        offset = lessons.stage(4).a_fragment_offset(0, lane, 0, 0)
        draw_box(ax, offset % 128 // 16, offset // 128, 1, 1, color="red")
    ax.set_title("stored (stage 04): chunk c of row r at c ^ (r % 8)\n(shared_memory.swizzled_offset, a_fragment_offset): "
                 "the same\nphase (red) hits 8 different bank groups", fontsize=8)
    ax.set_xlabel("physical 16-byte chunk (label: its logical k bytes)")
    ax.set_ylabel("row of the A tile")
    fig.suptitle("Stage 04: ldmatrix lane roles (ptx.vocab.mma_sync) and the XOR swizzle that makes its reads and the "
                 "cp.async writes conflict-free", fontsize=10)
    return fig


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
    fig = new_figure(15, 4.4)
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
    fig = new_figure(14, 4.6)
    axes = fig.subplots(1, 2)
    draw_cells(axes[0], np.tile(np.arange(8), (8, 1)) // 2, colormaps["Set2"], -0.5, 7.5,
           labels=np.array([[f"c{c}" for c in range(8)] for _ in range(8)]), fontsize=8)
    axes[0].set_title("logical: row r of K bytes, chunk c = bytes 16c..16c+15;\ncolour = the wgmma k32 step "
                      "that reads it (2 chunks per step)", fontsize=9)
    draw_cells(axes[1], logical // 2, colormaps["Set2"], -0.5, 7.5,
           labels=np.array([[f"c{c}" for c in row] for row in logical]), fontsize=8)
    for row in range(8):
        physical = w.sw128_offset(row, 0) % w.SW128_ROW_BYTES // 16
        draw_box(axes[1], physical, row, 1, 1, color="red", lw=1.6)
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
    fig = new_figure(15, 5.8)
    grid = fig.add_gridspec(1, 2, width_ratios=[1, 1.15])
    ax = fig.add_subplot(grid[0])
    palette = np.array([colormaps["Pastel1"](i)[:3] for i in range(4)])
    shade = np.where((data["index"] // 4) % 2 == 0, 1.0, 0.82)
    ax.imshow(palette[data["warp"]] * shade[..., None], aspect="auto", interpolation="nearest")
    for warp in range(4):
        ax.text(n / 2, 16 * warp + 7.5, f"warp {warp}: rows {16 * warp}-{16 * warp + 15}", ha="center", fontsize=8)
    draw_box(ax, 0, 0, 16, 16, color="red")
    ax.set_title(f"m64n{n}k32 f32 accumulators of one warpgroup: {n // 2} registers a thread;\nwarp w owns rows "
                 "16w..16w+15, each 8-column group is 4 registers (shade)", fontsize=9)
    ax.set_xlabel("column n")
    ax.set_ylabel("row m")
    ax = fig.add_subplot(grid[1])
    labels = np.array([[f"T{lane}\nd{i}" for lane, i in zip(lr, ir)]
                       for lr, ir in zip(data["lane"][:16, :16], data["index"][:16, :16])])
    draw_cells(ax, data["index"][:16, :16] % 4, colormaps["Pastel2"], -0.5, 7.5, labels=labels, fontsize=5)
    ax.set_xticks(range(16))
    ax.set_yticks(range(16))
    ax.tick_params(labelsize=6)
    ax.set_title("zoom (red box): warp 0, columns 0-15. d[i] of lane l sits at row l/4 + 8((i/2)%2),\n"
                 "column 8(i/4) + 2(l%4) + i%2 (ISA 'Register Fragments'): mma.sync's C layout,\n"
                 "repeated for every 8 columns", fontsize=9)
    fig.suptitle("Stage 05: the wgmma accumulator fragment (ptx.vocab.wgmma.accumulator_coords)", fontsize=10)
    return fig
