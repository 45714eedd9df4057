"""The registered chat templates: LLaMA-Factory 0.9.5's text templates by name, as frozen values.

The values live in three modules by family (plain-text formats, ChatML copies, vendor formats), and
the multimodal copies of some of them in a fourth; this one joins them into one read-only mapping
and refuses a name registered twice. Behaviour (encoding, tokenizer fixes, Jinja export) lives in
`tuneline.core.templates.conversation`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType

from tuneline.core.templates.chatml import CHATML_TEMPLATES
from tuneline.core.templates.generic import GENERIC_TEMPLATES
from tuneline.core.templates.media_variants import media_variants
from tuneline.core.templates.spec import Template
from tuneline.core.templates.vendor import VENDOR_TEMPLATES

AUTO = "auto"
"""The name that builds a template from the tokenizer's own chat template instead."""

_TEXT = (*GENERIC_TEMPLATES, *CHATML_TEMPLATES, *VENDOR_TEMPLATES)
_ALL = (*_TEXT, *media_variants({t.name: t for t in _TEXT}))
_TWICE = [name for name, count in Counter(t.name for t in _ALL).items() if count > 1]
if _TWICE or AUTO in {t.name for t in _ALL}:
    raise RuntimeError(f"template names registered twice or reserved: {_TWICE or [AUTO]}")

TEMPLATES: Mapping[str, Template] = MappingProxyType({t.name: t for t in sorted(_ALL, key=lambda t: t.name)})
