"""Which templates an installation has: looked up by (operator, target)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Iterable

from measure_agent.device import DeviceInfo
from measure_agent.space import ConfigSpace
from measure_agent.templates.base import Template
from measure_agent.workload import Workload

_SPACE_CACHE_SIZE = 64


class TemplateNotFound(LookupError):
    """No installed template for an (operator, target) pair."""


class TemplateCatalog:
    """An immutable set of templates, one per (op, target)."""

    def __init__(self, name: str, templates: Iterable[Template]) -> None:
        self.name = name
        self._templates: dict[tuple[str, str], Template] = {}
        for template in templates:
            key = (template.op, template.target)
            if key in self._templates:
                raise ValueError(f"two templates for {key}")
            self._templates[key] = template
        self._spaces: OrderedDict[tuple[str, str, str], ConfigSpace] = OrderedDict()
        self._spaces_lock = threading.Lock()

    def get(self, op: str, target: str) -> Template:
        try:
            return self._templates[(op, target)]
        except KeyError:
            have = ", ".join(f"{o}/{t}" for o, t in sorted(self._templates))
            raise TemplateNotFound(f"no template for {op} on target {target}; installed: {have}") from None

    def space(self, workload: Workload, target: str, device: DeviceInfo | None = None) -> ConfigSpace:
        """The template's space for ``workload`` on ``device``, built once and kept (spaces are immutable)."""
        template = self.get(workload.op, target)
        key = (workload.key, target, device.fingerprint if device else "")
        with self._spaces_lock:
            space = self._spaces.get(key)
            if space is not None:
                self._spaces.move_to_end(key)
                return space
        space = template.space(workload, device)
        with self._spaces_lock:
            self._spaces[key] = space
            while len(self._spaces) > _SPACE_CACHE_SIZE:
                self._spaces.popitem(last=False)
        return space

    @property
    def version(self) -> str:
        """Digest of every template's version: agents and daemon must agree on it."""
        text = ";".join(f"{o}/{t}={tpl.version}" for (o, t), tpl in sorted(self._templates.items()))
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def __iter__(self):
        return iter(self._templates.values())


def default_catalog() -> TemplateCatalog:
    """The production templates."""
    from measure_agent.templates.cpu import cpu_templates
    from measure_agent.templates.cuda import cuda_templates

    return TemplateCatalog("default", [*cpu_templates(), *cuda_templates()])


def testing_catalog() -> TemplateCatalog:
    """Fault-injection templates for tests and benchmarks; never the default on an agent."""
    from measure_agent.templates.testing import FaultyMatmulTemplate, SleepTemplate

    return TemplateCatalog("testing", [FaultyMatmulTemplate(), SleepTemplate()])


def load_catalog(name: str) -> TemplateCatalog:
    """The catalog called ``name`` (``default`` or ``testing``)."""
    if name == "default":
        return default_catalog()
    if name == "testing":
        return testing_catalog()
    raise ValueError(f"unknown template catalog {name!r}; expected default or testing")
