"""Notebook 03's concept picture: a CUDA grid of thread blocks over a matmul's output, and what one
block of the tiled matmul moves from global to shared memory for one k-tile. Drawn, not measured
(the measured pictures are minillm.viz.plot_access_diagram and friends). And draw_puzzle: the accesses
of the reader's kernel in a puzzle's check, from the log its checker kept."""
from __future__ import annotations

from matplotlib.patches import Rectangle

from ._figure import new_figure
from .diagram import arrow, blank
from .kernels import SPACE_COLORS, plot_access_diagram

_LIGHT = {"global": "#F2D4D5", "shared": "#D3EBD9"}


def _grid(ax, x0, y0, cols, rows, cell, face="white", edge="#888888", lw=0.6):
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((x0 + c * cell, y0 + (rows - 1 - r) * cell), cell, cell,
                                   facecolor=face, edgecolor=edge, lw=lw))


def draw_cuda_grid(blocks_x: int = 4, blocks_y: int = 3, tile: int = 4, block=(2, 1), thread=(1, 2)):
    """Left: the output y (M, N) cut into tile x tile blocks, one per thread block; blockIdx (bx, by)
    and, inside one block, its threads (tx, ty), one per output element. Right: that block's tiled
    matmul step: a tile of x (its rows) and a tile of W (its columns of y) copied from global memory
    into shared memory, then reused tile times by every thread."""
    fig, axes = new_figure(ncols=2, width=12.5, height=4.6)
    ax, bx_ax = axes[0, 0], axes[0, 1]
    bx, by = block
    tx, ty = thread

    # ---- left: grid -> blocks -> threads, over y
    B = 1.6                                                        # one block's side in drawing units
    blank(ax, (-0.9, blocks_x * B + 0.4), (-2.0, blocks_y * B + 1.1))
    for r in range(blocks_y):
        for c in range(blocks_x):
            mine = (c, r) == (bx, by)
            x0, y0 = c * B, (blocks_y - 1 - r) * B
            ax.add_patch(Rectangle((x0, y0), B, B, facecolor="#DCE6F2" if mine else "#F4F4F4",
                                   edgecolor="#333333", lw=1.4 if mine else 0.8))
            if mine:
                cell = B / tile
                _grid(ax, x0, y0, tile, tile, cell, face="none", edge="#7A93B8", lw=0.5)
                for i in range(tile):
                    for j in range(tile):
                        me = (j, i) == (tx, ty)
                        ax.plot(x0 + (j + 0.5) * cell, y0 + (tile - 1 - i + 0.5) * cell, "o", ms=7 if me else 3,
                                color="#C44E52" if me else "#4C72B0")
                ax.text(x0 + B / 2, y0 + B + 0.08, f"block ({c}, {r})", ha="center", va="bottom", fontsize=8,
                        fontweight="bold")
            else:
                ax.text(x0 + B / 2, y0 + B / 2, f"block\n({c}, {r})", ha="center", va="center", fontsize=7.5,
                        color="#555555")
    ax.annotate("", xy=(blocks_x * B, blocks_y * B + 0.55), xytext=(0, blocks_y * B + 0.55),
                arrowprops=dict(arrowstyle="->", color="#333333"))
    ax.text(blocks_x * B / 2, blocks_y * B + 0.62, "blockIdx.x, threadIdx.x: along columns n of y", ha="center",
            va="bottom", fontsize=8)
    ax.annotate("", xy=(-0.25, 0), xytext=(-0.25, blocks_y * B), arrowprops=dict(arrowstyle="->", color="#333333"))
    ax.text(-0.35, blocks_y * B / 2, "blockIdx.y, threadIdx.y: rows m", rotation=90, ha="right", va="center",
            fontsize=8)
    m, n = by * tile + ty, bx * tile + tx
    ax.text(blocks_x * B / 2, -0.25,
            f"grid = {blocks_x} x {blocks_y} blocks of {tile} x {tile} threads (one output element each)\n"
            f"red thread: threadIdx ({tx}, {ty}) of block ({bx}, {by})\n"
            f"n, m = cuda.grid(2) = ({bx}*{tile} + {tx}, {by}*{tile} + {ty}) = ({n}, {m}): it computes y[{m}, {n}]",
            ha="center", va="top", fontsize=8)
    ax.set_title("y (M, N): a grid of thread blocks", fontsize=10)

    # ---- right: one block, one k-tile: global -> shared -> reuse
    ax = bx_ax
    blank(ax, (-0.9, 11.2), (-1.2, 7.1))
    kt, ntiles = 1, 4                                              # drawing the 2nd of 4 k-tiles
    cell = 0.55
    K = ntiles * cell * 2                                          # x and W drawn 2 cells per k-tile
    # x (M, K): the block's TILE rows highlighted, the current k-tile in red
    x0, y0, H = 0.0, 3.6, 3.0
    ax.add_patch(Rectangle((x0, y0), K, H, facecolor="#F4F4F4", edgecolor="#333333"))
    band = (y0 + H - 1.4, 0.8)
    ax.add_patch(Rectangle((x0, band[0]), K, band[1], facecolor=_LIGHT["global"], edgecolor="#999999", lw=0.6))
    ax.add_patch(Rectangle((x0 + kt * 2 * cell, band[0]), 2 * cell, band[1], facecolor=SPACE_COLORS["global"],
                           edgecolor="#333333", alpha=0.85))
    for t in range(1, ntiles):
        ax.plot([x0 + t * 2 * cell] * 2, [y0, y0 + H], color="#BBBBBB", lw=0.6, ls=":")
    ax.text(x0 + K / 2, y0 + H + 0.1, "x (M, K) in global memory", ha="center", va="bottom", fontsize=8.5)
    ax.text(x0 - 0.08, band[0] + band[1] / 2, "block's\nrows m", ha="right", va="center", fontsize=7)
    # W (N, K): the block's TILE rows (= columns n of y)
    w0, wy = 0.0, 0.0
    ax.add_patch(Rectangle((w0, wy), K, H, facecolor="#F4F4F4", edgecolor="#333333"))
    wband = (wy + 1.0, 0.8)
    ax.add_patch(Rectangle((w0, wband[0]), K, wband[1], facecolor=_LIGHT["global"], edgecolor="#999999", lw=0.6))
    ax.add_patch(Rectangle((w0 + kt * 2 * cell, wband[0]), 2 * cell, wband[1], facecolor=SPACE_COLORS["global"],
                           edgecolor="#333333", alpha=0.85))
    for t in range(1, ntiles):
        ax.plot([w0 + t * 2 * cell] * 2, [wy, wy + H], color="#BBBBBB", lw=0.6, ls=":")
    ax.text(w0 + K / 2, wy - 0.1, "W (N, K) in global memory", ha="center", va="top", fontsize=8.5)
    ax.text(w0 - 0.08, wband[0] + wband[1] / 2, "block's\ncols n", ha="right", va="center", fontsize=7)
    # shared tiles
    sx, S = 6.0, 1.5
    for (yy, name, src) in ((band[0] - 0.35, "xs", band), (wband[0] - 0.35, "ws", wband)):
        _grid(ax, sx, yy, tile, tile, S / tile, face=_LIGHT["shared"], edge=SPACE_COLORS["shared"], lw=0.8)
        ax.text(sx + S / 2, yy + S + 0.06, f"{name}: {tile}x{tile} in shared memory", ha="center", va="bottom",
                fontsize=7.5, color="#2F6B3C")
        arrow(ax, (x0 + (kt + 1) * 2 * cell + 0.05, src[0] + src[1] / 2), (sx - 0.08, yy + S / 2),
              color=SPACE_COLORS["global"])
    # y tile
    yx, yy = 9.3, 2.3
    _grid(ax, yx, yy, tile, tile, S / tile, face="#DCE6F2", edge="#7A93B8", lw=0.8)
    ax.text(yx + S / 2, yy + S + 0.06, "y tile\n(registers: acc)", ha="center", va="bottom", fontsize=7.5)
    arrow(ax, (sx + S + 0.08, band[0] + 0.4), (yx - 0.08, yy + S * 0.7), color=SPACE_COLORS["shared"])
    arrow(ax, (sx + S + 0.08, wband[0] + 0.2), (yx - 0.08, yy + S * 0.3), color=SPACE_COLORS["shared"])
    ax.text(yx + S / 2, yy - 0.35,
            f"per k-tile:\n1. each thread copies one\n   element of x and of W\n2. syncthreads\n"
            f"3. each thread: {tile} multiply-\n   adds from shared memory\n4. syncthreads; next k-tile\n"
            f"   (dotted lines): K / {tile} rounds",
            ha="center", va="top", multialignment="left", fontsize=7.5, linespacing=1.3)
    ax.set_title(f"block ({bx}, {by}), k-tile {kt + 1} of {ntiles}: read once from global, reused {tile}x from shared",
                 fontsize=10)
    fig.tight_layout()
    return fig


