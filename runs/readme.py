"""The README as a page (the home page's "how a run works" links to it): headings, paragraphs,
lists and code blocks, every piece escaped by the template; no HTML from the file is kept."""

import re
from pathlib import Path

from django.conf import settings
from django.utils.text import slugify

README = Path(settings.BASE_DIR) / "README.md"


def readme_blocks(text: str) -> list[dict]:
    """Markdown, roughly: '#' headings (with an id), fenced code, '-' list items, paragraphs.

    >>> [b["kind"] for b in readme_blocks("# T\\n\\nsome text\\n- a\\n```\\ncode\\n```")]
    ['heading', 'paragraph', 'item', 'code']
    """
    blocks: list[dict] = []
    lines = iter(text.splitlines())
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            blocks.append({"kind": "paragraph", "text": " ".join(paragraph)})
            paragraph.clear()

    for line in lines:
        if line.startswith("```"):
            flush()
            code = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                code.append(inner)
            blocks.append({"kind": "code", "text": "\n".join(code)})
        elif heading := re.match(r"^(#{1,4})\s+(.*)", line):
            flush()
            title = heading.group(2).strip()
            blocks.append(
                {"kind": "heading", "level": len(heading.group(1)), "text": title, "id": slugify(title)}
            )
        elif item := re.match(r"^\s*[-*]\s+(.*)", line):
            flush()
            blocks.append({"kind": "item", "text": item.group(1)})
        elif not line.strip():
            flush()
        else:
            paragraph.append(line.strip())
    flush()
    return blocks


def readme_text() -> str:
    try:
        return README.read_text(encoding="utf-8")
    except OSError:
        return "# README\n\nThe README is not installed with this copy."
