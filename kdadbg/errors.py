"""The project's one user-facing exception type and its exit codes."""

EXIT_OK = 0
EXIT_NUMERIC = 1
EXIT_BAD_INPUT = 2       # also: nothing was compared (run, diff)
EXIT_PARTIAL = 3         # run: nothing failed, but not everything was compared (not a full pass)


class KdadbgError(Exception):
    """A problem with the user's input or request: printed as one line, exit code 2.

    Messages name the file (when there is one), the tensor or option, what was expected
    and what was found.
    """

    exit_code = EXIT_BAD_INPUT


class OutputExists(KdadbgError):
    """An output file that exists already, refused without ``force`` (so capture can count them)."""
