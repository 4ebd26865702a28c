"""kvconform.peer's environment: the config-only model folders vLLM is redirected to, and the
variables and path of the pytest subprocess."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvconform.peer.environment import FIXED, build_env
from kvconform.peer.models import folder_name, published_configs, redirect_map

NAMED_BY_THE_TESTS = (
    "facebook/opt-125m",
    "Qwen/Qwen3-0.6B",
    "llava-hf/llava-1.5-7b-hf",
    "Qwen/Qwen1.5-7B",
)


def test_the_shipped_configs_cover_the_models_the_tests_name():
    configs = published_configs()
    for model_id in NAMED_BY_THE_TESTS:
        assert configs[model_id]["architectures"], model_id
        assert configs[model_id]["model_type"], model_id
    assert configs["facebook/opt-125m"]["num_hidden_layers"] == 12
    assert configs["facebook/opt-125m"]["max_position_embeddings"] == 2048


def test_the_redirect_map_points_each_id_at_a_config_only_folder(tmp_path: Path):
    configs = {"org/model-a": {"model_type": "opt", "architectures": ["OPTForCausalLM"]}}
    path = redirect_map(tmp_path, configs)
    mapping = json.loads(path.read_text())
    assert mapping == {"org/model-a": str(tmp_path / "org--model-a")}
    folder = Path(mapping["org/model-a"])
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]  # no weights, no tokenizer
    assert json.loads((folder / "config.json").read_text()) == configs["org/model-a"]
    # Rewriting with new values replaces the file; unchanged values leave it alone.
    before = (folder / "config.json").stat().st_mtime_ns
    redirect_map(tmp_path, configs)
    assert (folder / "config.json").stat().st_mtime_ns == before
    redirect_map(tmp_path, {"org/model-a": {"model_type": "llama"}})
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "llama"}


def test_vllm_itself_follows_the_redirect_map(tmp_path: Path, monkeypatch):
    from vllm.transformers_utils.utils import maybe_model_redirect

    path = redirect_map(tmp_path, {"facebook/opt-125m": published_configs()["facebook/opt-125m"]})
    monkeypatch.setenv("VLLM_MODEL_REDIRECT_PATH", str(path))
    assert maybe_model_redirect("facebook/opt-125m") == str(
        tmp_path / folder_name("facebook/opt-125m")
    )
    assert maybe_model_redirect("org/elsewhere") == "org/elsewhere"


def test_the_subprocess_environment(tmp_path: Path):
    tree, deps, redirect = tmp_path / "tree", tmp_path / "deps", tmp_path / "r.json"
    base = {"HOME": "/root", "PYTEST_ADDOPTS": "-x", "COVERAGE_PROCESS_START": "x", "PATH": "/bin"}
    env = build_env(deps=deps, redirect_map=redirect, version="0.33.0", vllm_tree=tree, base=base)
    path = env["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(tree) and path[-1] == str(deps)  # the tree first, the plugins last
    assert len(path) == 3 and (Path(path[1]) / "kvconform" / "peer").is_dir()
    assert [p.name for p in Path(path[1]).iterdir()] == ["kvconform"]  # nothing else of the repo
    assert {k: env[k] for k in FIXED} == FIXED
    # GPUs hidden whatever the caller had: a baseline and a run must see one configuration.
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    hidden = build_env(
        deps=deps,
        redirect_map=redirect,
        version="0.33.0",
        base={**base, "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert hidden["CUDA_VISIBLE_DEVICES"] == ""
    assert env["VLLM_MODEL_REDIRECT_PATH"] == str(redirect)
    assert "PYTEST_ADDOPTS" not in env and "COVERAGE_PROCESS_START" not in env
    assert env["KVCONFORM_PEER_INSTALLED_VLLM"].endswith("vllm")
    plain = build_env(deps=deps, redirect_map=redirect, version="0.33.0", base=base)
    assert plain["PYTHONPATH"].split(os.pathsep)[0] != str(tree)
    assert "KVCONFORM_PEER_INSTALLED_VLLM" not in plain


def test_the_package_imports_only_paths_errors_and_itself():
    """kvconform.peer drives vLLM's tests from outside: no vLLM, torch, triton or coverage in
    kvconform's own process, and nothing of kvconform beyond paths, errors and the one
    definition of vLLM's reservation code (kvconform.model.vllm_code: plain data)."""
    import ast

    package = Path(__file__).resolve().parents[1] / "kvconform" / "peer"
    allowed = ("kvconform.paths", "kvconform.errors", "kvconform.peer", "kvconform.model.vllm_code")
    forbidden = ("vllm", "torch", "triton", "coverage")
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in forbidden, f"{path.name} imports {name}"
                if top == "kvconform":
                    assert name.startswith(allowed), f"{path.name} imports {name}"
