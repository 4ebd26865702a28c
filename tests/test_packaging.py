"""pyproject.toml as setuptools reads it: no deprecation on install.

A ``license`` table (``{ text = ... }``) makes every ``pip install -e .`` print
setuptools' deprecation of it; PEP 639's SPDX string needs setuptools 77, which the
build requirement must then ask for.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_the_license_is_a_spdx_string_and_the_build_asks_for_a_setuptools_that_reads_it():
    from setuptools.config.pyprojecttoml import load_file

    data = load_file(PYPROJECT)
    license = data["project"]["license"]
    assert isinstance(license, str) and re.fullmatch(r"[A-Za-z0-9.+-]+", license), license
    assert license == "Apache-2.0"  # the same license as before the move to a string
    (setuptools,) = [
        Requirement(r) for r in data["build-system"]["requires"] if r.startswith("setuptools")
    ]
    assert not setuptools.specifier.contains(Version("76.9")), setuptools
    # A license classifier beside a SPDX string is an error for setuptools.
    classifiers = data["project"].get("classifiers", [])
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_setuptools_reads_the_project_table_without_a_deprecation_warning():
    from setuptools import SetuptoolsDeprecationWarning
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error", SetuptoolsDeprecationWarning)
        dist = apply_configuration(Distribution(), PYPROJECT)
    assert dist.metadata.license_expression == "Apache-2.0"
