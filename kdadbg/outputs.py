"""Output paths of one command: checked before any computation, written all or nothing.

``check_outputs`` refuses, with one ``KdadbgError`` line naming the option, every output path that
could not be written or should not be: a name whose suffix says another format (``run --json x.png``),
``-`` (stdout has the tables, and a file named ``-`` is a
trap), a folder, a missing or unwritable parent folder, an input of the same command, another
output of the same command, an existing file without ``force``, and a read-only file even with
``force``. With ``force``, a symbolic link is replaced by the new file;
its target is never written.

``OutputSet`` adds the all-or-nothing part: each output is written to a temporary file beside its
target, and ``commit`` moves them all into place at the end. If one move fails, the outputs
already moved are put back as they were (removed, or the file they replaced restored).

Example::

    with OutputSet({"--json": json_file, "--plot": plot}, inputs=[dump], force=force) as outs:
        result = compute()                      # nothing is written if this raises
        write_json(outs.stage("--json"))        # a temporary path, or None when not asked for
        outs.commit()
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .errors import KdadbgError, OutputExists


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _identity(path: Path) -> Path:
    """The absolute path an output names (its folder resolved, the last part kept: a link is
    replaced, not followed)."""
    return _folder(path).resolve() / path.name


def _same_file(a: Path, b: Path) -> bool:
    try:
        if os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return _identity(a) == _identity(b) or os.path.realpath(a) == os.path.realpath(b)


def _writable_mode(path: Path) -> bool:
    """Whether ``path``'s mode lets anyone write it: root passes ``os.access`` on any file, so a file or
    folder made read-only (chmod a-w) is refused by its mode bits too, as it would be for its owner."""
    try:
        return bool(path.stat().st_mode & 0o222)
    except OSError:
        return True


def _mode(path: Path) -> str:
    try:
        return f" (mode {path.stat().st_mode & 0o777:o})"
    except OSError:
        return ""


# what a file name's suffix says it holds; an output of another format under such a name is refused
# (``kdadbg gen x.json`` would write safetensors bytes under a JSON name). Other suffixes, and none, pass.
SUFFIX_FORMATS = {
    ".safetensors": "safetensors", ".json": "JSON", ".png": "PNG", ".txt": "text", ".log": "text",
    ".md": "Markdown", ".csv": "CSV", ".tsv": "TSV", ".npz": "NumPy", ".npy": "NumPy", ".pt": "torch.save",
    ".pth": "torch.save", ".pkl": "pickle", ".pickle": "pickle", ".svg": "SVG", ".pdf": "PDF", ".jpg": "JPEG",
    ".jpeg": "JPEG", ".html": "HTML", ".yaml": "YAML", ".yml": "YAML", ".py": "Python", ".gz": "gzip",
    ".zip": "zip", ".h5": "HDF5",
}
FORMAT_SUFFIX = {"safetensors": ".safetensors", "JSON": ".json"}
LABEL_FORMATS = {"--json": "JSON", "--save": "safetensors", "--out": "safetensors", "OUT": "safetensors"}
# (--plot must end in .png: render.plot.check_plot says so in its own words)


def check_format(label: str, path, fmt: str | None) -> None:
    """Refuse an output of format ``fmt`` whose name ends in another format's suffix (``SUFFIX_FORMATS``)."""
    if fmt is None:
        return
    path = Path(path)
    suffix = path.suffix.lower()
    other = SUFFIX_FORMATS.get(suffix)
    if other is not None and other != fmt:
        where = f"{label} {path}" if label else str(path)
        raise KdadbgError(f"{where}: this output is {fmt}, but {path.suffix} is a {other} file's suffix: name it "
                          f"*{FORMAT_SUFFIX[fmt]} (or with a suffix of no other format)")


def check_plot_name(path) -> None:
    """Refuse a ``--plot`` path not named ``.png`` (any case; the figures are PNG only, and another suffix would
    hold PNG bytes under a misleading name)."""
    name = Path(path).name
    if not name.lower().endswith(".png"):   # the name itself: a hidden file '.png' has no suffix for pathlib
        suffix = Path(path).suffix
        found = f"the suffix {suffix!r}" if suffix else "no suffix"
        raise KdadbgError(f"--plot {path}: expected a file name ending in .png (the figure is written as a PNG "
                          f"only), found {found}")


