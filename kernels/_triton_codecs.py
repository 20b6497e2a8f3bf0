"""Element codes shared by every Triton kernel that reads or writes a compressed format: rounding
as torch rounds, fp8's grid under the interpreter, and int4's packing (kernels.packing's layout:
two values per byte, low nibble first, offset 8)."""

import triton
import triton.language as tl


@triton.jit
def round_half_even(x):
    f = tl.floor(x + 0.5)
    odd = (f - 2.0 * tl.floor(f * 0.5)) != 0.0
    return tl.where(((f - x) == 0.5) & odd, f - 1.0, f)


@triton.jit
def round_clamp(y, lo, hi):
    """torch.round(y).clamp(lo, hi): the integer code of a value already divided by its scale."""
    return tl.minimum(tl.maximum(round_half_even(y), lo), hi)


@triton.jit
def to_e4m3_grid(x):
    """x rounded (half to even) to the nearest float8 e4m3 value, saturating at +-448. Used only
    under TRITON_INTERPRET, whose fp8 emulation mis-rounds values that round up to the next
    power of two; on a GPU the hardware conversion does this."""
    a = tl.minimum(tl.abs(x), 448.0)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0)
    step = tl.exp2(e - 3.0)
    r = round_half_even(a / step) * step
    return tl.where(x < 0, -r, r)


@triton.jit
def unpack_int4(packed, ROWS: tl.constexpr, COLS: tl.constexpr):
    """uint8 [ROWS, COLS // 2] -> float32 [ROWS, COLS] in [-8, 7]."""
    packed = packed.to(tl.int32)
    return tl.reshape(tl.join((packed & 0xF) - 8, (packed >> 4) - 8), (ROWS, COLS)).to(tl.float32)


@triton.jit
def pack_int4(y, ROWS: tl.constexpr, COLS: tl.constexpr):
    """y [ROWS, COLS] (values over their scale) -> uint8 [ROWS, COLS // 2]."""
    q = round_clamp(y, -8.0, 7.0).to(tl.int32) + 8
    low, high = tl.split(tl.reshape(q, (ROWS, COLS // 2, 2)))
    return (low | (high << 4)).to(tl.uint8)


@triton.jit
def scale_groups(q, s, ROWS: tl.constexpr, COLS: tl.constexpr, GROUP: tl.constexpr):
    """q [ROWS, COLS] times s [ROWS, COLS // GROUP], one scale per GROUP consecutive columns."""
    return tl.reshape(tl.reshape(q, (ROWS, COLS // GROUP, GROUP)) * s[:, :, None], (ROWS, COLS))
