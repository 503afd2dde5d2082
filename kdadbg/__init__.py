"""kdadbg: a gradient debugger for KDA (Kimi Delta Attention) chunked kernels.

Library entry points (the CLI is a thin shell over them):

* :func:`kdadbg.dump.load_dump` / :func:`kdadbg.dump.save_dump`: dump format v1;
* :func:`kdadbg.reference.run_reference`: the chunked float64 reference with every tap;
* :func:`kdadbg.oracle.run_oracle`: the token-by-token float64 oracle (autograd gradients);
* :func:`kdadbg.run.check`: our kernels vs the reference, tensor by tensor;
* :func:`kdadbg.export.export_taps`: a taps file from either source;
* :func:`kdadbg.capture` (``kdadbg.capturing``): dumps of the KDA calls a training step makes.
"""


def __getattr__(name):
    if name in ("capture", "Capture"):  # lazily: importing kdadbg stays light
        from . import capturing

        return getattr(capturing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
