"""The ``kdadbg`` command line: a thin shell over the library.

Each command parses options, calls one library function that returns plain data, renders it
(results to stdout, progress and errors to stderr) and picks the exit code: 0 success,
1 numerical failure, 2 bad input or usage.
"""

import contextlib
import difflib
import functools
import importlib
import inspect
import json
import re
import sys
import warnings
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from rich.console import Console

from .render import tables as report
from .errors import EXIT_BAD_INPUT, EXIT_NUMERIC, EXIT_PARTIAL, KdadbgError
from .schema import DIFF_JSON, INSPECT_JSON, RUN_JSON, TAPS_JSON


# click's exceptions (or the copy of click that typer vendors): what a usage error raises
_CLICK = importlib.import_module(typer.BadParameter.__module__)


def _given(args: list[str], opts) -> str | None:
    """The value the command line gave one of ``opts`` last (``--x V`` or ``--x=V``), or None."""
    found = None
    for i, a in enumerate(args):
        if a == "--":
            break
        for o in opts:
            if a == o and i + 1 < len(args):
                found = args[i + 1]
            elif a.startswith(o + "="):
                found = a[len(o) + 1:]
    return found


def _expected(param) -> str | None:
    """What an option takes, in words (its choices, an integer, a number), or None."""
    desc = getattr(param, "type_descriptor", None)
    ptype = getattr(param, "type", None)
    choices = desc.choices if desc is not None else getattr(ptype, "choices", None)
    if choices:
        names = [str(getattr(c, "value", c)) for c in choices]
        return " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)
    kind = desc.annotation if desc is not None else getattr(ptype, "name", None)
    return {int: "an integer", "integer": "an integer", float: "a number", "float": "a number"}.get(kind)


def _sentence(message: str) -> str:
    """click's "No such command 'x'." as a clause: "no such command 'x'"."""
    message = message.strip().rstrip(".")
    return message[:1].lower() + message[1:]


OUTPUT_OPTIONS = ("--json", "--plot", "--save", "--out", "-o")   # options whose value is a file to write
JSON_FLAG_HINT = ("--json is a flag for inspect and taps (it prints JSON on stdout; `> FILE` keeps it), where run "
                  "and diff take --json FILE")


def _usage_message(e, name: str | None, path: str, args: list[str]) -> str:
    """click's usage error ``e`` as kdadbg's one line (without "error: "): the command ``name`` (None: the
    group), the option or argument, what was expected and what was found; ``path`` is the command line
    its --help hint names (``kdadbg run``), ``args`` what the command was given."""
    where = f"{name}: " if name else ""
    hint = f" ({path} --help)"
    param = getattr(e, "param", None)
    if isinstance(e, _CLICK.MissingParameter) and param is not None:
        if param.param_type_name == "argument":
            return f"{where}missing argument {param.metavar or param.name.upper()}{hint}"
        return f"{where}missing option {max(param.opts, key=len)}{hint}"
    if isinstance(e, _CLICK.NoSuchOption):
        close = list(getattr(e, "possibilities", None) or ())
        # click's matches are loose (--precison: "--json or --precision"): the close ones only, where there are
        close = difflib.get_close_matches(e.option_name, close, n=3, cutoff=0.75) or close
        near = f"; did you mean {' or '.join(sorted(close))}?" if close else ""
        return f"{where}no such option {e.option_name}{near}{hint}"
    if isinstance(e, _CLICK.BadParameter) and param is not None:
        label = max(param.opts, key=len) if param.param_type_name == "option" else (param.metavar or param.name)
        label = f"{name} {label}" if name else label
        expected, found = _expected(param), _given(args, param.opts)
        if expected and found is not None:
            return f"{label}: expected {expected}, found {found!r}"
        return f"{label}: {_sentence(e.message)}"
    extra = re.match(r"Got unexpected extra argument(?:s|\(s\))? \((.*)\)", e.message or "")
    for opt in OUTPUT_OPTIONS:   # `--json --precision bf16`: the option taken as the file name, its value left over
        nxt = args[args.index(opt) + 1:][:1] if opt in args else []
        if extra and nxt and nxt[0].startswith("-") and nxt[0] != "-":
            flag = f"; {JSON_FLAG_HINT}" if opt == "--json" else ""
            return (f"{where}{opt}: expected a file name after it, found the option {nxt[0]} (so {extra.group(1)} "
                    f"was left over){flag}")
    after_json = args[args.index("--json") + 1:][:1] if "--json" in args else []
    if extra and after_json == extra.group(1).split()[:1]:
        return f"{where}unexpected argument {extra.group(1)} after --json: {JSON_FLAG_HINT}"
    option = getattr(e, "option_name", None)
    if option and "requires an argument" in e.message:
        return f"{name + ' ' if name else ''}{option}: expected a value after it, found none{hint}"
    return f"{where}{_sentence(e.format_message())}{hint}"


@contextlib.contextmanager
def _one_line_usage(name: str | None, path: str, args: list[str] = ()):
    """A click usage error inside (a missing argument, an unknown option, a bad value) as one red
    ``error:`` line on stderr and its exit code (2), instead of click's usage box."""
    try:
        yield
    except _CLICK.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":   # plain `kdadbg`: the help, already printed by rich's
            if not _rich_help():                        # panels; click's plain help is the error's message
                typer.echo(e.format_message())
                raise typer.Exit(e.exit_code) from None
            raise
        report.print_error(_err(), _usage_message(e, name, path, args))
        raise typer.Exit(e.exit_code) from None


NARROW_HELP = 100   # terminal columns below which --help is click's plain two columns (_rich_help)


def _rich_help() -> bool:
    """Whether --help is rich's panels: at the width rich prints at (80 when not a terminal), 100 columns or
    more; below, click's plain two columns (an option, then its help wrapped to the width), as rich's
    four-column panels left the help some 20 characters at 80 columns, a word or two a line."""
    from rich.console import Console

    return Console().width >= NARROW_HELP


def _plain_help(base, cmd, ctx, formatter):
    """``base.format_help`` (click's) of ``cmd``, rich's markup escapes (a backslash before ``[``) read as
    they are in plain text."""
    texts = [(x, x.help) for x in (cmd, *cmd.params) if isinstance(getattr(x, "help", None), str)]
    try:
        for x, text in texts:
            x.help = text.replace("\\[", "[")
        return base.format_help(cmd, ctx, formatter)
    finally:
        for x, text in texts:
            x.help = text


