"""tools/gpu_engine_bundle.py: which wheels travel with vLLM's compiled engine, and the parts."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
_spec = importlib.util.spec_from_file_location(
    "gpu_engine_bundle", REPO / "tools" / "gpu_engine_bundle.py"
)
assert _spec is not None and _spec.loader is not None
bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bundle)

VLLM_METADATA = """Metadata-Version: 2.1
Name: vllm
Version: 9.9.9
Requires-Dist: fastapi[standard]
Requires-Dist: mistral_common[image]
Requires-Dist: numpy
Requires-Dist: torch==2.11.0
Requires-Dist: flashinfer-python==0.6.13
Requires-Dist: pywin32; sys_platform == "win32"
Requires-Dist: pytest; extra == "test"
"""


def _item(name: str, version: str, *requires: str) -> dict:
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


RESOLVED = [
    _item("fastapi", "0.136.3", "pydantic-extra-types", 'uvicorn; extra == "standard"'),
    _item("uvicorn", "0.54.0"),
    # Met first without the extra (through fastapi), then with it (through mistral_common).
    _item("pydantic-extra-types", "2.11.1", 'pycountry; extra == "pycountry"'),
    _item("pycountry", "26.2.16"),
    _item("mistral-common", "1.13.1", "pydantic-extra-types[pycountry]", "numpy",
          'opencv-python-headless; extra == "opencv"', 'mistral_common[opencv]; extra == "image"'),
    _item("torch", "2.11.0", "sympy", "nvidia-cublas-cu12"),
    _item("sympy", "1.14.0"),
    _item("nvidia-cublas-cu12", "12.8.4.1"),
    _item("numpy", "2.3.5"),
    _item("opencv-python-headless", "5.0.0.93"),
]  # fmt: skip


def test_the_walk_follows_vllms_requirements_and_extras_asked_for_later(tmp_path):
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-9.9.9.dist-info/METADATA", VLLM_METADATA)
    (tmp_path / "resolution-vllm-9.9.9.json").write_text(json.dumps({"install": RESOLVED}))
    image = {"numpy", "opencv-python-headless"}
    carried, left = bundle.resolve(wheel, "9.9.9", image, tmp_path)
    assert set(carried) == {
        "fastapi",
        "uvicorn",
        "pydantic-extra-types",
        "pycountry",
        "mistral-common",
    }
    assert carried["pycountry"] == ("26.2.16", "required by pydantic-extra-types")
    # What only torch requires never travels; the image's and the kernel libraries stay.
    assert "sympy" not in carried and "nvidia-cublas-cu12" not in carried
    assert left["torch"].startswith("a GPU kernel library")
    assert left["flashinfer-python"].startswith("a GPU kernel library")
    assert left["numpy"].startswith("in the machine's image")
    assert "opencv-python-headless" in left and "pywin32" not in left and "pytest" not in left


def test_parts_stay_under_the_limit_and_join_back(tmp_path):
    payload = tmp_path / "payload.tar"
    data = bytes(range(256)) * 1000
    payload.write_bytes(data)
    parts = bundle.split(payload, tmp_path / "parts", 100_000)
    assert [p.name for p in parts] == ["part-01", "part-02", "part-03"]
    assert all(p.stat().st_size <= 100_000 for p in parts)
    assert b"".join(p.read_bytes() for p in parts) == data
    sums = (tmp_path / "parts" / "SHA256SUMS").read_text().splitlines()
    assert sums[0] == f"{hashlib.sha256(parts[0].read_bytes()).hexdigest()}  part-01"


def test_the_trimmed_tree_keeps_third_party_but_not_the_big_folders(tmp_path):
    wheel = tmp_path / "vllm.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("vllm/__init__.py", "vllm/third_party/pynvml.py",
                     "vllm/third_party/deep_gemm/_C.so", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
                     "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm-9.9.9.dist-info/METADATA"):  # fmt: skip
            archive.writestr(name, "x" * 10)
    import tarfile

    kept, trimmed = bundle.pack_tree(wheel, tmp_path / "tree.tar.gz")
    with tarfile.open(tmp_path / "tree.tar.gz") as tar:
        names = set(tar.getnames())
    assert names == {
        "vllm/__init__.py",
        "vllm/third_party/pynvml.py",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm-9.9.9.dist-info/METADATA",
    }
    assert (kept, trimmed) == (4, 20)
