"""The names of LLaMA-Factory 0.9.5's registered templates and each one's media plugin, the data of
tests/core/templates/test_unwritten.py (llamafactory_templates.json). Run with LLaMA-Factory's Python:

    /work/lfvenv/bin/python tests/data/make_template_names.py tests/data/llamafactory_templates.json
"""
import json
import sys
from pathlib import Path

from llamafactory.data.template import TEMPLATES

plugins = {name: type(template.mm_plugin).__name__ for name, template in sorted(TEMPLATES.items())}
Path(sys.argv[1]).write_text(json.dumps({"llamafactory_version": "0.9.5", "command": " ".join(sys.argv), "templates": plugins},
                                        indent=1) + "\n")
print(len(plugins), "templates")