def check_output(label: str, path, force: bool = False, fmt: str | None = None) -> Path:
    """Check one output path (see the module docstring); ``label`` names it (``--json``, ``OUT``); ``fmt``
    (default: ``LABEL_FORMATS[label]``) the format written, refused under another format's suffix."""
    raw = os.fspath(path)   # as typed: Path("./-x") is "-x"
    path = Path(path)
    where = f"{label} {path}" if label else str(path)
    check_format(label, path, fmt or LABEL_FORMATS.get(label))
    if str(path) == "-":
        raise KdadbgError(f"{where}: expected a file name; kdadbg does not write this to stdout (its tables go "
                          f"there), nor a file named '-'")
    if raw.startswith("-") and label:   # `--json --force`: the next option taken as the file name (an option's
        # value; capture's own file names, label "", are under its --out folder, whatever that is called)
        after = f" after {label}" if label.startswith("-") else ""
        raise KdadbgError(f"{where}: expected a file name{after}, found {str(path)!r}, an option's spelling (the "
                          f"option it names was not applied); for a file whose name starts with '-', give its "
                          f"folder too (its full path, or e.g. out/{path})")
    if label == "--plot":
        check_plot_name(path)
    if path.is_dir():
        raise KdadbgError(f"{where}: is a folder, expected a file path to write")
    folder = _folder(path)
    if not folder.is_dir():
        found = "is a file, not a folder" if folder.exists() else "does not exist"
        raise KdadbgError(f"{where}: folder {folder} {found}")
    if not os.access(folder, os.W_OK | os.X_OK) or not _writable_mode(folder):
        raise KdadbgError(f"{where}: folder {folder} is not writable{_mode(folder)}")
    if os.path.lexists(path):
        if not force:
            link = f" (a link to {os.readlink(path)})" if path.is_symlink() else ""
            raise OutputExists(f"{where}: already exists{link}; refusing to overwrite (use --force)")
        if not path.is_symlink() and (not os.access(path, os.W_OK) or not _writable_mode(path)):
            raise KdadbgError(f"{where}: is read-only{_mode(path)}; not replacing it, even with --force")
    return path


ERROR_KEYS = frozenset({"schema", "verdict", "error", "exit"})


def is_error_document(path, schema: int | None = None) -> bool:
    """Whether ``path`` is a regular file holding exactly the error document ``OutputSet`` writes for a
    failed command (``{"schema", "verdict": "error", "error", "exit"}``; of ``schema`` when given): no
    result is in it, so a rerun to the same path replaces it without ``--force``."""
    import json

    path = Path(path)
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 16:
            return False
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(doc, dict) and set(doc) == ERROR_KEYS and doc["verdict"] == "error"
            and isinstance(doc["error"], str) and (schema is None or doc["schema"] == schema))


def check_outputs(outputs: dict[str, object], inputs=(), force: bool = False,
                  replace: frozenset = frozenset()) -> dict[str, Path]:
    """Check every output path of a command before it computes anything.

    ``outputs``: label -> path (None = not asked for); ``inputs``: the paths the command reads;
    ``replace``: labels whose existing file may be replaced without ``force`` (an error document).
    Returns label -> ``Path`` for the outputs asked for. Example:
    ``check_outputs({"--json": "r.json", "--save": None}, inputs=["d.safetensors"])``.
    """
    checked: dict[str, Path] = {}
    for label, path in outputs.items():
        if path is None:
            continue
        path = check_output(label, path, force or label in replace)
        for src in inputs:
            if src is not None and _same_file(path, Path(src)):
                raise KdadbgError(f"{label} {path}: is an input of this command ({src}); write to another file")
        for other, seen in checked.items():
            if _same_file(path, seen):
                raise KdadbgError(f"{label} {path}: is also the {other} output; give each output its own file")
        checked[label] = path
    return checked


