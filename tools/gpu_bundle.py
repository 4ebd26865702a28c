"""Build the carry bundle that runs kvconform on a GPU machine without vLLM installed.

A lent GPU machine has CUDA, torch and a large Python image but no vLLM and no
network. ``make gpu-bundle`` builds, from the environment kvconform is installed
in, what has to travel with the working tree (``.gpu/``, git-ignored):

* ``vllm-tree.tar.gz``: the installed vLLM's ``*.py`` files (no compiled
  extensions) and the dist-info files that let ``importlib.metadata`` answer
  its version;
* ``wheels/``: the wheels of the distributions that kvconform's run imports and
  the machine's image lacks, at the installed versions, for the machine's
  Python (cp312, manylinux x86_64);
* ``MANIFEST.txt``: each wheel, its size and the import that needs it.

Which distributions are needed is derived, not listed: a trace runs the
scenario corpus in this environment (with ``VLLM_TARGET_DEVICE=cpu``, as on the
machine) and notes every third-party module that vLLM or kvconform import
*unguarded* (not inside a ``try`` that catches ``ImportError``); their
distributions, plus everything those declare in ``Requires-Dist``, are the
needs. The machine's image (``tools/gpu-image.txt``, its package inventory) is
subtracted. ``tools/gpu-run.sh`` unpacks the bundle there and installs only the
wheels whose distribution is still missing.

Usage: ``python tools/gpu_bundle.py build [--out .gpu]``; ``missing WHEEL_DIR``
(run on the machine: the wheels it lacks); ``trace FILE PATH...`` (internal).
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = REPO / "tools" / "gpu-image.txt"
# The machine's Python and platforms (docs/gpu.md): cp312, manylinux x86_64.
DEVICE_PYTHON = "3.12"
DEVICE_MARKERS = {
    "python_version": DEVICE_PYTHON,
    "python_full_version": f"{DEVICE_PYTHON}.3",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
BASE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                  "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
EXTRA_PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
                   "manylinux_2_24_x86_64", "manylinux_2_39_x86_64")  # fmt: skip
OWN = frozenset({"vllm", "kvconform"})
SIZE_WARN_MB, SIZE_LIMIT_MB = 40, 60
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- the trace (runs in a child process) ------------------------------------------------


def _swallows_import_errors(handler: ast.ExceptHandler) -> bool:
    """A handler that catches ImportError (or broader) and does not re-raise it."""
    types = handler.type
    if types is None:
        caught = {"BaseException"}
    else:
        elements = types.elts if isinstance(types, ast.Tuple) else [types]
        caught = {
            e.id if isinstance(e, ast.Name) else e.attr
            for e in elements
            if isinstance(e, (ast.Name, ast.Attribute))
        }
    reraises = any(isinstance(statement, ast.Raise) for statement in handler.body)
    return bool(caught & _IMPORT_ERRORS) and not reraises


def guarded_lines(source: str) -> set[int]:
    """Lines inside a ``try`` with a handler that swallows ImportError, or under ``if
    TYPE_CHECKING``: an import there is optional (vLLM runs on without the module)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body: list[ast.stmt] = []
        if isinstance(node, ast.Try):
            if any(_swallows_import_errors(handler) for handler in node.handlers):
                body = node.body
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            body = node.body
        for statement in body:
            end = statement.end_lineno or statement.lineno
            lines.update(range(statement.lineno, end + 1))
    return lines


