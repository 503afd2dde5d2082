"""Rendering, apart from computing: rich tables for every command (:mod:`.tables`), the diff's grid
and localisation (:mod:`.difftables`), figures (:mod:`.plot`). Nothing here computes a number."""


def id_ranges(values, sep: str = ", ") -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``: chunk or head ids as runs."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