class OutputSet:
    """The checked outputs of one command, staged in temporary files and moved into place together."""

    def __init__(self, outputs: dict[str, object], inputs=(), force: bool = False, error_json: int | None = None):
        """``error_json``: the schema number of ``--json``'s document; given, a command that fails with a
        ``KdadbgError`` (or is interrupted) once it has ``started`` computing writes ``--json`` as ``{"schema",
        "verdict": "error", "error", "exit"}`` (nothing else), so that a script reading the file never finds a
        stale verdict that ``--force`` was asked to replace. Not for what the up-front checks refuse (bad
        input or usage: nothing is written), nor where writing ``--json`` itself failed (nothing is left).
        Such a document, found at ``--json`` by a rerun, is replaced without ``force``; ``replacing`` says so
        (the label and path, for the command to print as a note)."""
        json_path = outputs.get("--json")
        self.replacing: dict[str, Path] = {}
        if error_json is not None and json_path is not None and not force and is_error_document(json_path):
            self.replacing["--json"] = Path(json_path)
        self.targets = check_outputs(outputs, inputs, force, replace=frozenset(self.replacing))
        self.force = force
        self.error_json = error_json
        self.started = False   # set by the command once its checks are done and the computation starts
        self._staged: dict[str, Path] = {}
        self.committed = False

    def __enter__(self) -> "OutputSet":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        json_written = "--json" in self._staged   # the failure was in writing the outputs themselves
        self.discard()
        if isinstance(exc, KdadbgError) and exc.args:  # a staged file named by its option and target instead
            msg = str(exc.args[0])
            for label, tmp in self._staged.items():
                msg = msg.replace(str(tmp), f"{label} {self.targets[label]}")
            exc.args = (msg, *exc.args[1:])
        if isinstance(exc, (KdadbgError, KeyboardInterrupt)) and self.error_json is not None \
                and "--json" in self.targets and self.started and not self.committed and not json_written:
            if isinstance(exc, KeyboardInterrupt):
                self._write_error("interrupted (SIGINT) before the command finished", 130)
            else:
                self._write_error(str(exc), getattr(exc, "exit_code", 2))

    def _write_error(self, message: str, code: int) -> None:
        """``--json`` as the error document (``error_json``), moved into place alone; if that cannot be
        written either, the error line is all there is."""
        import json

        self._staged = {}
        tmp = self.stage("--json")
        try:
            tmp.write_text(json.dumps({"schema": self.error_json, "verdict": "error", "error": message,
                                       "exit": code}, indent=2))
            self.commit()
        except (OSError, KdadbgError):
            self.discard()

    def stage(self, label: str) -> Path | None:
        """A fresh temporary path beside ``label``'s target to write instead (None when not asked for)."""
        target = self.targets.get(label)
        if target is None:
            return None
        tmp = _folder(target) / f".{target.name}.{secrets.token_hex(4)}.tmp"
        self._staged[label] = tmp
        return tmp

    def discard(self) -> None:
        """Remove every temporary file not yet moved into place."""
        for tmp in self._staged.values():
            if os.path.lexists(tmp):
                os.unlink(tmp)

    def commit(self) -> dict[str, Path]:
        """Move every staged file into place; on a failure, undo the moves already made."""
        done: list[tuple[Path, Path | None]] = []  # (target, backup of what it replaced)
        try:
            for label, tmp in self._staged.items():
                target = self.targets[label]
                if not tmp.exists():
                    raise RuntimeError(f"{label}: nothing was written to {tmp}")
                backup = None
                if target.exists() and not target.is_symlink():
                    os.chmod(tmp, target.stat().st_mode & 0o777)
                if os.path.lexists(target):
                    if not self.force and not (label in self.replacing and is_error_document(target)):
                        raise KdadbgError(f"{label} {target}: appeared meanwhile; refusing to overwrite "
                                          f"(use --force)")
                    backup = _folder(target) / f".{target.name}.{secrets.token_hex(4)}.old"
                    os.rename(target, backup)
                try:
                    os.rename(tmp, target)
                except OSError:
                    if backup is not None:
                        os.rename(backup, target)
                    raise
                done.append((target, backup))
        except (OSError, KdadbgError) as e:
            for target, backup in reversed(done):
                os.unlink(target)
                if backup is not None:
                    os.rename(backup, target)
            self.discard()
            if isinstance(e, KdadbgError):
                raise
            raise KdadbgError(f"{e.filename or label}: cannot write ({e.strerror or e}); "
                              f"no output of this command was written") from None
        for _, backup in done:
            if backup is not None:
                os.unlink(backup)
        self.committed = True
        return dict(self.targets)
