"""Say how a tensor departs from the expected one: where (which indices of which named axis) and how
(a sign, a scale, an offset, a shift or a transpose, values in the wrong places, zeros, NaN).

These phrases are generic: `framework.expect_close` puts them in every value failure, and the
stage checks add what only they can know (a table's frequencies, attention's scores and weights).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def as_float64(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to(torch.float64).cpu()


def close_elements(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Elementwise closeness (bool, shape of expected); NaN and inf are never close."""
    a, b = as_float64(got), as_float64(expected)
    return torch.isfinite(a) & ((a - b).abs() <= atol + rtol * b.abs())


def tensors_close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    """Same shape and every element close (`close_elements`)."""
    return a.shape == b.shape and bool(close_elements(a, b, atol, rtol).all())


def index_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0–2, 5, 7–8'."""
    parts: list[str] = []
    values = sorted(set(indices))
    start = previous = None
    for value in [*values, None]:
        if start is not None and value == previous + 1:
            previous = value
            continue
        if start is not None:
            parts.append(f"{start}" if start == previous else f"{start}–{previous}")
        start = previous = value
    return ", ".join(parts)


def axis_label(axes: Sequence[str] | None, dim: int) -> str:
    return f"`{axes[dim]}`" if axes and dim < len(axes) else f"axis {dim}"


def where_different(got: torch.Tensor, expected: torch.Tensor, axes: Sequence[str] | None = None,
                    atol: float = 1e-6, rtol: float = 1e-5) -> str:
    """'only at `head` index 2 (of 4)' for the axes along which only some indices differ ('at every `token` index
    except 3 (of 17)' when most do); '' when the differences spread over every index of every axis (or the shapes
    differ)."""
    if got.shape != expected.shape or got.dim() == 0:
        return ""
    wrong = ~close_elements(got, expected, atol, rtol)
    if not wrong.any():
        return ""
    parts = []
    for dim in range(wrong.dim()):
        size = wrong.size(dim)
        others = [d for d in range(wrong.dim()) if d != dim]
        per_index = wrong.any(dim=others) if others else wrong  # (size,)
        indices = per_index.nonzero().flatten().tolist()
        if size > 1 and len(indices) < size:
            if 2 * len(indices) > size:  # most of them: the few that agree are the shorter, truer list
                agree = (~per_index).nonzero().flatten().tolist()
                parts.append(f"every {axis_label(axes, dim)} index except {index_ranges(agree)} (of {size})")
            else:
                parts.append(f"{axis_label(axes, dim)} {'index' if len(indices) == 1 else 'indices'} "
                             f"{index_ranges(indices)} (of {size})")
    if not parts:
        return "everywhere"
    return ("at " if any(part.startswith("every ") for part in parts) else "only at ") + ", ".join(parts)


