"""Build the carry bundle that runs vLLM's real engine (engine mode) on a lent GPU machine.

Engine mode (docs/engine-mode.md) runs ``vllm.LLM`` itself, so the machine needs vLLM's
compiled build, not the ``.py`` tree ``make gpu-bundle`` carries. The lent H200 has
torch 2.11.0 and no network; vLLM's compiled extensions are built against one torch, and
0.25.0-0.26.0 are the releases that pin 2.11.0 (docs/engine-mode.md). This script
builds, for one such release, what travels (``.gpu-engine/VERSION/``, git-ignored):

* ``vllm-tree.tar.gz``: the release's wheel, unpacked and trimmed of what the H200 run
  never loads -- ``vllm/third_party/deep_gemm`` and ``fmha_sm100`` (Blackwell and DeepGEMM
  kernels), ``vllm/vllm-rs`` (the Rust front end) and FlashAttention 2's library (FA3
  serves the H200). The rest of ``vllm/third_party`` stays: it holds ``pynvml.py``,
  without which vLLM does not see the GPU. The dist-info stays, so that
  ``importlib.metadata`` answers the version;
* ``wheels/``: the wheels of the distributions the release requires (``Requires-Dist``
  without extras, and what those require, markers evaluated for the machine: CPython
  3.12, Linux x86_64) minus what the machine's image has (``tools/gpu-image.txt``) and
  minus the GPU kernel libraries the engine never imports on this path
  (:data:`KERNEL_LIBRARIES`). pip resolves the versions for the machine (a dry run that
  reads metadata only, :func:`resolution`); :func:`resolve` then walks the closure from
  vLLM's own requirements through the resolved metadata, extras included, never past a
  distribution that stays behind, so what only torch needs (CUDA runtime wheels) stays;
* ``MANIFEST.txt``: each wheel, its size and the requirement that needs it, and what
  stays behind and why.

Everything is packed into one tar and split into parts under :data:`PART_LIMIT_MB`
(``parts/part-NN``, ``SHA256SUMS``): a device call carries at most 64 MiB.
``tools/gpu-engine-run.sh`` joins the parts there, unpacks and installs.

Usage: ``python tools/gpu_engine_bundle.py build --vllm 0.25.0 [--out .gpu-engine]``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections import deque
from collections.abc import Iterable, Sequence
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from gpu_bundle import (  # noqa: E402 - the same machine, the same tags
    BASE_PLATFORMS,
    DEFAULT_IMAGE,
    DEVICE_MARKERS,
    DEVICE_PYTHON,
    EXTRA_PLATFORMS,
    read_image,
)

PART_LIMIT_MB = 59
# Paths in the wheel the H200 run never loads (measured there; docs/engine-mode.md).
TRIMMED = (
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/fmha_sm100/",
    "vllm/vllm-rs",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
)
# GPU kernel libraries vLLM requires but imports only on paths engine mode does not take
# (FlashInfer: its sampler is turned off with VLLM_USE_FLASHINFER_SAMPLER=0), and torch's
# own family, which the image has at the version the release pins. Prefix matches.
KERNEL_LIBRARIES = (
    "flashinfer",
    "nvidia-cutlass-dsl",
    "tilelang",
    "quack-kernels",
    "tokenspeed",
    "humming-kernels",
    "pynvvideocodec",
    "nvidia-cudnn-frontend",
    "fastsafetensors",
    "numba",
    "torch",
)


def excluded(name: str, image: set[str]) -> str | None:
    """Why the distribution does not travel, or None when it does."""
    if name in image:
        return "in the machine's image"
    for prefix in KERNEL_LIBRARIES:
        if name.startswith(prefix):
            return "a GPU kernel library engine mode does not load"
    return None


def requirements_of(metadata_text: str, extras: Iterable[str] = ()) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the machine, with the extras asked for."""
    message = Parser().parsestr(metadata_text)
    wanted = [""] + sorted(extras)
    found = []
    for text in message.get_all("Requires-Dist") or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(
            marker.evaluate({**DEVICE_MARKERS, "extra": extra}) for extra in wanted
        ):
            found.append(requirement)
    return found


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return archive.read(name).decode()


def _cached(name: str, specifier: SpecifierSet, into: Path) -> Path | None:
    """The newest wheel of name in the cache that satisfies specifier."""
    best = None
    for candidate in into.glob("*.whl"):
        dist, version, _, _ = parse_wheel_filename(candidate.name)
        if dist == name and specifier.contains(version, prereleases=True):
            if best is None or version > best[0]:
                best = (version, candidate)
    return best[1] if best else None


