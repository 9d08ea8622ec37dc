"""Kernel templates installed with the agent."""

from measure_agent.templates.base import KernelSource, Template
from measure_agent.templates.catalog import (
    TemplateCatalog,
    TemplateNotFound,
    default_catalog,
    load_catalog,
    testing_catalog,
)

__all__ = [
    "KernelSource",
    "Template",
    "TemplateCatalog",
    "TemplateNotFound",
    "default_catalog",
    "load_catalog",
    "testing_catalog",
]
