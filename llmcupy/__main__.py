"""python -m llmcupy: the project's commands, each with what it does (python -m llmcupy.<command> --help
for its flags).

The descriptions are the first lines of the commands' own docstrings, read without importing them (an
import of train or bench would load CuPy and look for a GPU just to print a list).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# in the order a new user meets them: the catalogue, its timing tools, then training and its files
COMMANDS = ("kernel", "bench", "profile", "launchbench", "nvrtc", "train", "test_gpt2", "startup", "sample",
            "download", "data", "tokenizer", "convert", "torch_gpt2")


def describe(command: str) -> str:
    """The first line of the command module's docstring, without its leading "python -m X: "."""
    source = (Path(__file__).parent / f"{command}.py").read_text(encoding="utf-8")
    first = (ast.get_docstring(ast.parse(source)) or "").strip().splitlines()[:1]
    line = first[0] if first else ""
    prefix = f"python -m llmcupy.{command}:"
    line = line.replace("``", "")   # reStructuredText's literals, for the terminal
    return line[len(prefix):].strip() if line.startswith(prefix) else line


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] not in ("-h", "--help"):
        print(f"error: python -m llmcupy takes no command of its own; run python -m llmcupy.{argv[0]} "
              f"(commands: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    width = max(map(len, COMMANDS))
    print("llmcupy's commands (python -m llmcupy.<command> --help for each one's flags):")
    for command in COMMANDS:
        print(f"  {command:<{width}}  {describe(command)}")
    print("In Python or a notebook: import llmcupy; sorted(llmcupy.ops) names the kernel catalogue's ops and "
          "llmcupy.ops[name] is one (README.md, Python API).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
