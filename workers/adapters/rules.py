"""The alert rules' parameters, read from their one definition: ``deploy/prometheus/render.py``.

That file is a stand-alone script (it renders ``rules.yml`` with nothing but PyYAML), not
a package module, so it is loaded by path from the repository this package is installed
from (``pip install -e .``, as ``make setup`` does).  ``reval backtest`` evaluates the
same thresholds the deployed rules use; the tests load the renderer the same way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

RENDER = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "render.py"


def load_render(path: Path = RENDER) -> ModuleType:
    """The ``render`` module (``Params``, ``DEFAULTS``, ``PROFILES``, ``seconds``...)."""
    name = "reval_deploy_render"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the alert rules' parameters are defined there; run from a checkout of "
            "the repository (pip install -e .)"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def rule_params(profile: str = "default", overrides: list[str] | None = None) -> Any:
    """The rules' ``Params`` of ``profile`` with ``NAME=VALUE`` overrides, checked."""
    render = load_render()
    if profile not in render.PROFILES:
        raise ValueError(f"unknown rules profile {profile!r}; one of {', '.join(render.PROFILES)}")
    params = render.parse_set(render.PROFILES[profile], overrides or [])
    return params.check()
