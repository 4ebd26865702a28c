"""tools/gpu_bundle.py: which distributions a GPU machine without vLLM needs, derived."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_bundle", REPO / "tools" / "gpu_bundle.py")
assert _spec is not None and _spec.loader is not None
gpu_bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_bundle)

SOURCE = textwrap.dedent(
    """
    import needed_a
    from needed_b.sub import thing
    try:
        import optional_c
    except ImportError:
        optional_c = None
    try:
        import reraised_d
    except ModuleNotFoundError as err:
        raise err from None
    if TYPE_CHECKING:
        import typing_only_e

    class Holder:
        import in_class_f

    def later():
        import in_function_g
    """
)


def test_optional_imports_are_recognised():
    guarded = gpu_bundle.guarded_lines(SOURCE)
    lines = SOURCE.splitlines()
    assert lines.index("    import optional_c") + 1 in guarded
    assert lines.index("    import typing_only_e") + 1 in guarded
    # A handler that re-raises does not make the import optional (vLLM's LazyLoader).
    assert lines.index("    import reraised_d") + 1 not in guarded


def test_module_level_imports_skip_optional_ones_and_function_bodies():
    found = gpu_bundle.module_level_imports(SOURCE)
    assert set(found) == {"needed_a", "needed_b", "reraised_d", "in_class_f"}


def test_the_tracer_records_unguarded_imports_of_own_code_only(tmp_path, monkeypatch):
    site, own = tmp_path / "site", tmp_path / "own"
    (site / "kvc_dep").mkdir(parents=True)
    (site / "kvc_dep" / "__init__.py").write_text("import kvc_transitive\n")
    (site / "kvc_transitive.py").write_text("")
    own.mkdir()
    (own / "kvc_own.py").write_text(
        textwrap.dedent(
            """
            import importlib.util
            importlib.util.find_spec("kvc_probe_only")
            try:
                import kvc_not_installed
            except ImportError:
                pass
            import kvc_dep
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(own))
    tracer = gpu_bundle._ImportTracer([str(own)])
    sys.meta_path.insert(0, tracer)
    try:
        import kvc_own  # noqa: F401
    finally:
        sys.meta_path.remove(tracer)
        for name in ("kvc_own", "kvc_dep", "kvc_transitive"):
            sys.modules.pop(name, None)
    # Not the probe (find_spec), not the guarded import, not kvc_dep's own import.
    assert set(tracer.needed) == {"kvc_dep"}
    assert tracer.needed["kvc_dep"].endswith("kvc_own.py:8")


def test_requirements_are_followed_as_installed():
    closure = gpu_bundle.requirement_closure({"pydantic": "pydantic"})
    assert closure["pydantic"][1] == "import pydantic"
    assert {"pydantic-core", "annotated-types", "typing-inspection"} <= set(closure)
    assert closure["pydantic-core"][1] == "required by pydantic"


def test_the_image_inventory_is_read_by_normalized_name(tmp_path):
    image = tmp_path / "image.txt"
    image.write_text("# comment\nPyYAML==6.0\nhuggingface_hub\n\ntyping.extensions  # x\n")
    assert gpu_bundle.read_image(image) == {"pyyaml", "huggingface-hub", "typing-extensions"}
    shipped = gpu_bundle.read_image(gpu_bundle.DEFAULT_IMAGE)
    assert {"torch", "triton", "transformers", "numpy"} <= shipped


@pytest.mark.parametrize("script", ["tools/gpu-run.sh", "tools/nightly.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)
