"""The base of the :class:`~kvconform.oracles.vllm.core.Vllm` facade: the loaded vLLM's
modules, the answers remembered per process, the parts that attach to it
(:meth:`VllmBase.part`), the errors it raises, and which release it is.

Each concern of the facade is a class of its own module built on this base
(:mod:`.specs`, :mod:`.managers`, :mod:`.prefix_cache`, :mod:`.predictor`,
:mod:`.methods`); :class:`~kvconform.oracles.vllm.core.Vllm` is all of them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import typing
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from kvconform.errors import NotOffered, VllmUnavailable
from kvconform.oracles.vllm.versions import MINIMUM_SUPPORTED, release_of

if TYPE_CHECKING:
    from kvconform.oracles.vllm.versions import VllmSource

# The environment variable 0.28's coordinator reads the retention interval from.
_RETENTION_VARIABLE = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
_UNSET: Any = object()


@contextlib.contextmanager
def environment_variable(name: str, value: Any) -> Iterator[None]:
    """``name`` set to ``value`` (unset for None) while the block runs; _UNSET: untouched."""
    if value is _UNSET:
        yield
        return
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = str(value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


_Part = TypeVar("_Part")
_Facade = TypeVar("_Facade", bound="VllmBase")


class VllmBase:
    """The loaded vLLM: its modules and remembered answers (the facade's shared state)."""

    def __init__(self, version: str, source: VllmSource, location: str, modules: dict[str, Any]):
        self.version = version
        self.source = source
        self.location = location
        self._kvm = modules["vllm.v1.core.kv_cache_manager"]
        self._iface = modules["vllm.v1.kv_cache_interface"]
        self._request = modules["vllm.v1.request"]
        # Answers that depend only on the loaded vLLM and the arguments (the
        # method tables, the speculative config's properties): every scenario asks
        # them again, and building a SpeculativeConfig each time cost more than
        # a short scenario's allocator calls (docs/benchmarks.md).
        self._memo: dict[tuple[Any, ...], Any] = {}
        # KVCacheConfigs of releases that read the retention interval from the
        # environment (0.28), by id, until their manager is built.
        self._retention_by_config: dict[int, int | None] = {}

    def _remembered(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def part(self: _Facade, factory: Callable[[_Facade], _Part]) -> _Part:
        """The piece of the facade that ``factory`` builds for this vLLM, built once.

        The consumer-specific parts (scheduling, warmup, the slot kernel) live in
        their own modules and attach here, so this class stays the core.
        """
        return typing.cast(_Part, self._remembered(("part", factory), lambda: factory(self)))

    def forget_answers(self) -> None:
        """Drop the remembered answers: a mutation campaign's child changed vLLM's code."""
        self._memo.clear()

    def __repr__(self) -> str:
        return f"<vLLM {self.version} from {self.source.describe()}>"

    def runtime(self) -> tuple[str, str]:
        """(torch version, device) of this process: the device warmup would run on."""
        import torch

        if torch.cuda.is_available():
            return torch.__version__, f"cuda: {torch.cuda.get_device_name(0)}"
        return torch.__version__, "cpu"

    def cuda_initialized(self) -> bool:
        """Whether this process has initialized CUDA (torch refuses CUDA to its forks then).
        ``torch.cuda.is_initialized`` only reads a flag; torch is not imported for it where
        nothing imported it (then nothing initialized CUDA either)."""
        import sys

        torch = sys.modules.get("torch")
        return torch is not None and bool(torch.cuda.is_initialized())

    def missing(self, name: str, detail: str = "") -> VllmUnavailable:
        """An API kvconform needs is absent: this vLLM cannot be exercised here."""
        return VllmUnavailable(self.version, name, detail)

    def not_offered(self, name: str, detail: str = "") -> NotOffered:
        """This release does not offer what a scenario needs: the scenario does not apply."""
        return NotOffered(self.version, name, detail)

    def optional_module(self, name: str) -> Any | None:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    @cached_property
    def _kv_cache_utils(self) -> Any:
        return importlib.import_module("vllm.v1.core.kv_cache_utils")

    def require_release(self, releases: str | None, what: str) -> None:
        """Raise :class:`NotOffered` unless this release is in ``releases`` (a version
        specifier): a scenario that states behaviour some releases introduced."""
        if releases is None:
            return
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion

        try:
            inside = SpecifierSet(releases).contains(release_of(self.version), prereleases=True)
        except InvalidVersion:
            return  # a source tree without a release number: run it
        if not inside:
            # The same words for every scenario written for the same releases, so that
            # the console folds them into one line that names their ids.
            raise NotOffered(
                self.version, f"what {what} states", f"{what} is written for vLLM {releases}"
            )

    def below_minimum(self) -> bool:
        """Older than :data:`MINIMUM_SUPPORTED` (such trees run for bisection only)."""
        from packaging.version import InvalidVersion, Version

        try:
            return Version(release_of(self.version)) < Version(MINIMUM_SUPPORTED)
        except InvalidVersion:
            return False