def draw_puzzle(result):
    """Draw what the reader's kernel touched in a kernel puzzle's check (minillm.labs.nb03_kernels): the
    launch its checker kept, the failing one or, on a pass, the case it shows. One panel per array, each
    element coloured by how many times any thread read it; one thread's reads outlined solid, its writes
    dashed (on a failure: the thread the message names). Returns `result`, so a check cell reads
    `draw_puzzle(check_map_kernel(my_map))` and shows the verdict and the picture."""
    pic = result.drawing                      # the launch the checker kept (minillm.labs.nb03_kernels.Picture)
    fresh = pic is not None and pic.passed == result.passed and (result.passed or result.message.startswith(pic.where))
    if not fresh or not pic.log.events:       # a failure before any launch (the stub, a wrong signature)
        return result
    e = pic.log.events[0]
    block, thread = ((v,) if isinstance(v, int) else tuple(v) for v in (pic.thread or (e.block, e.thread)))
    fig = plot_access_diagram(pic.log, pic.arrays, thread=(block, thread))
    nb = max([i + 1 for i, n in enumerate(pic.log.griddim) if n > 1] or [1])
    nt = max([i + 1 for i, n in enumerate(pic.log.blockdim) if n > 1] or [1])
    b = block[0] if nb == 1 else tuple(block[:nb])
    t = thread[0] if nt == 1 else tuple(thread[:nt])
    for ax in fig.axes:                       # a 1-D array is one row: no row axis to read
        if ax.images and ax.images[0].get_array().shape[0] == 1:
            ax.set_yticks([])
            ax.set_ylabel("")
    fig.suptitle(f"{'pass' if result.passed else 'fail'}, {pic.where}: {pic.label}; block {b}, thread {t} outlined",
                 fontsize=9.5)
    return result