class Group(typer.core.TyperGroup):
    """The ``kdadbg`` group: its --help and --version are flags, shown without a type; a usage error is one line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for p in self.params:
            if getattr(p, "is_flag", False):
                p.metavar = ""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def format_help(self, ctx, formatter):
        """rich's panels, or below 100 columns click's plain two columns (``_rich_help``)."""
        if _rich_help():
            return super().format_help(ctx, formatter)
        return _plain_help(click.Group, self, ctx, formatter)

    def make_context(self, info_name, args, parent=None, **extra):
        with _one_line_usage(None, info_name or "kdadbg", list(args)):   # a copy: click consumes args
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        with _one_line_usage(None, ctx.command_path):
            return super().invoke(ctx)


app = typer.Typer(name="kdadbg", cls=Group, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False,
                  help="Gradient debugger for KDA (Kimi Delta Attention) chunked kernels: run an "
                       "implementation (--impl: our Triton kernels, fla, FlashKDA, your function) against a "
                       "float64 reference (run), find the first chunk and stage where it diverges (diff), "
                       "export per-chunk taps (taps), capture dumps from training (capture), and make or "
                       "check dumps (gen, inspect). Exit codes: 0 ok, 1 numerical failure, 2 bad input or nothing "
                       "compared, 3 partial (run, diff: not everything provided or compared, not a full pass).")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("kdadbg")
        except PackageNotFoundError:   # a checkout on PYTHONPATH, not installed
            v = "not installed (a checkout)"
        print(f"kdadbg {v}")
        raise typer.Exit(0)


@app.callback()
def _root(version_: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Print kdadbg's version and exit.")] = False) -> None:
    """Gradient debugger for KDA chunked kernels."""


def _out() -> Console:
    """stdout; wide when piped so tables stay readable in files and logs."""
    return Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 160)


def _err() -> Console:
    return Console(stderr=True, highlight=False, emoji=False)


def _chunk_window(spec: str | None, inputs, config) -> tuple[int, int] | None:
    """``--chunks A:B`` of ``run`` as a concrete half-open range of the dump's chunks (None: all)."""
    from .chunks import chunk_table
    from .selection import parse_chunk_range, resolve_selection

    if spec is None:
        return None
    B, T, H, K, V = inputs.shape
    sel = resolve_selection((), parse_chunk_range(spec), None, chunk_table(B, T, inputs.cu_seqlens,
                                                                           config.chunk_size).n_chunks, H)
    return sel.chunks


def _note(text: str | None) -> None:
    if text:
        report.print_note(_err(), text)


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter ``name`` was given on the command line (not left at its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _refuse_lower_bound(dump, overrides: dict) -> None:
    """``--lower-bound`` where the gate (``--gate``, else the dump's) is not lower_bound: refused, as it
    would be ignored. A dump whose header cannot be read is left to the loader's message."""
    if overrides.get("lower_bound") is None:
        return
    gate, whence, fix = overrides.get("gate"), "--gate", ""
    if gate is None:
        from .config import parse_config
        from .fileio import read_header

        specs, meta = read_header(dump)
        q = specs.get("q")
        if q is None or len(q.shape) != 4:
            return
        try:
            gate = parse_config(meta, q.shape[-1], "A_log" in specs, where=str(dump)).gate
        except KdadbgError:
            return
        whence = f"{dump}'s metadata" if "gate" in meta else f"the default for {dump}, which has no A_log"
        fix = " (or add --gate lower_bound)" if "A_log" in specs else ""
    if gate != "lower_bound":
        raise KdadbgError(f"--lower-bound: applies to the lower_bound gate only; the gate is {gate} (from {whence}): "
                          f"drop --lower-bound{fix}")


class Gate(str, Enum):
    none = "none"
    lower_bound = "lower_bound"
    softplus = "softplus"


class Layout(str, Enum):
    vk = "vk"
    kv = "kv"


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


_PANEL = "Config overrides (beat the dump's metadata)"
CONFIG_OPTIONS = {
    "chunk_size": Annotated[Optional[int], typer.Option("--chunk-size", help="Chunk size: 16, 32 or 64.",
                                                        rich_help_panel=_PANEL)],
    "scale": Annotated[Optional[float], typer.Option("--scale", help="Query scale (default K**-0.5).",
                                                     rich_help_panel=_PANEL)],
    "gate": Annotated[Optional[Gate], typer.Option("--gate", help="Gate activation.", rich_help_panel=_PANEL)],
    "lower_bound": Annotated[Optional[float], typer.Option("--lower-bound", help="Lower bound of the lower_bound "
                                                           "gate.", rich_help_panel=_PANEL)],
    "state_layout": Annotated[Optional[Layout], typer.Option("--state-layout", help="Layout of h0/ht/dht/dh0.",
                                                             rich_help_panel=_PANEL)],
    "qk_l2norm": Annotated[Optional[bool], typer.Option("--qk-l2norm/--no-qk-l2norm", help="L2-normalise q and k.",
                                                        rich_help_panel=_PANEL)],
    "beta_sigmoid": Annotated[Optional[bool], typer.Option("--beta-sigmoid/--no-beta-sigmoid",
                                                           help="Apply a sigmoid to beta.", rich_help_panel=_PANEL)],
}


def config_options(func):
    """Give a command the config-override options; it receives them as ``overrides: dict``
    (config key -> value, None where not given), ready for ``load_dump``."""
    sig = inspect.signature(func)
    params = [p for p in sig.parameters.values() if p.name != "overrides"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ann)
             for name, ann in CONFIG_OPTIONS.items()]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        overrides = {}
        for name in CONFIG_OPTIONS:
            value = kwargs.pop(name, None)
            overrides[name] = value.value if isinstance(value, Enum) else value
        return func(*args, overrides=overrides, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params + extra)
    wrapper.__annotations__ = {**{k: v for k, v in func.__annotations__.items() if k != "overrides"},
                               **CONFIG_OPTIONS}
    return wrapper


IMPL_HELP = ("Implementation under test: ours (our Triton kernels, default), fla (flash-linear-attention's "
             "chunk_kda, when installed), flashkda (FlashKDA, when built; CUDA), reference (the float64 "
             "reference: a self-check), PATH.py:FUNCTION or MODULE:FUNCTION (fla's chunk_kda calling "
             "convention; README, 'Debugging your own kernel'), or a taps file.")
