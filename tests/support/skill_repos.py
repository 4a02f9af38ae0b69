"""Skill folders written for the tests, shaped like the public skill repositories.

`write_skill(root, folder, front, body, files)` writes one folder; `write_repo(root)`
writes a small repository the way public ones are laid out: skills under
`skills/` and a category folder, resources beside each SKILL.md (references,
scripts, templates, a binary asset, a licence), a long SKILL.md, community
habits (extra keys, a long description, a name that differs from its folder,
a lowercase `skill.md`), broken files, and the clutter of a real checkout
(`.git`, `.github`, a README at the top).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["LONG_BODY", "REPO_BROKEN", "REPO_SKILLS", "write_repo", "write_skill"]


def write_skill(
    root: Path,
    folder: str,
    front: str,
    body: str = "",
    files: dict[str, str | bytes] | None = None,
    *,
    file_name: str = "SKILL.md",
) -> Path:
    """Write a skill folder under `root`: `---\\n{front}\\n---\\n{body}` and `files`."""
    where = root / folder
    where.mkdir(parents=True, exist_ok=True)
    (where / file_name).write_text(f"---\n{front}\n---\n{body}", encoding="utf-8")
    for name, content in (files or {}).items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return where


PDF_BODY = """\
# PDF Processing Guide

## Overview

This guide covers essential PDF processing operations using Python libraries.
For advanced features, see reference.md. If you need to fill out a PDF form,
read FORMS.md and follow its instructions.

## Quick Start

```python
from pypdf import PdfReader
reader = PdfReader("document.pdf")
```

Run `python scripts/check_fillable_fields.py file.pdf` first.
"""

FORMS = """\
# Filling PDF forms

1. Check whether the PDF has fillable fields:
   `python scripts/check_fillable_fields.py input.pdf`
2. If it does, extract them with `scripts/extract_form_field_info.py`.
"""

MCP_BODY = """\
# MCP Server Development Guide