class _ImportTracer(importlib.abc.MetaPathFinder):
    """Notes the first import of each third-party top-level module and who asked."""

    def __init__(self, own_roots: Sequence[str]) -> None:
        self.own_roots = [str(Path(root).resolve()) for root in own_roots]
        self.seen: set[str] = set()
        self.needed: dict[str, str] = {}  # top-level module -> "file:line" of the import
        self._guards: dict[str, set[int]] = {}

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        top = fullname.partition(".")[0]
        if top in self.seen or top in sys.stdlib_module_names or top in OWN:
            return None
        frame = sys._getframe(1)
        importing = False
        while frame is not None:
            filename = frame.f_code.co_filename
            if not filename.startswith("<") and "importlib" not in filename:
                break
            # importlib.util.find_spec only asks whether a module exists (vLLM probes
            # for optional packages that way); an import goes through _find_and_load.
            importing = importing or frame.f_code.co_name == "_find_and_load"
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None or not importing:
            return None
        self.seen.add(top)
        filename = str(Path(frame.f_code.co_filename).resolve())
        if not any(filename.startswith(root) for root in self.own_roots):
            return None  # a third party's own import: its Requires-Dist covers it
        if frame.f_lineno in self._guarded(filename):
            return None
        self.needed.setdefault(top, f"{filename}:{frame.f_lineno}")
        return None

    def _guarded(self, filename: str) -> set[int]:
        if filename not in self._guards:
            try:
                self._guards[filename] = guarded_lines(Path(filename).read_text())
            except (OSError, SyntaxError, ValueError):
                self._guards[filename] = set()
        return self._guards[filename]


def module_level_imports(source: str) -> dict[str, int]:
    """{top-level module: line} of the unguarded imports a module runs when it is imported
    (module and class bodies; function bodies run later, if ever, and the tracer sees them)."""
    tree = ast.parse(source)
    guarded = guarded_lines(source)
    found: dict[str, int] = {}

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import) and node.lineno not in guarded:
                for alias in node.names:
                    found.setdefault(alias.name.partition(".")[0], node.lineno)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.lineno not in guarded:
                    found.setdefault(node.module.partition(".")[0], node.lineno)
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    visit([c for c in children if isinstance(c, (ast.stmt, ast.ExceptHandler))])

    visit(tree.body)
    return found


def trace(out: Path, paths: Sequence[str]) -> int:
    """Run the corpus with the tracer installed; write {module: importer} to ``out``."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    vllm_root = str(Path(spec.origin).parent) if spec and spec.origin else ""
    tracer = _ImportTracer([vllm_root, str(REPO / "kvconform")])
    # Whatever is imported already (site, this script) came before the tracer.
    tracer.seen.update(name.partition(".")[0] for name in sys.modules)
    sys.meta_path.insert(0, tracer)
    from kvconform.fronts import cli

    with tempfile.TemporaryDirectory() as tmp:
        status = cli.main(["run", *paths, "--report-dir", tmp])
    # The nightly's mutation campaign (tools/nightly.sh) imports the mutation engine as well;
    # without it the bundle ran the corpus and then failed on `kvconform mutate`.
    import kvconform.mutate.mutants  # noqa: F401
    sys.meta_path.remove(tracer)
    # A module some third party imported first never reaches the tracer again: read
    # the unguarded module-level imports of every vLLM and kvconform module that ran.
    needed = dict(tracer.needed)
    for module in list(sys.modules.values()):
        filename = str(Path(getattr(module, "__file__", None) or "-").resolve())
        if not filename.endswith(".py") or not any(
            filename.startswith(root) for root in tracer.own_roots
        ):
            continue
        for top, line in module_level_imports(Path(filename).read_text()).items():
            if top not in sys.stdlib_module_names and top not in OWN and top != "__future__":
                needed.setdefault(top, f"{filename}:{line}")
    out.write_text(json.dumps(needed, indent=1, sort_keys=True))
    return 0 if status in (0, 1) else status


# -- from modules to wheels -------------------------------------------------------------


def distributions_of(modules: Iterable[str]) -> dict[str, str]:
    """{normalized distribution: module} for the installed distributions providing modules."""
    provided = metadata.packages_distributions()
    found: dict[str, str] = {}
    for module in modules:
        for dist in provided.get(module, []):
            found.setdefault(normalize(dist), module)
    return found


def requirement_closure(roots: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{distribution: (installed version, why)} for roots and what they require, as installed."""
    from packaging.requirements import Requirement

    closure: dict[str, tuple[str, str]] = {}
    # Breadth first, roots first: a distribution is listed for the import that needs it
    # when there is one, else for the nearest distribution that requires it.
    queue = deque((name, f"import {why}") for name, why in sorted(roots.items()))
    while queue:
        name, why = queue.popleft()
        key = normalize(name)
        if key in closure or key in OWN:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            print(f"gpu-bundle: {name} ({why}) is not installed here; not carried", file=sys.stderr)
            continue
        closure[key] = (dist.version, why)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(DEVICE_MARKERS):
                continue
            queue.append((requirement.name, f"required by {key}"))
    return closure


