"""Rendering of results that needs more than a terminal: figures (:mod:`kdadbg.render.plot`)."""