Load these references as needed:
- [Best practices](./reference/mcp_best_practices.md)
- [Python guide](./reference/python_mcp_server.md)
- [Evaluation guide](./reference/evaluation.md)
"""

# Longer than the 12,000 characters `use_skill` shows with the default history.
LONG_BODY = "# Skill Creator\n\n" + "".join(
    f"## Step {n}\n\nWrite the {n}th part of the skill carefully; check it twice.\n\n"
    for n in range(1, 400)
)

LONG_DESCRIPTION = (
    "Comprehensive document creation, editing, and analysis with support for tracked"
    " changes, comments, formatting preservation, and text extraction. "
) * 8  # about 1,100 characters: over the format's 1,024

REPO_SKILLS = {
    "pdf",
    "docx",
    "mcp-builder",
    "skill-creator",
    "slack-gif-creator",
    "template-skill",
    "changelog",
    "k8s-helper",
}
"""The names `write_repo` makes that load."""

REPO_BROKEN = {
    "skills/broken-yaml": "not valid YAML",
    "skills/no-front-matter": "must start with a '---' line",
    "skills/no-description": "has no 'description'",
    "skills/Bad_Name": "must be 1 to 64 lowercase letters",
    "community/latin1": "is not UTF-8 text",
}
"""Folders `write_repo` makes that do not load, and a word of why."""


def write_repo(root: Path) -> Path:
    """Write a skills repository under `root` and return it."""
    (root / "README.md").write_text("# Skills\n\nA collection of Agent Skills.\n")
    (root / ".git" / "objects").mkdir(parents=True)
    write_skill(root / ".github", "workflows", "name: ci\ndescription: not a skill folder")
    write_skill(
        root / "document-skills",
        "pdf",
        "name: pdf\ndescription: Comprehensive PDF manipulation toolkit for extracting text"
        " and tables, creating new PDFs, merging/splitting documents, and handling forms."
        " When Claude needs to fill in a PDF form or programmatically process PDFs.\n"
        "license: Proprietary. LICENSE.txt has complete terms",
        PDF_BODY,
        {
            "FORMS.md": FORMS,
            "reference.md": "# Advanced reference\n\npypdfium2 renders pages.\n",
            "LICENSE.txt": "Proprietary.\n",
            "scripts/check_fillable_fields.py": "import sys\nprint(sys.argv[1])\n",
            "scripts/extract_form_field_info.py": "def main() -> None:\n    pass\n",
            "scripts/__pycache__/check_fillable_fields.cpython-311.pyc": b"\x00\x01junk",
            ".DS_Store": b"\x00\x00\x00\x01Bud1",
        },
    )
    write_skill(
        root / "document-skills",
        "docx",
        f'name: docx\ndescription: "{LONG_DESCRIPTION.strip()}"\nlicense: Proprietary',
        "# DOCX creation, editing, and analysis\n\nRead ooxml.md before editing XML.\n",
        {"ooxml.md": "# Office Open XML\n", "ooxml/schemas/wml.xsd": "<xsd:schema/>\n"},
    )
    write_skill(
        root / "skills",
        "mcp-builder",
        "name: mcp-builder\ndescription: Guide for creating high-quality MCP servers.\n"
        "license: Complete terms in LICENSE.txt",
        MCP_BODY,
        {
            "reference/mcp_best_practices.md": "# Best practices\n\nName tools clearly.\n",
            "reference/python_mcp_server.md": "# Python\n\nUse FastMCP.\n",
            "reference/evaluation.md": "# Evaluation\n\nWrite ten questions.\n",
            "scripts/requirements.txt": "anthropic>=0.39.0\nmcp>=1.1.0\n",
        },
    )
    write_skill(
        root / "skills",
        "skill-creator",
        "name: skill-creator\ndescription: Guide for creating effective skills.",
        LONG_BODY,
        {"scripts/init_skill.py": "print('init')\n", "scripts/package_skill.py": "print('pkg')\n"},
    )
    write_skill(
        root / "skills",
        "slack-gif-creator",
        "name: slack-gif-creator\ndescription: Create animated GIFs optimized for Slack.\n"
        "allowed-tools:\n  - Bash(python3:*)\n  - Read",
        "# Slack GIF Creator\n\nStart from templates/bounce.py.\n",
        {
            "templates/bounce.py": "def bounce() -> None:\n    pass\n",
            "core/gif_builder.py": "class GIFBuilder:\n    pass\n",
            "assets/example.gif": b"GIF89a\x01\x00\x01\x00\x00\x00\x00;",
        },
    )
    # The template folder of a repository: its name field is the placeholder name.
    write_skill(
        root,
        "template",
        "name: template-skill\ndescription: Replace with description of the skill and when"
        " Claude should use it.",
        "# Insert instructions below\n",
    )
    # Community habits: extra keys, a name that differs from its folder, skill.md.
    write_skill(
        root / "community",
        "changelog-generator",
        "name: changelog\ndescription: Turn git history into a changelog.\nversion: 1.2.0\n"
        "author: someone\ntags: [git, docs]",
        "Run `git log --oneline` and group the commits.\n",
    )
    write_skill(
        root / "community",
        "k8s-helper",
        "name: k8s-helper\ndescription: Kubernetes manifests, checked.",
        "Validate with kubeconform.\n",
        file_name="skill.md",
    )
    # Broken files: real breaches of the format.
    write_skill(root / "skills", "broken-yaml", "name: broken\ndescription: Use this: it breaks")
    (root / "skills" / "no-front-matter").mkdir(parents=True)
    (root / "skills" / "no-front-matter" / "SKILL.md").write_text("# Just Markdown\n\nHello.\n")
    write_skill(root / "skills", "no-description", "name: no-description\nlicense: MIT", "x")
    write_skill(root / "skills", "Bad_Name", "name: Bad_Name\ndescription: Uppercase.", "x")
    latin1 = root / "community" / "latin1"
    latin1.mkdir(parents=True)
    (latin1 / "SKILL.md").write_bytes(
        "---\nname: latin1\ndescription: Café\n---\nbody\n".encode("latin-1")
    )
    return root
