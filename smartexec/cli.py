"""Command line: ``python -m smartexec demo | explain | backends | cache | --version``."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

WORKLOADS = ("sha256", "ast", "grep", "index")


def _demo(args: argparse.Namespace) -> int:
    from . import demo
    from .executor import SmartExecutor
    from .inspection import format_bytes

    root = Path(args.path) if args.path else demo.default_root()
    if not root.is_dir():
        print(f"error: {root} is not a directory; pass a source tree to scan", file=sys.stderr)
        return 2
    files = demo.list_files(root)
    if args.limit:
        files = files[: args.limit]
    py_files = [p for p in files if p.endswith(".py")]
    if not py_files:
        print(f"error: no .py files under {root}", file=sys.stderr)
        return 2
    chosen = WORKLOADS if args.workloads == "all" else tuple(args.workloads.split(","))
    unknown = sorted(set(chosen) - set(WORKLOADS))
    if unknown:
        print(
            f"error: unknown workload(s) {', '.join(unknown)}; pick from {', '.join(WORKLOADS)}",
            file=sys.stderr,
        )
        return 2
    nbytes = demo.warm_page_cache(files)
    print(
        f"smartexec demo on {root}: {len(files)} files ({format_bytes(nbytes)}), "
        f"{len(py_files)} .py files; page cache warmed"
    )
    results = []
    with SmartExecutor(args.workers) as executor:
        if "sha256" in chosen:
            results.append(
                demo.run_workload(executor, "sha256 of every file", demo.sha256_file, files)
            )
            demo.print_result(results[-1])
        if "ast" in chosen:
            results.append(
                demo.run_workload(
                    executor, "ast node count of every .py file", demo.count_ast_nodes, py_files
                )
            )
            demo.print_result(results[-1])
        if "grep" in chosen:
            grep = demo.make_grep(args.pattern)
            results.append(
                demo.run_workload(
                    executor, f"closure keeping .py files matching {args.pattern!r}", grep, py_files
                )
            )
            demo.print_result(results[-1])
        if "index" in chosen:
            start = time.perf_counter()
            index = demo.NgramIndex(py_files)
            print(
                f"\n(built a {format_bytes(index.counts.nbytes)} 4-gram index of the .py files "
                f"in {time.perf_counter() - start:.1f} s)"
            )
            results.append(
                demo.run_workload(
                    executor, "bound method NgramIndex.rarity of the index", index.rarity, py_files
                )
            )
            demo.print_result(results[-1])
    ok = all(r.equal for r in results)
    print(
        "\nall results equal a serial loop"
        if ok
        else "\nMISMATCH: some results differ from a serial loop"
    )
    return 0 if ok else 1


def _explain(args: argparse.Namespace) -> int:
    from .executor import SmartExecutor

    module_name, sep, qualname = args.target.partition(":")
    if not sep or not qualname or not module_name or module_name.startswith("."):
        print(
            f"error: expected MODULE:NAME (e.g. hashlib:sha256), got {args.target!r}",
            file=sys.stderr,
        )
        return 2
    try:
        target: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except Exception as exc:  # the module's own import may raise anything
        what = "" if isinstance(exc, (ImportError, AttributeError)) else f"{type(exc).__name__}: "
        print(f"error: cannot load {args.target}: {what}{exc}", file=sys.stderr)
        return 2
    if not callable(target):
        print(
            f"error: {args.target} is {target!r} ({type(target).__qualname__}), "
            f"not a callable; name a function, class or method, e.g. hashlib:sha256",
            file=sys.stderr,
        )
        return 2
    executor = SmartExecutor()
    try:
        print(executor.explain(target))
    except TypeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        executor.shutdown()
    return 0


def _backends(args: argparse.Namespace) -> int:
    from .registry import available_backends, known_backends

    sources = known_backends()
    for name, status in available_backends().items():
        origin = f"({sources[name]})"
        print(f"{name:10} {status}" + ("" if origin in status else f"  {origin}"))
    return 0


def _cache(args: argparse.Namespace) -> int:
    """Show (or ``--clear``) the profile store; a directory the store refuses is said, not used."""
    from . import _profiles

    directory = _profiles.cache_dir()
    if directory is None:
        switch = os.environ.get(_profiles.CACHE_ENV)
        explicit = os.environ.get(_profiles.CACHE_DIR_ENV)
        if switch is not None and switch.strip().lower() in _profiles._OFF:
            print(f"the profile store is off ({_profiles.CACHE_ENV}={switch})")
        elif not _profiles._SAFE_CALLS:
            print("the profile store is off: this platform cannot open its files safely")
        elif explicit:
            print(
                f"the profile store is off: {_profiles.CACHE_DIR_ENV}={explicit!r} is no usable path"
            )
        else:
            print(f"the profile store is off: no home directory; set {_profiles.CACHE_DIR_ENV}")
        return 0
    refused = _profiles.refusal(directory)
    if refused is not None:
        print(
            f"{directory}: not used ({refused}): profiles are neither loaded nor saved there; "
            f"make it yours and not writable by others (chmod go-w), "
            f"or set {_profiles.CACHE_DIR_ENV} to a directory of your own",
            file=sys.stderr if args.clear else sys.stdout,
        )
        return 1 if args.clear else 0
    if args.clear:
        removed = _profiles.clear()
        print(f"removed {removed} profile{'' if removed == 1 else 's'} from {directory}")
        return 0
    count = _profiles.entry_count()
    print(f"{directory}: {count} profile{'' if count == 1 else 's'} of measured callables")
    return 0


def package_version() -> str:
    """The installed distribution's version, else ``smartexec.__version__`` (a source tree)."""
    from importlib import metadata

    try:
        return metadata.version("smartexec")
    except metadata.PackageNotFoundError:
        from . import __version__

        return __version__


def _positive_int(text: str) -> int:
    value = int(text)  # argparse reports a ValueError as "invalid ... value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more, got {value}")
    return value


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression: {exc}") from None
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    # "smartexec" when run as the console script, "python -m smartexec" otherwise
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    prog = "python -m smartexec" if script in ("", "__main__.py", "-c") else script
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").replace("``", "`"))
    parser.add_argument("--version", action="version", version=f"smartexec {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run the demo workloads on a source tree (the stdlib by default)"
    )
    demo.add_argument("path", nargs="?", help="source tree to scan (default: this Python's stdlib)")
    demo.add_argument(
        "--workers", type=_positive_int, default=None, help="max_workers (default: CPUs)"
    )
    demo.add_argument(
        "--pattern",
        type=_regex,
        default=r"def __\w+__\(self",
        help="regex for the closure workload",
    )
    demo.add_argument(
        "--workloads", default="all", help=f"comma-separated subset of {','.join(WORKLOADS)}"
    )
    demo.add_argument("--limit", type=_count, default=0, help="use only the first N files (0: all)")
    demo.set_defaults(run=_demo)
    explain = sub.add_parser("explain", help="say where a callable would run and why")
    explain.add_argument("target", help="MODULE:NAME, e.g. hashlib:sha256 or json:dumps")
    explain.set_defaults(run=_explain)
    backends = sub.add_parser("backends", help="list backends and whether each is available")
    backends.set_defaults(run=_backends)
    cache = sub.add_parser(
        "cache", help="show where measured profiles are kept across runs, and how many"
    )
    cache.add_argument("--clear", action="store_true", help="remove every saved profile")
    cache.set_defaults(run=_cache)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as Unix tools do,
        # with stdout pointed at nothing so the interpreter's flush at exit is silent.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
