"""kdadbg: a gradient debugger for KDA (Kimi Delta Attention) chunked kernels.

Library entry points (the CLI is a thin shell over them):

* :func:`kdadbg.dump.load_dump` / :func:`kdadbg.dump.save_dump`: dump format v1;
* :func:`kdadbg.reference.run_reference`: the chunked float64 reference with every tap;
* :func:`kdadbg.oracle.run_oracle`: the token-by-token float64 oracle (autograd gradients);
* :func:`kdadbg.run.check`: our kernels vs the reference, tensor by tensor;
* :func:`kdadbg.export.export_taps`: a taps file from either source;
* :func:`kdadbg.capture` (``kdadbg.capturing``): dumps of the KDA calls a training step makes.
"""


def _kernels_beside() -> None:
    """In a source checkout (``kernels/`` beside this package), ``kdadbg_kernels`` is that folder: imported
    from another tree it would be another copy's kernels (an editable install of one checkout, this one on
    ``PYTHONPATH``: a user trial, a clone testing the installed tree's kernels unawares). An
    installed wheel has no such folder and keeps its own ``kdadbg_kernels``."""
    import importlib.util
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent / "kernels"
    init = here / "__init__.py"
    if not init.is_file():
        return
    loaded = sys.modules.get("kdadbg_kernels")
    if loaded is not None:
        where = Path(getattr(loaded, "__file__", "") or "").resolve().parent
        if where != here:
            import warnings

            warnings.warn(f"kdadbg_kernels was imported from {where} before kdadbg, whose checkout has its own "
                          f"kernels at {here}: the kernels run are {where}'s", stacklevel=2)
        return
    spec = importlib.util.spec_from_file_location("kdadbg_kernels", init, submodule_search_locations=[str(here)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["kdadbg_kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kdadbg_kernels"]
        raise


_kernels_beside()


def __getattr__(name):
    if name in ("capture", "Capture"):  # lazily: importing kdadbg stays light
        from . import capturing

        return getattr(capturing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
