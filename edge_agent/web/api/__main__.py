"""``python -m edge_agent.web.api [--json]``: the API's reference as Markdown, or its OpenAPI document."""

import json
import sys

from edge_agent.web.api.openapi import document, reference

sys.stdout.write(json.dumps(document(), indent=2) + "\n" if "--json" in sys.argv[1:] else reference())