def read_image(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalize(re.split(r"[=<>~ ]", line, maxsplit=1)[0]))
    return names


def download_wheel(name: str, version: str, into: Path) -> Path:
    """The cp312 manylinux (or pure-Python) wheel of name==version, cached in ``into``."""
    pattern = re.compile(rf"^{re.escape(normalize(name).replace('-', '_'))}-{re.escape(version)}-",
                         re.IGNORECASE)  # fmt: skip
    for candidate in into.glob("*.whl"):
        if pattern.match(candidate.name):
            return candidate
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
            "--implementation", "cp", "-d", str(into)]  # fmt: skip
    for platforms in (BASE_PLATFORMS, BASE_PLATFORMS + EXTRA_PLATFORMS):
        flags = [flag for p in platforms for flag in ("--platform", p)]
        done = subprocess.run([*base, *flags, f"{name}=={version}"], capture_output=True, text=True)
        if done.returncode == 0:
            for candidate in into.glob("*.whl"):
                if pattern.match(candidate.name):
                    return candidate
    # A distribution published only as an sdist (yattag, which cosmic-ray requires): build
    # its wheel here. Only a pure-Python one is kept; a compiled one would be for this
    # machine's Python, not the device's.
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                            "--no-deps", "--no-binary", name, "-w", str(into), f"{name}=={version}"],
                           capture_output=True, text=True)  # fmt: skip
    for candidate in into.glob("*.whl"):
        if pattern.match(candidate.name) and candidate.name.endswith("-none-any.whl"):
            return candidate
    raise SystemExit(
        f"gpu-bundle: no cp{DEVICE_PYTHON} wheel of {name}=={version}: {done.stderr}{built.stderr}"
    )


def pack_vllm_tree(target: Path) -> str:
    """The installed vLLM's .py files and version metadata, as a tar.gz; returns its version."""
    dist = metadata.distribution("vllm")
    package = Path(str(dist.locate_file("vllm")))
    keep = {"METADATA", "WHEEL", "top_level.txt"}
    info = Path(str(dist._path))  # type: ignore[attr-defined]
    with tarfile.open(target, "w:gz") as archive:
        for source in sorted(package.rglob("*.py")):
            if "__pycache__" not in source.parts:
                archive.add(source, arcname=str(source.relative_to(package.parent)))
        for name in sorted(keep):
            if (info / name).exists():
                archive.add(info / name, arcname=f"{info.name}/{name}")
    return dist.version


def pack_release(version: str, out: Path) -> Path:
    """A PyPI release's Python tree (kvconform's release cache), for a comparison run there.

    The machine has no network, so ``--vllm-release`` cannot download there: the tree
    travels as ``releases/VERSION.tar.gz`` and ``tools/gpu-run.sh`` runs the warmup
    scenarios against it with ``--vllm-src``.

    On the GPU machine vLLM before 0.28 ignores ``VLLM_TARGET_DEVICE``; ``tools/gpu-run.sh``
    selects its platform through vLLM's platform-plugin entry points instead.
    """
    from kvconform.harness.releases import release_tree

    tree = release_tree(version)
    target = out / "releases" / f"{version}.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as archive:
        for source in sorted(tree.rglob("*")):
            relative = source.relative_to(tree)
            if source.is_file() and source.suffix == ".py":
                archive.add(source, arcname=str(relative))
            elif source.is_file() and ".dist-info" in relative.parts[0]:
                archive.add(source, arcname=str(relative))
    print(f"gpu-bundle: releases/{version}.tar.gz  {target.stat().st_size / 1e6:.2f} MB")
    return target


