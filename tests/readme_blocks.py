"""The fenced blocks of README.md and of the docs pages its sections moved to, and the shell
commands in them, parsed once for every test that reads them (tests/test_readme.py runs them;
tests/test_docker.py checks the Docker ones)."""
from __future__ import annotations

import re
from dataclasses import dataclass


SKIP_MARKER = re.compile(r"<!--\s*readme-test:\s*skip\s*(?:\((.*)\))?\s*-->")


@dataclass(frozen=True)
class Block:
    language: str
    line: int                 # the page's line of the opening fence
    text: str
    skip_reason: str | None   # "" when marked skip without a reason
    page: str = "README.md"   # the file, as messages name it


@dataclass(frozen=True)
class Command:
    line: int                 # the page's line where the command starts
    text: str                 # as written, continuation lines joined, comment dropped
    comment: str              # the trailing `# ...`, if any
    page: str = "README.md"

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def parse_blocks(markdown: str, page: str = "README.md") -> list[Block]:
    blocks, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{page}:{i + 1}: a fenced block that never closes"
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP_MARKER.search(previous)
        reason = None if marker is None else (marker.group(1) or "").strip()
        blocks.append(Block(opening.group(1).lower(), i + 1, "\n".join(lines[i + 1:end]),
                            reason, page))
        i = end + 1
    return blocks


def split_comment(line: str) -> tuple[str, str]:
    """`cmd args  # note` -> ("cmd args", "note"): a # that starts a word outside quotes."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip(), line[k + 1:].strip()
    return line.rstrip(), ""


def parse_commands(block: Block) -> list[Command]:
    """One Command per line, joining `\\` continuations and the indented `[--flag]` lines of a
    usage synopsis; comment-only lines are dropped (they may continue a previous comment)."""
    commands: list[Command] = []
    pending: tuple[int, str, str] | None = None  # a command still being continued
    for number, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        if pending is None and raw.lstrip().startswith("["):
            assert commands, f"{block.page}:{number}: a synopsis line with no command before it"
            last = commands.pop()
            pending = (last.line, last.text + " " + raw.strip(), last.comment)
            continued = False
        else:
            code, comment = split_comment(raw)
            continued = code.endswith("\\")
            code = code.removesuffix("\\").strip()
            if pending is not None:
                pending = (pending[0], f"{pending[1]} {code}".strip(), pending[2] or comment)
            elif code:
                pending = (number, code, comment)
        if pending is not None and not continued:
            commands.append(Command(pending[0], re.sub(r"\s+", " ", pending[1]), pending[2],
                                    block.page))
            pending = None
    assert pending is None, f"{block.page}:{block.line}: the block ends inside a `\\` continuation"
    return commands