ImplOption = Annotated[Optional[str], typer.Option("--impl", help=IMPL_HELP, show_default=False)]
DEFAULT_MAX_INTERPRETER_S = 300.0
MaxInterpreterOption = Annotated[float, typer.Option("--max-interpreter-s", help="Without a GPU, refuse up front a "
                                                     "run of our kernels under the Triton interpreter estimated to "
                                                     "take longer (seconds; the estimate is in the message).")]
TracebackOption = Annotated[bool, typer.Option("--traceback", help="Show the whole traceback when the "
                                               "implementation raises.")]


# What an option's value is, in --help (typer would show the Python type).
METAVARS = {"--tol": "NAME=VALUE", "--chunks": "A:B", "--heads": "I,J", "--taps": "NAMES", "--preset": "NAME",
            "--dtype": "DTYPE", "--seed": "N", "--window": "N", "--repeat": "N", "--chunk-size": "C",
            "--scale": "X", "--lower-bound": "X", "--B": "N", "--T": "N", "--H": "N", "--HV": "N", "--K": "N", "--V": "N",
            "--json": "FILE", "--save": "FILE", "--plot": "FILE.png", "--out": "FILE", "--against": "TAPS",
            "--impl": "NAME", "--source": "NAME", "--max-interpreter-s": "S"}


def _is_choice(p) -> bool:
    """An option whose values typer lists itself (an Enum); across typer versions."""
    desc = getattr(p, "type_descriptor", None)
    if desc is not None:
        return bool(desc.is_choice)
    return type(getattr(p, "type", None)).__name__ == "Choice"   # click's, or the one typer vendors


def _join_lines(text: str | None) -> str | None:
    """Docstring lines that break a sentence are joined; a line ending a sentence keeps its break."""
    if not text:
        return text
    out = []
    for line in text.split("\n"):
        if out and out[-1].strip() and line.strip() and not out[-1].rstrip().endswith((".", ":", ";")):
            out[-1] = out[-1].rstrip() + " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


class Command(typer.core.TyperCommand):
    """--help as a user reads it: flags without a type, values named by what they hold (METAVARS),
    arguments in capitals, sentences not broken across lines."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.help = _join_lines(self.help)
        for p in self.params:
            if isinstance(p, typer.core.TyperArgument):
                p.metavar = p.name.upper() + ("..." if p.nargs != 1 else "")
                p.display_type_rich = lambda ctx: None  # the name says it; typer would add a Python type
            elif getattr(p, "is_flag", False):
                p.metavar = ""
            elif p.metavar is None and not _is_choice(p):
                p.metavar = METAVARS.get(next((o for o in p.opts if o.startswith("--")), ""), "VALUE")

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def format_help(self, ctx, formatter):
        """rich's panels, or below 100 columns click's plain two columns (``_rich_help``)."""
        if _rich_help():
            return super().format_help(ctx, formatter)
        return _plain_help(click.Command, self, ctx, formatter)

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if isinstance(p, typer.core.TyperArgument):
                pieces.append(p.metavar if p.required else f"[{p.metavar}]")
        return pieces

    def make_context(self, info_name, args, parent=None, **extra):
        path = f"{parent.command_path} {info_name}" if parent is not None else info_name or self.name
        with _one_line_usage(self.name, path, list(args)):   # a copy: click consumes args
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        with _one_line_usage(self.name, ctx.command_path):
            return super().invoke(ctx)


def _interpreter_float(w) -> bool:
    """A numpy overflow/invalid-value warning from the Triton interpreter's float32 emulation: inf
    or NaN is what a GPU gives silently there, and run/diff/taps report non-finite values."""
    return issubclass(w.category, RuntimeWarning) and "triton" in Path(w.filename).parts and (
        "overflow" in str(w.message) or "invalid value" in str(w.message))


def command(*args, **kwargs):
    """``app.command`` that turns a ``KdadbgError`` into one red stderr line and its exit code.

    Warnings raised while the command runs (torch, Triton, numpy internals) are held back: after a
    ``KdadbgError`` they are dropped, so the error is the only line; otherwise shown at the end,
    except the Triton interpreter's float32 overflows (``_interpreter_float``). With ``--traceback``,
    an implementation's exception is printed whole before its line."""
    def deco(func):
        @functools.wraps(func)
        def wrapper(*a, **k):
            caught, interrupted = [], []
            # (capture waits for its command through a Ctrl-C and reports its own exit status)
            restore = _catch_interrupts(interrupted) if (args[:1] or (func.__name__,))[0] != "capture" else None
            try:
                with warnings.catch_warnings(record=True) as caught:
                    out = func(*a, **k)
                if interrupted:   # raised inside a finalizer ("Exception ignored in ..."): swallowed there
                    raise KeyboardInterrupt
                return out
            except typer.Exit:
                if interrupted:
                    caught.clear()
                    _interrupted()
                raise
            except KeyboardInterrupt:
                caught.clear()
                _interrupted()
            except KdadbgError as e:
                caught.clear()
                detail = getattr(e, "detail", None)
                if detail and k.get("traceback"):
                    _err().print(detail, highlight=False, markup=False, soft_wrap=True)
                report.print_error(_err(), str(e) + (" (--traceback shows it whole)" if detail and
                                                     not k.get("traceback") else ""))
                raise typer.Exit(e.exit_code) from None
            finally:
                if restore is not None:
                    restore()
                for w in caught:
                    if not _interpreter_float(w):
                        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        return app.command(*args, cls=Command, **kwargs)(wrapper)
    return deco


EXIT_INTERRUPTED = 130   # 128 + SIGINT, as a shell reports a command it interrupted


