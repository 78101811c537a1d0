"""python -m llmcupy: the list of the project's commands (before, Python's "'llmcupy' is a package
and cannot be directly executed")."""

import subprocess
import sys

from llmcupy import __main__ as entry


def test_every_listed_command_is_a_module_with_a_main_and_a_description():
    import importlib

    for command in entry.COMMANDS:
        module = importlib.import_module(f"llmcupy.{command}")
        assert callable(getattr(module, "main", None)), command
        description = entry.describe(command)
        assert description and "python -m" not in description and "``" not in description, (command, description)


def test_every_command_docstring_opens_with_its_own_invocation():
    # one form for the list: "python -m llmcupy.X: what it does", so each line reads the same way
    # (before, six modules opened with a capitalised title and the list mixed the two styles)
    from pathlib import Path

    for command in entry.COMMANDS:
        source = (Path(entry.__file__).parent / f"{command}.py").read_text(encoding="utf-8")
        assert source.startswith(f'"""python -m llmcupy.{command}: '), command


def test_python_m_llmcupy_lists_the_commands():
    proc = subprocess.run([sys.executable, "-m", "llmcupy"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("llmcupy's commands")
    assert any(line.split()[:3] == ["kernel", "run", "any"] for line in lines), proc.stdout
    convert = next(line for line in lines if line.split()[:1] == ["convert"])
    assert convert.split(None, 1)[1].startswith("Hugging Face GPT-2 weights (model.safetensors) to llm.c's model file")


def test_a_command_given_to_the_package_says_which_module_to_run(capsys):
    assert entry.main(["train", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert "run python -m llmcupy.train" in err and "commands: kernel, bench," in err, err


def test_the_readme_names_the_same_commands():
    import re
    from pathlib import Path

    readme = (Path(entry.__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    listed = re.search(r"python -m llmcupy\.\{([^}]*)\}", readme).group(1)
    assert sorted(name.strip() for name in listed.split(",")) == sorted(entry.COMMANDS)
