"""Small JSON records replaced atomically on a local file system (progress and close records)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any


def write_json(path: str, content: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically with ``content`` as JSON (written, then renamed)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(content, handle, sort_keys=True)
    os.replace(temporary, path)