def download(name: str, specifier: SpecifierSet, into: Path) -> Path:
    """The newest cp312 manylinux (or pure-Python) wheel of name satisfying specifier."""
    cached = _cached(name, specifier, into)
    if cached is not None:
        return cached
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON,
            "--implementation", "cp", "-d", str(into)]  # fmt: skip
    done = None
    for platforms in (BASE_PLATFORMS, BASE_PLATFORMS + EXTRA_PLATFORMS):
        flags = [flag for p in platforms for flag in ("--platform", p)]
        done = subprocess.run([*base, *flags, f"{name}{specifier}"], capture_output=True, text=True)
        if done.returncode == 0:
            found = _cached(name, specifier, into)
            if found is not None:
                return found
    stderr = done.stderr.strip().splitlines()[-1:] if done else []
    raise SystemExit(
        f"gpu-engine-bundle: no cp{DEVICE_PYTHON} wheel of {name}{specifier}: {stderr}"
    )


def resolution(top: list[Requirement], version: str, cache: Path) -> dict[str, dict]:
    """pip's own resolution of ``top`` for the machine: {name: the report's install item}.

    ``pip install --dry-run --report`` for CPython 3.12 on manylinux x86_64 reads the
    metadata of every candidate (and backtracks, e.g. to an xgrammar that accepts the
    apache-tvm-ffi vLLM pins) without installing; the report is cached per release.
    """
    report = cache / f"resolution-vllm-{version}.json"
    if not report.exists():
        requirements = cache / f"requirements-vllm-{version}.txt"
        requirements.write_text("".join(f"{r}\n" for r in top))
        flags = [f for p in BASE_PLATFORMS + EXTRA_PLATFORMS for f in ("--platform", p)]
        with tempfile.TemporaryDirectory() as target:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--dry-run", "--ignore-installed", "--report", str(report), "--target", target,
                 "--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation",
                 "cp", *flags, "-r", str(requirements)],
                capture_output=True, text=True,
            )  # fmt: skip
        if done.returncode != 0:
            report.unlink(missing_ok=True)
            raise SystemExit(f"gpu-engine-bundle: pip could not resolve vLLM {version}'s "
                             f"requirements: {done.stderr.strip()[-600:]}")  # fmt: skip
    items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i for i in items}


def resolve(vllm_wheel: Path, version: str, image: set[str], cache: Path
            ) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:  # fmt: skip
    """{name: (version, why)} to carry, {name: why not} for what stays behind.

    The closure is walked from vLLM's own Requires-Dist through the metadata pip
    resolved, never past a distribution that stays behind: what only torch or a
    kernel library requires (CUDA runtime wheels, sympy) is not carried.
    """
    image_or_kernel: dict[str, str] = {}
    top = []
    for requirement in requirements_of(wheel_metadata(vllm_wheel)):
        reason = excluded(canonicalize_name(requirement.name), image)
        if reason is None:
            requirement.marker = None  # evaluated for the machine already
            top.append(requirement)
        else:
            image_or_kernel[canonicalize_name(requirement.name)] = f"{reason} (required by vllm)"
    resolved = resolution(top, version, cache)
    carried: dict[str, tuple[str, str]] = {}
    # The extras each carried distribution was asked for so far: a later requirement
    # with a new extra (pydantic-extra-types[pycountry] after plain pydantic-extra-types)
    # brings what that extra requires.
    extras_seen: dict[str, set[str]] = {}
    queue: deque[tuple[Requirement, str]] = deque((r, "vllm") for r in top)
    while queue:
        requirement, parent = queue.popleft()
        name = canonicalize_name(requirement.name)
        wanted = set(requirement.extras)
        if name in carried and wanted <= extras_seen[name]:
            continue
        reason = excluded(name, image)
        if reason is not None:
            image_or_kernel.setdefault(name, f"{reason} (required by {parent})")
            continue
        item = resolved[name]
        first = name not in carried
        carried.setdefault(name, (item["metadata"]["version"], f"required by {parent}"))
        new_extras = wanted - extras_seen.get(name, set())
        extras_seen.setdefault(name, set()).update(wanted)
        for text in item["metadata"].get("requires_dist", []):
            sub = Requirement(text)
            marker = sub.marker
            if marker is None:
                if first:
                    queue.append((sub, name))
            elif any(marker.evaluate({**DEVICE_MARKERS, "extra": e})
                     for e in ([""] if first else []) + sorted(new_extras)):  # fmt: skip
                queue.append((sub, name))
    return carried, image_or_kernel