def _catch_interrupts(flag: list):
    """Ctrl-C (SIGINT) raises KeyboardInterrupt as ever, and is remembered in ``flag``: one that arrives while
    Python runs a finalizer is printed as "Exception ignored" and lost there, and the command would go on to
    exit 0. Returns what restores the previous handler (None off the main thread, where none can be set)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:   # a handler installed from C: left alone (it could not be put back)
        return None

    def handler(signum, frame):
        flag.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return lambda: signal.signal(signal.SIGINT, previous)


def _interrupted():
    """One line and exit 130 for a command stopped by Ctrl-C."""
    report.print_error(_err(), "interrupted (SIGINT): the command stopped before it finished; every file it "
                               "writes is written whole or not at all, none was left partial (run and diff: a "
                               "--json file asked for holds the error document)")
    raise typer.Exit(EXIT_INTERRUPTED)


@command("gen")
def gen(
    ctx: typer.Context,
    out: Annotated[Optional[Path], typer.Argument(help="Dump file to write (.safetensors).", show_default=False)]
    = None,
    preset: Annotated[str, typer.Option("--preset", "-p", help="Case name from the case table (see --list).")]
    = "basic",
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUT if it exists.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the presets and exit.")] = False,
    B: Annotated[Optional[int], typer.Option("--B", help="Batch size (not for varlen presets).")] = None,
    T: Annotated[Optional[int], typer.Option("--T", help="Sequence length (not for varlen presets).")] = None,
    H: Annotated[Optional[int], typer.Option("--H", help="q/k heads.")] = None,
    HV: Annotated[Optional[int], typer.Option("--HV", help="Value heads (GVA), a multiple of H (default: H, "
                                                          "or the preset's group).")] = None,
    K: Annotated[Optional[int], typer.Option("--K", help="Key head dim.")] = None,
    V: Annotated[Optional[int], typer.Option("--V", help="Value head dim.")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, float64, bfloat16 or float16 (or bf16, fp32, fp16, fp64).")] = None,
):
    """Write a dump (format v1) from a preset of the shared case table.

    --B/--T/--H/--HV/--K/--V/--dtype resize the preset; an existing OUT needs --force.

    Example: kdadbg gen sample.safetensors --preset varlen_short --seed 1
    """
    from .gen import generate, list_presets

    if list_:
        report.render_presets(_out(), list_presets())
        return
    if out is None:
        raise KdadbgError(f"gen: missing argument OUT, the dump file to write, or --list ({ctx.command_path} --help)")
    info = generate(out, preset, seed=seed, force=force, B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype)
    report.render_generated(_out(), info)


@command("inspect")
def inspect_(
    dump: Annotated[Path, typer.Argument(help="Dump (or taps file) to describe.", show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help=f"Print plain JSON (schema {INSPECT_JSON}) instead of "
                                        "tables.")] = False,
    allow_nonfinite: Annotated[bool, typer.Option(
        "--allow-nonfinite", help="Accepted as run, diff and taps take it; inspect describes NaN/Inf either "
                                  "way.")] = False,
):
    """Show a dump's config, tensor statistics and validation verdict, or describe a taps file.

    Per tensor: shape, dtype, min/max/mean over the finite values, NaN and Inf counts.
    Config values are marked as coming from the file or as defaults.
    NaN/Inf values (as capture --when nonfinite writes them) are a finding, not invalidity: each tensor
    holding any is listed with its counts and where its first one is (batch, token, head, chunk); run,
    diff and taps take such a dump with --allow-nonfinite.
    A taps file (kdadbg taps -o, run --save, capture's NAME.theirs.safetensors) is described as one: who
    wrote it, from which dump, its config, the outputs, gradients and taps it holds (chunks, heads) with the
    same statistics, and how to use it (kdadbg diff DUMP --against FILE).
    Exit 0 for a valid dump (NaN/Inf included) or taps file, 2 when it is invalid (what could be read is
    still shown).

    Example: kdadbg inspect sample_inputs/basic.safetensors
    """
    from .dump import describe_dump

    desc = describe_dump(dump)
    if json_:
        report.print_json(_out(), {"schema": INSPECT_JSON, **desc})
    else:
        report.render_inspect(_out(), desc)
    if not desc["ok"]:
        if not json_ and _out().is_terminal and _err().is_terminal:
            raise typer.Exit(KdadbgError.exit_code)   # the verdict line said it on this terminal already
        raise KdadbgError(desc["verdict"])


@command("taps")
@config_options
def taps(
    ctx: typer.Context,
    dump: Annotated[Optional[Path], typer.Argument(help="Dump file to run.", show_default=False)] = None,
    out: Annotated[Optional[Path], typer.Argument(help="Taps file to write (or -o).", show_default=False)] = None,
    out_option: Annotated[Optional[Path], typer.Option("--out", "-o", help="Taps file to write.",
                                                       show_default=False)] = None,
    source: Annotated[str, typer.Option("--source", "--impl", help="What computes the taps: reference (the "
                                        "float64 reference, default), ours (our kernels; 'kernel' works too), "
                                        "PATH.py:FUNCTION or MODULE:FUNCTION (as --impl of run).")]
    = "reference",
    tap_names: Annotated[Optional[str], typer.Option("--taps", help="Comma-separated tap or stage names, all or "
                                                     "none (default all; see --list).")] = None,
    chunks: Annotated[Optional[str], typer.Option("--chunks", help="Global chunk range A:B (half-open, either "
                                                  "side optional) or one chunk A, of the taps.")] = None,
    heads: Annotated[Optional[str], typer.Option("--heads", help="Comma-separated head indices, of the taps.")]
    = None,
    outputs: Annotated[bool, typer.Option("--outputs/--no-outputs", help="Write the outputs and gradients, whole "
                                          "tensors whatever --chunks/--heads select (what diff's output rows and "
                                          "whole-tensor verdicts compare); --no-outputs: the taps alone (diff then "
                                          "lists the outputs as not provided: verdict partial).")] = True,
    device: Annotated[Device, typer.Option("--device", help="Where to compute.")] = Device.auto,
    precision: Annotated[Precision, typer.Option("--precision", help="Kernel dot operands (--source ours): "
                                                 "fp32 (IEEE) or bf16.")] = Precision.fp32,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output if it exists.")] = False,
    allow_nonfinite: Annotated[bool, typer.Option("--allow-nonfinite", help="Accept NaN/Inf inputs.")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the taps of the registry and exit.")] = False,
    json_: Annotated[bool, typer.Option("--json", help=f"Print the summary as JSON (schema {TAPS_JSON}).")] = False,
    max_interpreter_s: MaxInterpreterOption = DEFAULT_MAX_INTERPRETER_S,
    traceback: TracebackOption = False,
    overrides: dict = None,
):
    """Export outputs, gradients and per-chunk taps of a dump to a taps file (safetensors).

    Each tap is stored as \\[chunks, heads, *per-chunk shape] with padding rows 0 (README: taps file layout);
    --taps/--chunks/--heads select the taps, the outputs and gradients are whole tensors (--no-outputs: none).
    --source reference: the float64 chunked reference (float64 taps); --source ours: our Triton
    kernels at --precision (float32 taps); --source PATH.py:FUNCTION: any implementation (--impl).
    Exit 1 when an exported value is NaN or Inf.
    Example: kdadbg taps sample_inputs/basic.safetensors -o basic.taps.safetensors --taps dS,dgc --chunks 0:4
    """
    from .dump import kernel_precheck
    from .export import export_taps
    from .outputs import check_outputs
    from .selection import parse_chunk_range, parse_heads, parse_tap_names

    if list_:
        report.render_tap_list(_out())
        return
    if json_ and out is not None and out.suffix.lower() == ".json":   # `taps D [-o T] --json F.json`, as run takes it
        also = f", which -o {out_option} names too" if out_option is not None else ""
        raise KdadbgError(f"taps: {out} was taken as the taps file OUT{also}: {JSON_FLAG_HINT}")
    if out is not None and out_option is not None:
        raise KdadbgError(f"taps: the file to write given twice, {out} and -o {out_option}: give one")
    label = "--out" if out_option is not None else "OUT"   # an error names the output as it was given
    out = out_option if out_option is not None else out
    if dump is None:
        raise KdadbgError(f"taps: missing argument DUMP, or --list ({ctx.command_path} --help)")
    if out is None:
        raise KdadbgError(f"taps: missing the taps file to write: OUT after DUMP, or -o FILE ({ctx.command_path} "
                          f"--help)")
    if source.strip() == "reference" and _on_command_line(ctx, "precision"):
        raise KdadbgError("--precision: sets the dot operands of an implementation's kernels (--source ours or "
                          "another); --source reference computes in float64")
    check_outputs({label: out}, inputs=[dump], force=force)
    _refuse_lower_bound(dump, overrides)
    names = parse_tap_names(tap_names)
    chunk_range, head_list = parse_chunk_range(chunks), parse_heads(heads)
    if source in ("ours", "kernel", "kernels"):
        _note(kernel_precheck(dump))
    # with --json, stdout is the document: what the implementation prints while it runs goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if json_ else contextlib.nullcontext()
    with report.progress_display(_err()) as progress, quiet:
        info = export_taps(dump, out, source=source, names=names, chunks=chunk_range, heads=head_list,
                           device=device.value, overrides=overrides, force=force,
                           allow_nonfinite=allow_nonfinite, progress=progress, precision=precision.value,
                           max_interpreter_s=max_interpreter_s, outputs=outputs)
    if json_:
        report.print_json(_out(), {"schema": TAPS_JSON, **info})
    else:
        report.render_export(_out(), info)
    if info["nonfinite"] and not info["nonfinite_explained"]:   # exp(-gc) past float32's range: not a failure
        raise typer.Exit(EXIT_NUMERIC)


@command("run")
@config_options
def run(
    ctx: typer.Context,
    dump: Annotated[Path, typer.Argument(help="Dump file to run.", show_default=False)],
    impl: ImplOption = None,
    device: Annotated[Device, typer.Option("--device", help="Where to compute (auto: cuda if present, else the "
                                           "CPU under the Triton interpreter).")] = Device.auto,
    precision: Annotated[Precision, typer.Option("--precision", help="Kernel dot operands: fp32 (IEEE, the "
                                                 "debugging mode) or bf16 (fp32 accumulation, production-like).")]
    = Precision.fp32,
    tol: Annotated[Optional[list[str]], typer.Option("--tol", help="Override one tolerance: NAME=VALUE "
                                                     "(repeatable), e.g. --tol dg=5e-2.")] = None,
    json_file: Annotated[Optional[Path], typer.Option("--json", help=f"Also write the result as JSON (schema "
                                                      f"{RUN_JSON}) to this file.")] = None,
    save: Annotated[Optional[Path], typer.Option("--save", help="Also write the implementation's outputs and "
                                                 "gradients to this file (safetensors: float32, or the 16-bit dtype "
                                                 "one was returned in), a file diff --against takes.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of each tensor's ratio against its "
                                                 "tolerance (needs matplotlib; the name must end in .png).",
                                                 show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --json/--save/--plot files if they exist.")]
    = False,
    allow_nonfinite: Annotated[bool, typer.Option("--allow-nonfinite", help="Accept NaN/Inf inputs.")] = False,
    chunks: Annotated[Optional[str], typer.Option("--chunks", help="Run the implementation only on this global "
                                                  "chunk range A:B of each sequence, seeded with the reference's "
                                                  "S entering and dS leaving it, and compare there.")] = None,
    max_interpreter_s: MaxInterpreterOption = DEFAULT_MAX_INTERPRETER_S,
    traceback: TracebackOption = False,
    overrides: dict = None,
):
    """Run an implementation (--impl, default our kernels) forward + backward and the float64 reference
    on a dump, and compare.

    One row per output and gradient: shape, elements compared, max abs error and where, fla's ratio
    RMS(ref-x)/(RMS(ref)+1e-8 x scale), cosine, NaN/Inf count (elements NaN/Inf on one side only: those NaN/Inf on both sides are left out, of compared too), tolerance, verdict.
    A tensor passes when ratio <= tol or max abs error <= 1e-6 x its scale (the RMS of its
    reference), and has no NaN/Inf; one with no element compared (NaN/Inf on both sides everywhere) is
    "not compared", never a pass.
    Tolerances: fp32 mode 1e-5 for every tensor; bf16 mode fla's (o, ht 5e-3; dq, dk, dv, dh0 8e-3; dg, dbeta 2e-2; ddt_bias 8e-3; dA_log 1e-2).
    Exit 0 (PASS) when every output and gradient was compared and passes, 1 (FAIL) when any fails, 2 on bad input or when no element was compared, 3 (PARTIAL) when nothing failed but an output or gradient was not provided (a forward-only implementation) or not compared: not a full pass.

    Example: kdadbg run sample_inputs/basic.safetensors --precision bf16 --json run.json --plot run.png
    """
    from .dump import extra_tensors_note, kernel_precheck, load_dump
    from .export import resolve_device
    from .impls import resolve_impl
    from .outputs import OutputSet
    from .render import plot as render_plot
    from .run import check

    with OutputSet({"--json": json_file, "--save": save, "--plot": plot}, inputs=[dump], force=force,
                   error_json=RUN_JSON) as outs:
        judged_at, recorded_by = precision.value, None
        if not _on_command_line(ctx, "precision") and impl is not None:   # a taps file: as diff judges it
            judged_at, recorded_by = _recorded_precision([], impl, None) or (judged_at, None)
        implementation = resolve_impl(impl, judged_at)
        if plot is not None:
            render_plot.check_plot(plot)
        _refuse_lower_bound(dump, overrides)
        inputs, config = load_dump(dump, overrides, allow_nonfinite=allow_nonfinite)
        if implementation.kind == "ours":
            kernel_precheck(dump)   # refuses over-wide heads; the float64 note comes with the result's notes
        dev = resolve_device(device.value)
        staged = outs.stage("--save")
        try:
            with report.progress_display(_err()) as progress:
                progress = _starts(outs, progress)
                result = check(inputs, config, impl=implementation, dump=str(dump), device=dev, tol_overrides=tol,
                               progress=progress, save=None if staged is None else str(staged),
                               chunks=_chunk_window(chunks, inputs, config), max_interpreter_s=max_interpreter_s)
        except KdadbgError as e:  # --save could not be written: the result it comes from still shows
            if getattr(e, "result", None) is not None:
                report.render_run(_out(), e.result)
            raise
        extra = extra_tensors_note(dump)
        if extra:
            result.notes.append(extra)
        if recorded_by is not None:
            result.notes.append(f"judged at precision {judged_at}, the one {recorded_by} records (its metadata): "
                                f"--precision chooses another")
        plotted = _write_outputs(outs, result, json_file, plot is not None and (
            lambda path: render_plot.plot_run(path, render_plot.run_plot_data(result))), report.render_run)
    report.render_run(_out(), result)
    if plotted is not None:
        _wrote(plot, "a PNG of each tensor's ratio against its tolerance")
    _wrote(json_file, "the result as JSON")
    _wrote(save, "the implementation's outputs and gradients")
    _replaced_note(outs)
    code = {"pass": 0, "fail": EXIT_NUMERIC, "not_compared": EXIT_BAD_INPUT, "partial": EXIT_PARTIAL}[result.verdict]
    if code:
        raise typer.Exit(code)



def _wrote(path, what: str) -> None:
    """The line that names a file the command wrote (``--json``, ``--save``), as the plot's does."""
    if path is not None and str(path) != "-" and Path(path).exists():
        _out().print(f"wrote {path} ({what})", soft_wrap=True, highlight=False, markup=False)


def _replaced_note(outs) -> None:
    """The note that ``--json`` replaced, without --force, the error document a failed run left there."""
    for label, path in outs.replacing.items():
        _note(f"{label} {path} held the error document of an earlier failed run; replaced by this result "
              f"without --force (a result file still needs --force)")


def _starts(outs, progress):
    """``progress`` that marks ``outs`` started at its first call, when the computation's first stage begins
    (every up-front check done): from then on a failure writes --json's error document (``OutputSet``)."""
    def marking(*args):
        outs.started = True
        progress(*args)
    return marking


def _write_outputs(outs, result, json_file, plot_to, render):
    """``run``/``diff``'s files from ``result``: the plot (``plot_to(staged path)``, or no plot when falsy) and
    the JSON, moved into place together (``OutputSet``). A file that passed the up-front check but cannot
    be written (a full disk) still shows the result (``render``) before its one error line. Returns what
    ``plot_to`` returned."""
    from .fileio import atomic_write_text

    try:
        plotted = plot_to(outs.stage("--plot")) if plot_to else None
        if json_file is not None:
            atomic_write_text(json.dumps(result.as_json(), indent=2), outs.stage("--json"))
        outs.commit()
    except KdadbgError:
        render(_out(), result)
        raise
    return plotted


class GateUnits(str, Enum):
    ln = "ln"
    log2 = "log2"


_THEIRS = "Conventions of a taps file's taps (--against, or B of diff A B)"


def _diffs_a_taps_file(files, impl: str | None, against) -> bool:
    """Whether ``diff`` compares a taps file: ``--against``, two files ``A B``, or ``--impl`` naming a file
    (as ``resolve_impl`` reads it)."""
    from .impls import names_a_taps_file

    return against is not None or len(files) == 2 or names_a_taps_file(impl)


def _refuse_inapplicable_diff(ctx, files, impl, against, chunks, window, repeat, full_run) -> None:
    """Options of ``diff`` that would be ignored: refused, naming the option and why it does not apply."""
    taps_file = _diffs_a_taps_file(files, impl, against)
    if full_run and chunks is None:
        raise KdadbgError("--full-run: applies with --chunks only (without --chunks the whole dump is run anyway)")
    if not taps_file:
        for name, option in (("their_layout", "--taps-state-layout"), ("gate_units", "--taps-gate-units")):
            if _on_command_line(ctx, name):
                raise KdadbgError(f"{option}: describes a taps file's taps (--against TAPS, diff A B, or --impl "
                                  f"TAPS); this diff reads no taps file")
        return
    if repeat > 1:
        raise KdadbgError("--repeat: reruns the implementation; a taps file cannot be rerun")
    if window > 0 and _on_command_line(ctx, "window"):
        raise KdadbgError("--window: reruns the implementation on a window seeded from the reference; a taps "
                          "file cannot be rerun (--window 0 or no --window)")


@command("diff")
@config_options
def diff(
    ctx: typer.Context,
    files: Annotated[list[Path], typer.Argument(help="DUMP, or two taps files A B (A plays the reference).",
                                                show_default=False)],
    impl: ImplOption = None,
    against: Annotated[Optional[Path], typer.Option("--against", help="Diff this taps file (another "
                                                    "implementation's results) against the reference: the "
                                                    "implementation 'a taps file'.", show_default=False)] = None,
    their_layout: Annotated[Layout, typer.Option("--taps-state-layout", help="Layout of the file's S/dS taps: kv "
                                                 "(the registry's [K,V]) or vk ([V,K], transposed first).",
                                                 rich_help_panel=_THEIRS)] = Layout.kv,
    gate_units: Annotated[GateUnits, typer.Option("--taps-gate-units", help="Units of the file's gc/gT/dgc/dgT: "
                                                  "ln or log2 (gc, gT times ln2; dgc, dgT divided by ln2).",
                                                  rich_help_panel=_THEIRS)] = GateUnits.ln,
    device: Annotated[Device, typer.Option("--device", help="Where to compute (auto: cuda if present, else the "
                                           "CPU under the Triton interpreter).")] = Device.auto,
    precision: Annotated[Precision, typer.Option("--precision", help="Kernel dot operands, and the tolerance "
                                                 "table and noise floor to judge by: fp32 or bf16 (not given: "
                                                 "the precision a taps file judged records, else fp32).")]
    = Precision.fp32,
    tap_names: Annotated[Optional[str], typer.Option("--taps", help="Comma-separated tap or stage names, all or "
                                                     "none (default all).")] = None,
    chunks: Annotated[Optional[str], typer.Option("--chunks", help="Global chunk range A:B (half-open, either "
                                                  "side optional) or one chunk A.")] = None,
    heads: Annotated[Optional[str], typer.Option("--heads", help="Comma-separated head indices.")] = None,
    tol: Annotated[Optional[list[str]], typer.Option("--tol", help="Override a tolerance: NAME=VALUE, NAME "
                                                     "a tap, a stage or an output or gradient such as dg (repeatable).")] = None,
    window: Annotated[int, typer.Option("--window", help="Chunks in the made-here-or-carried-in rerun (0: "
                                        "skip it).")] = 3,
    repeat: Annotated[int, typer.Option("--repeat", help="Run the kernels N times and name the first tap x "
                                        "chunk whose bits differ.")] = 1,
    strict: Annotated[bool, typer.Option("--strict", help="DRIFT cells fail too (by default only BUG cells "
                                         "do).")] = False,
    json_file: Annotated[Optional[Path], typer.Option("--json", help=f"Also write the result as JSON (schema "
                                                      f"{DIFF_JSON}) to this file.", show_default=False)] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG heatmap of log10 ratio by tap x "
                                                 "chunk (needs matplotlib; the name must end in .png).",
                                                 show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --json/--plot files if they exist.")] = False,
    allow_nonfinite: Annotated[bool, typer.Option("--allow-nonfinite", help="Accept NaN/Inf inputs.")] = False,
    full_run: Annotated[bool, typer.Option("--full-run", help="With --chunks: run the implementation on the whole "
                                           "dump and compare the chunks selected (by default it runs on the "
                                           "window only, seeded from the reference).")] = False,
    max_interpreter_s: MaxInterpreterOption = DEFAULT_MAX_INTERPRETER_S,
    traceback: TracebackOption = False,
    overrides: dict = None,
):
    """Find the first chunk and stage where an implementation (--impl, default our kernels; --against a
    taps file) leaves the float64 reference.

    Per tap and per output/gradient row x chunk x head: fla's ratio, max abs error and where, cosine and NaN/Inf count, in a grid in dataflow order.
    Cells over tolerance are DRIFT (within 10x the float32 or bf16 reference's own error) or BUG.
    The first divergence is rerun on a window seeded from the reference: introduced there, or inherited.
    A cell with no element compared (NaN/Inf on both sides) is "not compared", never OK.
    Exit 0 when nothing fails, 1 when a cell does (a BUG; a DRIFT only with --strict) or an output or gradient fails as a whole tensor as `kdadbg run` judges it, 2 on bad input or when no cell compared anything, 3 (partial) when nothing failed but an output or gradient was not provided (a forward-only implementation) or none of its elements compared (NaN/Inf on both sides): not a full pass.

    Example: kdadbg diff sample_inputs/basic.safetensors --precision bf16 --json diff.json --plot diff.png
    """
    from .render import difftables as diffreport
    from .diff import diff_paths, write_plot
    from .dump import kernel_precheck
    from .impls import TapsSpec
    from .outputs import OutputSet
    from .render.plot import check_plot
    from .selection import parse_chunk_range, parse_heads, parse_tap_names

    with OutputSet({"--json": json_file, "--plot": plot}, inputs=[*files, against], force=force,
                   error_json=DIFF_JSON) as outs:
        if plot is not None:
            check_plot(plot)
        _refuse_inapplicable_diff(ctx, files, impl, against, chunks, window, repeat, full_run)
        if len(files) == 1:
            _refuse_lower_bound(files[0], overrides)
        names, chunk_range, head_list = parse_tap_names(tap_names), parse_chunk_range(chunks), parse_heads(heads)
        if against is None and impl in (None, "ours", "kernel", "kernels") and len(files) == 1:
            kernel_precheck(files[0])   # refuses over-wide heads; the float64 note comes with the result's notes
        judged_at, recorded_by = precision.value, None
        if not _on_command_line(ctx, "precision"):   # a taps file is judged at the precision it records
            judged_at, recorded_by = _recorded_precision(files, impl, against) or (judged_at, None)
        with report.progress_display(_err()) as progress:
            progress = _starts(outs, progress)
            result = diff_paths(files, impl=impl, against=against, overrides=overrides, device=device.value,
                                precision=judged_at, names=names, chunks=chunk_range, heads=head_list,
                                spec=TapsSpec(their_layout.value, gate_units.value), tol_overrides=tol,
                                window=window, repeat=repeat, drift_fails=strict, allow_nonfinite=allow_nonfinite,
                                full_run=full_run, max_interpreter_s=max_interpreter_s, progress=progress)
        if recorded_by is not None:
            result.notes.append(f"judged at precision {judged_at}, the one {recorded_by} records (its metadata): "
                                f"--precision chooses another")
        plotted = _write_outputs(outs, result, json_file, plot is not None and (
            lambda path: write_plot(result, path)), diffreport.render)
    out = _out()
    diffreport.render(out, result)
    if plotted is not None:
        diffreport.render_plot(out, {**plotted, "path": str(plot)})
    _wrote(json_file, "the result as JSON")
    _replaced_note(outs)
    code = {"pass": 0, "fail": EXIT_NUMERIC, "not_compared": EXIT_BAD_INPUT, "partial": EXIT_PARTIAL}[result.verdict]
    if code:
        raise typer.Exit(code)


def _recorded_precision(files: list, impl: str | None, against) -> tuple[str, str] | None:
    """``(precision, path)`` where the taps file a diff or run judges (``--against``, ``--impl FILE``, or B of
    ``diff A B``, else A) records the precision it was written at (``run --save``, ``taps --source ours``,
    ``capture``), so that a bf16 file is not judged at fp32's tolerances by default; None where none does (or
    the file cannot be read: its own error comes later)."""
    from .fileio import read_header

    if against is not None:
        paths = [against]
    elif len(files) == 2:
        paths = [files[1], files[0]]
    elif impl is not None and ":" not in str(impl) and Path(impl).is_file():   # --impl FILE (a taps file)
        paths = [impl]
    else:
        return None
    for path in paths:
        try:
            own = str(read_header(path)[1].get("precision", "")).strip()
        except (KdadbgError, OSError):
            return None
        if own in ("fp32", "bf16"):
            return own, str(path)
    return None


class When(str, Enum):
    always = "always"
    nonfinite = "nonfinite"


class Steps(str, Enum):
    optimizer = "optimizer"
    manual = "manual"


@command("capture", context_settings={"allow_interspersed_args": False})
def capture_(
    cmd: Annotated[list[str], typer.Argument(metavar="COMMAND", help="The command to run and its arguments, after --.",
                                             show_default=False)],
    out: Annotated[Path, typer.Option("--out", "-o", metavar="DIR", help="Folder for the dumps (created if "
                                      "missing).", show_default=False)],
    when: Annotated[When, typer.Option("--when", help="Write every selected call (always) or only one with a "
                                       "NaN/Inf in an input, output or gradient (nonfinite).")] = When.always,
    calls: Annotated[Optional[str], typer.Option("--calls", help="Comma-separated call indices within a step, "
                                                 "e.g. 0,3.")] = None,
    modules: Annotated[Optional[list[str]], typer.Option("--modules", help="Glob pattern of module names, e.g. "
                                                         "'layers.*.attn' (repeatable).")] = None,
    first: Annotated[Optional[int], typer.Option("--first", help="Write at most N dumps in each process the command "
                                                 "starts (N >= 1).")] = None,
    every: Annotated[int, typer.Option("--every", help="Only steps 0, k, 2k, ...")] = 1,
    target: Annotated[Optional[list[str]], typer.Option("--target", help="What to wrap: fla, kdadbg or "
                                                        "pkg.module:function (repeatable; default fla and "
                                                        "kdadbg).")] = None,
    max_bytes: Annotated[Optional[str], typer.Option("--max-bytes", help="Refuse a call whose host copies would "
                                                     "take the held total over this size (e.g. 2G).")] = None,
    steps: Annotated[Steps, typer.Option("--steps", help="What ends a step: each optimizer.step() (optimizer) or "
                                         "nothing (manual: every call is in step 0).")] = Steps.optimizer,
    force: Annotated[bool, typer.Option("--force", help="Replace dumps of the same name.")] = False,
):
    """Run a training command unchanged, writing a dump of each selected KDA call.

    Every Python process the command starts captures the calls of fla's chunk_kda, our kdadbg_kernels.chunk_kda and each --target (a module-level function with fla's calling convention).
    Per call, after its backward: a v1 dump (the inputs as passed, do, dht) and beside it NAME.theirs.safetensors, the implementation's own outputs and gradients in the taps-file layout.
    Names say step, call, module and rank (s0003-c001-layers.1.attn-r0); the dump's metadata too (kdadbg inspect shows it).
    A step ends at each optimizer.step(); call indices count the target calls of a step from 0.
    Prints one line per dump written, then a summary; it counts the calls made with grad mode off (torch.no_grad, inference_mode), which have no backward to capture.
    Without --target, a command that calls neither default gets a note, not an error: fla's or ours need not be there.
    Exits with the command's exit code when it failed, else 2 when the capture options are bad, a --target was patched in no process (its module cannot be imported, was never imported, or lacks the function) or patched but called in no process, the selection options left none of the KDA calls seen, a dump was not written (its files exist: they are never overwritten without --force), or every call selected was skipped (the format cannot hold it) so that no dump was written, else 0.

    Example: kdadbg capture --out dumps --when nonfinite --modules 'layers.*' -- python train.py --lr 1e-3
    """
    from .capture_run import exit_status, parse_size, run_captured

    if str(out) == "-":   # as every output path (outputs.check_output): no folder named "-"
        raise KdadbgError("--out -: expected a folder for the dumps, found '-' (kdadbg writes no dump to stdout)")
    call_list = None
    if calls is not None:
        try:
            call_list = [int(c) for c in calls.split(",") if c.strip()]
        except ValueError:
            raise KdadbgError(f"--calls: expected comma-separated integers, found {calls!r}") from None
        if not call_list or min(call_list) < 0:
            raise KdadbgError(f"--calls: expected call indices >= 0 within a step (0 is a step's first KDA call), "
                              f"found {calls!r}")
    for option, value in (("--first", first), ("--every", every)):   # by the command line's names (not capture()'s)
        if value is not None and value < 1:
            raise KdadbgError(f"{option}: expected an integer >= 1, found {value}")
    patterns = [p for m in modules or [] for p in m.split(",") if p]
    if not force and out.is_dir():   # said before the training runs, not only after it, when its dumps are refused
        held = [p for p in out.glob("s[0-9]*-c[0-9]*.safetensors") if not p.name.endswith(".theirs.safetensors")]
        if held:
            _note(f"--out {out} already holds {len(held)} dump{'s' if len(held) > 1 else ''} (e.g. {held[0].name}): "
                  f"a call whose dump name is taken will not be written (--force replaces them)")
    result = run_captured(cmd, out, targets=target, calls=call_list, modules=patterns or None, first=first,
                          every=every, when=when.value, max_bytes=parse_size(max_bytes), steps=steps.value,
                          force=force)
    status = exit_status(result)
    report.render_captured(_out(), _err(), result, status)
    raise typer.Exit(status)


def main() -> None:
    try:
        app()
    except KdadbgError as e:
        report.print_error(_err(), str(e))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:   # before a command's own handler (reading the options): one line, no traceback
        report.print_error(_err(), "interrupted (SIGINT) before the command started: nothing was written")
        sys.exit(EXIT_INTERRUPTED)