def build(out: Path, image: Path, paths: Sequence[str]) -> int:
    from kvconform.paths import cache_dir

    out.mkdir(parents=True, exist_ok=True)
    wheels_dir = out / "wheels"
    wheels_dir.mkdir(exist_ok=True)
    for stale in wheels_dir.glob("*.whl"):
        stale.unlink()
    traced = out / "imports.json"
    print(f"gpu-bundle: tracing the imports of `kvconform run {' '.join(paths)}` ...", flush=True)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run([sys.executable, __file__, "trace", str(traced), *paths], env=env,
                          cwd=REPO, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
        return 1
    imports: dict[str, str] = json.loads(traced.read_text())
    needed = requirement_closure(distributions_of(imports))
    on_device = read_image(image)
    carried = {name: why for name, why in sorted(needed.items()) if name not in on_device}
    cache = cache_dir("gpu-wheels")
    manifest = [f"# kvconform GPU bundle: {len(carried)} wheels the image lacks ({image.name})"]
    total = 0
    for name, (version, why) in carried.items():
        wheel = download_wheel(name, version, cache)
        (wheels_dir / wheel.name).write_bytes(wheel.read_bytes())
        size = wheel.stat().st_size
        total += size
        manifest.append(f"{wheel.name}  {size / 1e6:.2f} MB  ({why})")
    version = pack_vllm_tree(out / "vllm-tree.tar.gz")
    tree_size = (out / "vllm-tree.tar.gz").stat().st_size
    total += tree_size
    manifest.insert(1, f"vllm-tree.tar.gz  {tree_size / 1e6:.2f} MB  (vLLM {version}, .py only)")
    manifest.append(f"# total {total / 1e6:.1f} MB")
    for module, where in sorted(imports.items()):
        manifest.append(f"# import {module} at {where}")
    (out / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
    print("\n".join(line for line in manifest if not line.startswith("# import")))
    if total > SIZE_LIMIT_MB * 1e6:
        print(f"gpu-bundle: {total / 1e6:.0f} MB is over {SIZE_LIMIT_MB} MB", file=sys.stderr)
        return 1
    if total > SIZE_WARN_MB * 1e6:
        print(f"gpu-bundle: warning: {total / 1e6:.0f} MB is over {SIZE_WARN_MB} MB")
    return 0


# -- on the machine ---------------------------------------------------------------------


def missing(wheels: Path) -> int:
    """Print the wheels whose distribution this Python cannot find (standard library only)."""
    for wheel in sorted(wheels.glob("*.whl")):
        name = wheel.name.split("-", 1)[0]
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            print(wheel)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_bundle", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=REPO / ".gpu")
    b.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    b.add_argument("paths", nargs="*", default=["scenarios"])
    t = sub.add_parser("trace")
    t.add_argument("out", type=Path)
    t.add_argument("paths", nargs="*", default=["scenarios"])
    m = sub.add_parser("missing")
    m.add_argument("wheels", type=Path)
    r = sub.add_parser("release", help="add a PyPI release's Python tree to the bundle")
    r.add_argument("version")
    r.add_argument("--out", type=Path, default=REPO / ".gpu")
    args = parser.parse_args(argv)
    if args.command == "release":
        pack_release(args.version, args.out)
        return 0
    if args.command == "build":
        return build(args.out, args.image, args.paths)
    if args.command == "trace":
        return trace(args.out, args.paths)
    return missing(args.wheels)


if __name__ == "__main__":
    sys.exit(main())
