"""Regenerate ``help_texts.py``: ``python -m pipelines.commandline.write_help_texts``.

``esa --help`` and ``esa COMMAND --help`` print these texts without importing the command's
module (and Beam, seconds of start-up); tests/pipelines/test_startup.py fails when a flag or a
docstring changed and the texts were not regenerated.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.commandline.main import COMMANDS, render_help

TARGET = Path(__file__).with_name("help_texts.py")
HEADER = '''"""What ``esa --help`` and ``esa COMMAND --help`` print (key "" for ``esa --help``), rendered at
100 columns by ``python -m pipelines.commandline.write_help_texts``; do not edit by hand."""

HELP = {
'''


def texts() -> dict[str, str]:
    return {"": render_help(None)} | {command: render_help(command) for command in COMMANDS}


def main() -> None:
    body = "".join(f"    {key!r}: {text!r},\n" for key, text in texts().items())
    TARGET.write_text(HEADER + body + "}\n")
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
