"""kdadbg: a gradient debugger for KDA (Kimi Delta Attention) chunked kernels.

Library entry points (the CLI is a thin shell over them):

* :func:`kdadbg.dump.load_dump` / :func:`kdadbg.dump.save_dump`: dump format v1;
* :func:`kdadbg.reference.run_reference`: the chunked float64 reference with every tap;
* :func:`kdadbg.oracle.run_oracle`: the token-by-token float64 oracle (autograd gradients);
* :func:`kdadbg.run.check`: our kernels vs the reference, tensor by tensor;
* :func:`kdadbg.export.export_taps`: a taps file from either source.
"""
