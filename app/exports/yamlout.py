"""A small YAML writer for the rules file: block style, every string quoted or a literal
block, so nothing is read back as a number or a boolean.

Enough for the rules document, and no dependency; tests read its output back with PyYAML.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# Characters to escape in a double-quoted scalar that JSON leaves raw: YAML's non-printable
# ones, and those YAML 1.1 readers take for line breaks (NEL, LS, PS) or a byte-order mark.
_NOT_PRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def _quote(text: str) -> str:
    quoted = json.dumps(text, ensure_ascii=False)  # JSON's escapes are YAML's too
    return _NOT_PRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _literal_block_fits(text: str) -> bool:
    """Whether `|-` reproduces the text exactly (its first line sets the indentation)."""
    return (
        "\n" in text
        and not text.startswith((" ", "\n"))
        and not text.endswith("\n")
        and not _NOT_PRINTABLE.search(text)
        and all(ch == "\n" or ch == "\t" or ch >= " " for ch in text)
    )


def _yaml_lines(node: Any, pad: str) -> list[str]:
    if isinstance(node, dict):
        lines = []
        for key, value in node.items():
            head = f"{pad}{key}:"
            if isinstance(value, str) and _literal_block_fits(value):
                lines.append(f"{head} |-")
                lines.extend(f"{pad}  {line}" if line else "" for line in value.split("\n"))
            elif isinstance(value, str):
                lines.append(f"{head} {_quote(value)}")
            elif not value:
                lines.append(f"{head} {'{}' if isinstance(value, dict) else '[]'}")
            else:
                lines.append(head)
                lines.extend(_yaml_lines(value, pad + "  "))
        return lines
    if isinstance(node, list):
        lines = []
        for item in node:
            sub = _yaml_lines(item, pad + "  ")
            sub[0] = f"{pad}- {sub[0][len(pad) + 2 :]}"
            lines.extend(sub)
        return lines
    raise TypeError(f"to_yaml writes mappings, lists and strings, not {type(node).__name__}")


def to_yaml(document: Mapping[str, Any]) -> str:
    """YAML for a document of mappings, lists (of mappings) and strings."""
    return "\n".join(_yaml_lines(dict(document), "")) + "\n"
