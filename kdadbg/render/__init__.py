"""Rendering, apart from computing: rich tables for every command (:mod:`.tables`), the diff's grid
and localisation (:mod:`.difftables`), figures (:mod:`.plot`). Nothing here computes a number."""