def pack_tree(wheel: Path, target: Path) -> tuple[int, int]:
    """The wheel's files minus TRIMMED as a tar.gz; returns (files kept, bytes trimmed)."""
    kept = trimmed = 0
    with zipfile.ZipFile(wheel) as archive, tarfile.open(target, "w:gz", compresslevel=6) as tar:
        for info in archive.infolist():
            if info.is_dir():
                continue
            if info.filename.startswith(TRIMMED):
                trimmed += info.file_size
                continue
            member = tarfile.TarInfo(info.filename)
            member.size = info.file_size
            member.mode = 0o755 if info.filename.endswith(".so") else 0o644
            tar.addfile(member, io.BytesIO(archive.read(info)))
            kept += 1
    return kept, trimmed


def split(payload: Path, parts_dir: Path, limit: int) -> list[Path]:
    parts_dir.mkdir(parents=True, exist_ok=True)
    for stale in parts_dir.glob("part-*"):
        stale.unlink()
    parts = []
    with payload.open("rb") as source:
        while chunk := source.read(limit):
            part = parts_dir / f"part-{len(parts) + 1:02d}"
            part.write_bytes(chunk)
            parts.append(part)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in parts]
    (parts_dir / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return parts


def build(version: str, out: Path, image_file: Path) -> int:
    sys.path.insert(0, str(REPO))
    from kvconform.paths import cache_dir

    cache = cache_dir("engine-wheels")
    out = out / version
    work = out / "payload"
    (work / "wheels").mkdir(parents=True, exist_ok=True)
    for stale in (work / "wheels").glob("*.whl"):
        stale.unlink()
    vllm_wheel = download("vllm", SpecifierSet(f"=={version}"), cache)
    print(f"gpu-engine-bundle: {vllm_wheel.name} {vllm_wheel.stat().st_size / 1e6:.0f} MB")
    carried, left = resolve(vllm_wheel, version, read_image(image_file), cache)
    manifest = [f"# kvconform engine bundle for vLLM {version}: {len(carried)} wheels "
                f"the image ({image_file.name}) lacks"]  # fmt: skip
    total = 0
    for name, (pinned, why) in sorted(carried.items()):
        wheel = download(name, SpecifierSet(f"=={pinned}"), cache)
        (work / "wheels" / wheel.name).write_bytes(wheel.read_bytes())
        size = wheel.stat().st_size
        total += size
        manifest.append(f"{wheel.name}  {size / 1e6:.2f} MB  ({why})")
    kept, trimmed = pack_tree(vllm_wheel, work / "vllm-tree.tar.gz")
    tree = (work / "vllm-tree.tar.gz").stat().st_size
    manifest.insert(1, f"vllm-tree.tar.gz  {tree / 1e6:.2f} MB  ({kept} files of {vllm_wheel.name}; "
                       f"{trimmed / 1e6:.0f} MB trimmed: {', '.join(TRIMMED)})")  # fmt: skip
    manifest.append(f"# wheels {total / 1e6:.1f} MB, total {(total + tree) / 1e6:.1f} MB")
    for name, reason in sorted(left.items()):
        manifest.append(f"# not carried: {name}: {reason}")
    (work / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
    (work / "VERSION").write_text(version + "\n")
    payload = out / "payload.tar"
    with tarfile.open(payload, "w") as tar:
        tar.add(work, arcname=".")
    parts = split(payload, out / "parts", PART_LIMIT_MB * 1_000_000)
    payload.unlink()
    print("\n".join(line for line in manifest if not line.startswith("# not carried")))
    print(f"gpu-engine-bundle: {len(parts)} parts under {PART_LIMIT_MB} MB in {out / 'parts'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_engine_bundle", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--vllm", required=True, help="the vLLM release, e.g. 0.25.0")
    b.add_argument("--out", type=Path, default=REPO / ".gpu-engine")
    b.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", args.vllm):
        parser.error(f"--vllm must be a release number like 0.25.0, not {args.vllm!r}")
    return build(args.vllm, args.out, args.image)


if __name__ == "__main__":
    sys.exit(main())