def shifted(a: torch.Tensor, b: torch.Tensor, dim: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a's entries i, b's entries i + step) along axis `dim` (step 1 or -1), for every i where both exist: equal
    when a is b shifted by one."""
    size = a.size(dim)
    left, right = [slice(None)] * a.dim(), [slice(None)] * a.dim()
    left[dim] = slice(0, size - 1) if step == 1 else slice(1, size)
    right[dim] = slice(1, size) if step == 1 else slice(0, size - 1)
    return a[tuple(left)], b[tuple(right)]


def relation(got: torch.Tensor, expected: torch.Tensor, axes: Sequence[str] | None = None,
             atol: float = 1e-6, rtol: float = 1e-5) -> str:
    """A simple relation that turns expected into got, or '' when none holds."""
    if got.shape != expected.shape or got.numel() == 0:
        return ""
    a, b = as_float64(got), as_float64(expected)
    if not torch.isfinite(a).all():
        bad = (~torch.isfinite(a)).float().mean().item()
        return f"{bad:.0%} of the values are NaN or inf"
    tolerance = atol + rtol * b.abs().max().item()
    if a.abs().max().item() <= tolerance and b.abs().max().item() > tolerance:
        return "all values are 0"
    if a.numel() == 1:  # any one number is a multiple, and a shift, of any other: nothing to read
        return ""
    if tensors_close(a, -b, atol, rtol):
        return "the values have the opposite sign"
    scale = (a * b).sum() / (b * b).sum().clamp_min(1e-300)
    if tensors_close(a, scale * b, atol, rtol):
        return f"the values are {scale.item():.4g} × the expected ones"
    if tensors_close(a - (a - b).mean(), b, atol, rtol):
        return f"the values are the expected ones shifted by {(a - b).mean().item():+.4g}"
    for dim in range(a.dim()):
        size = a.size(dim)
        if size < 2:
            continue
        label = axis_label(axes, dim)
        for step in (1, -1):
            if tensors_close(*shifted(a, b, dim, step), atol, rtol):
                return (f"the values are shifted by one along {label}: entry i holds the expected entry "
                        f"i{step:+d}")
        if tensors_close(a, b.flip(dim), atol, rtol):
            return f"the values are reversed along {label}"
    if a.dim() >= 2 and a.size(-1) == a.size(-2) and tensors_close(a, b.transpose(-2, -1), atol, rtol):
        return f"the values are transposed: {axis_label(axes, a.dim() - 2)} and {axis_label(axes, a.dim() - 1)} swapped"
    if tensors_close(a.flatten().sort().values, b.flatten().sort().values, atol, rtol):
        return "the right values in other places (the same numbers, reordered)"
    return ""


def describe_difference(got: torch.Tensor, expected: torch.Tensor, axes: Sequence[str] | None = None,
                        atol: float = 1e-6, rtol: float = 1e-5) -> str:
    """Where and how got departs from expected, in one clause ('' when nothing simple can be said)."""
    where = where_different(got, expected, axes, atol, rtol)
    how = relation(got, expected, axes, atol, rtol)
    return "; ".join(part for part in (f"it differs {where}" if where else "", how) if part)


def merged_axes(fewer: Sequence[int], more: Sequence[int]) -> int | None:
    """d when `fewer` is `more` with its axes d and d + 1 joined into one, else None."""
    if len(fewer) + 1 != len(more):
        return None
    for d in range(len(fewer)):
        if tuple(fewer[:d]) == tuple(more[:d]) and fewer[d] == more[d] * more[d + 1] \
                and tuple(fewer[d + 1:]) == tuple(more[d + 2:]):
            return d
    return None


def describe_shape(got: Sequence[int], expected: Sequence[int]) -> str:
    """How a shape departs from the expected one, read from the two shapes alone ('' when nothing simple can be
    said): axes holding each other's sizes (a permutation), one axis shorter than expected or a whole multiple of
    its size (only the sizes are said: a multiple may be a repetition or another axis's size), an axis of size 1
    too many or too few, two axes merged into one or one split."""
    got, expected = tuple(got), tuple(expected)
    if got == expected:
        return ""
    if len(got) == len(expected):
        differ = [axis for axis, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
        if sorted(got) == sorted(expected):
            if len(differ) == 2:
                return f"axes {differ[0]} and {differ[1]} hold each other's sizes (the axes are in another order)"
            return "the expected sizes, with the axes in another order"
        if len(differ) == 1:
            axis = differ[0]
            have, want = got[axis], expected[axis]
            if have < want:
                return f"axis {axis} holds {have} of the expected {want}"
            if have % want == 0:
                return f"axis {axis} is {have // want} times the expected {want} (it has {have})"
            return f"axis {axis} has {have} where {want} is expected"
    if len(got) == len(expected) + 1:
        for axis in range(len(got)):
            if got[axis] == 1 and got[:axis] + got[axis + 1:] == expected:
                return f"an extra axis of size 1 at position {axis}"
        split = merged_axes(expected, got)  # (a size-1 factor was named just above)
        if split is not None:
            return f"axis {split} of the expected shape is split in two ({got[split]} × {got[split + 1]})"
    if len(got) + 1 == len(expected):
        for axis in range(len(expected)):
            if expected[axis] == 1 and expected[:axis] + expected[axis + 1:] == got:
                return f"the axis of size 1 at position {axis} is missing"
        merged = merged_axes(got, expected)
        if merged is not None:
            return f"axes {merged} and {merged + 1} of the expected shape are merged into one of {got[merged]}"
    if len(got) == len(expected) + 1 and got[1:] == expected:
        return f"an extra leading axis (of {got[0]})"
    if len(got) == len(expected) - 1 and got == expected[1:]:
        return f"the leading axis (of {expected[0]}) is missing"
    if len(got) == len(expected) - 1 and got == expected[:-1]:
        return f"the last axis (of {expected[-1]}) is missing"
    return ""
