"""What an MCP tool call returned, as the output the model reads.

Text content is the output, in order. An image, audio clip or binary resource
is described in a line (its type and size, never its bytes: a tool's output is
text in the core); a text resource gives its text under its URI; a resource
link gives its URI. With no content but structured content, that is the output,
as JSON. `isError` makes it a tool error the model sees. The output is cut to
RELAY_TOOL_OUTPUT_CHARS like any tool's.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from agent_core import ToolOutput
from agent_core.text import cut

__all__ = ["output_of"]


def output_of(result: Mapping[str, Any], limit: int) -> ToolOutput:
    """The output of a `CallToolResult` (as JSON: `model_dump(by_alias=True)`), cut to `limit`."""
    content = result.get("content")
    parts = (
        [_part(block) for block in content if isinstance(block, dict)]
        if isinstance(content, list)
        else []
    )
    text = "\n".join(p for p in parts if p)
    structured = result.get("structuredContent")
    if not text and structured is not None:
        text = json.dumps(structured, ensure_ascii=False)
    text = cut(text, limit)
    if result.get("isError") is True:
        return ToolOutput.error(text or "the MCP tool reported an error and said nothing more")
    return ToolOutput.ok(text)


def _part(block: Mapping[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {block.get('mimeType', 'unknown type')}, {_size(block.get('data'))}]"
    if kind == "resource":
        return _resource(block.get("resource"))
    if kind == "resource_link":
        name = block.get("name") or block.get("uri", "")
        return f"[resource link {name}: {block.get('uri', '')}]"
    return f"[content of type {str(kind)[:40]!r}, not shown]"


def _resource(resource: object) -> str:
    if not isinstance(resource, dict):
        return "[a resource it did not describe]"
    uri = resource.get("uri", "")
    if "text" in resource:
        return f"[resource {uri}]\n{resource['text']}"
    mime = resource.get("mimeType", "unknown type")
    return f"[resource {uri}: {mime}, {_size(resource.get('blob'))}]"


def _size(data: object) -> str:
    if not isinstance(data, str):
        return "no data"
    try:
        size = len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return "data that is not base64"
    return f"{size:,} bytes"
